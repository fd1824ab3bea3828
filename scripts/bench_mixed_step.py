"""The mixed prefill/decode step (`EngineConfig.mixed_step`, the engine's chunked prefill) under traffic with arrivals,
against admission's whole prefill (the default), plain and speculative, in one run: ITL p99, TTFT and throughput
per arm, and the mixed batch's host build against `RaggedBatch.from_rows`.

    PYTHONPATH=$PWD python scripts/bench_mixed_step.py --shape tiny --requests 12 --slots 4 \\
        --prompt 16 96 --new 16 --out /tmp/mixed.json                        # CPU smoke (fp32)
    python scripts/bench_mixed_step.py --device cuda --shape llama-8b --out "$OUT/mixed_step.json"   # one GPU, bf16

The target has random weights (`FastLlama.random`); the speculative arms draft with a random 2-layer model of the
same vocabulary at γ = --gamma, accepted at a fixed --alpha (`EngineConfig.synthetic_acceptance`, BENCHMARK ONLY:
the output is not the target's law; a step's cost and its commits are what they would be at that α). Traffic: a
closed loop of --clients streams (a client sends its next request when its last finishes) over --requests
requests, prompt lengths uniform in --prompt, new tokens uniform in [--new / 2, 1.5 · --new], the same seeded requests for every arm; or
`--poisson RATE` arrivals per second. Each arm runs a warm pass (a quarter of the requests: graph captures, Triton
builds; with --warmup first `warmup.warm_steps` over every batch bucket, which builds every mixed step shape too) then
the timed pass. Arm "mixed_eager" is "mixed" with the mixed steps' graphs off (`Runner.mixed_graphs`): graphs on/off
in the same run. ITL: the wall gap between two outputs of a request that carry tokens (a speculative
step's tokens arrive together); TTFT: first tokens − arrival; throughput: generated tokens / the pass's wall time.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections import deque

import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine.warmup import warm_steps
from specdec.fast import FastLlama, LlamaShape
from specdec.request import SamplingParams

SHAPES = {
    "llama-8b": dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     intermediate_size=14336, rope_theta=500000.0),
    "tiny": dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=128),
}
ARMS = ("whole", "mixed", "mixed_eager")  # admission's whole prefill | mixed_step=True (its verify halves CUDA
# graphs where decode steps are) | the same with the mixed steps eager


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def traffic(args, vocab: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(args.seed)
    lo, hi = args.prompt
    # (no EOS: a request runs its max_new_tokens, drawn around --new so that a closed loop's requests do not finish
    # together — requests finishing together leave nothing running, and admission then prefills whole)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))],
             SamplingParams(temperature=0, max_new_tokens=rng.randint(max(args.new // 2, 1), args.new * 3 // 2)))
            for _ in range(args.requests)]


def drive(engine: Engine, requests, clients: int, poisson: float | None, seed: int) -> dict:
    """Run `requests` through `engine` (closed loop of `clients`, or Poisson arrivals) → the pass's numbers."""
    pending = deque(requests)
    rng = random.Random(seed)
    arrival, last, itl, ttft, generated = {}, {}, [], [], 0
    steps, mixed_before = 0, engine.runner.num_mixed_steps
    start = time.perf_counter()
    next_at = start

    def send():
        prompt, params = pending.popleft()
        rid = engine.add_request(prompt, params)
        arrival[rid] = time.perf_counter()

    if poisson is None:
        for _ in range(min(clients, len(pending))):
            send()
    while pending or engine.has_unfinished():
        now = time.perf_counter()
        while poisson is not None and pending and next_at <= now:
            send()
            next_at += rng.expovariate(poisson)
        if not engine.has_unfinished():
            if poisson is not None and pending:
                time.sleep(max(next_at - time.perf_counter(), 0.0))
            continue
        outputs = engine.step()
        steps += 1
        now = time.perf_counter()
        for out in outputs:
            if out.new_token_ids:
                generated += len(out.new_token_ids)
                if out.request_id in last:
                    itl.append(now - last[out.request_id])
                else:
                    ttft.append(now - arrival[out.request_id])
                last[out.request_id] = now
            if out.finished:
                last.pop(out.request_id, None)
                if poisson is None and pending:
                    send()
    wall = time.perf_counter() - start
    return {"wall_s": wall, "steps": steps, "generated": generated, "throughput_tok_s": generated / wall,
            "itl_p50_ms": 1e3 * (_pct(itl, 0.5) or 0), "itl_p99_ms": 1e3 * (_pct(itl, 0.99) or 0),
            "itl_max_ms": 1e3 * max(itl, default=0), "ttft_p50_ms": 1e3 * (_pct(ttft, 0.5) or 0),
            "ttft_p99_ms": 1e3 * (_pct(ttft, 0.99) or 0), "prefill_budget": engine.step_prefill_budget,
            "mixed_steps": engine.runner.num_mixed_steps - mixed_before, "preemptions": engine.kv_cache_usage.num_preemptions}


def host_build(target, args) -> dict:
    """The host's cost of a mixed step's batch (64 verify rows + one 512-token chunk by default): the bounded path
    (`mixed_shapes.host_meta`: O(rows + tiles) host ints, one copy, the rest `mixed_step.mixed_batch` on the device)
    against `RaggedBatch.from_rows` (per token on the host), median ms."""
    from specdec.engine.mixed_shapes import MixedLayout, host_meta
    from specdec.engine.mixed_step import mixed_batch
    from specdec.engine.step_input import PrefillChunks
    from specdec.fast.ragged import RaggedBatch, RaggedRow

    device, rows, k, chunk, context, block = target.device, args.host_rows, 1 + args.gamma, 512, 1024, 16
    per_row = -(-(context + k + 1) // block)
    table = torch.zeros(rows + 1, max(per_row, -(-(chunk + 1) // block)), dtype=torch.int32)
    for r in range(rows + 1):
        n = per_row if r < rows else -(-(chunk + 1) // block)
        table[r, :n] = torch.arange(1 + r * per_row, 1 + r * per_row + n)
    tokens = torch.randint(3, 200, (rows + 1, context + chunk), device=device)
    verify = torch.randint(3, 200, (rows, k), device=device)
    lengths = torch.full((rows,), context, device=device)
    chunks = PrefillChunks((rows,), (0,), (chunk,), (context,) * rows)
    s = target.shape
    layout = MixedLayout(rows, k, chunk, rows + 1, s.n_heads // s.n_kv_heads, 128, s.head_dim, False)
    verify_tiles = torch.tensor(layout.verify_tiles(32), dtype=torch.int32, device=device).view(-1, 2)
    meta_device = torch.zeros(layout.meta_size, dtype=torch.long, device=device)
    device_table = table.to(device)
    ours, theirs = [], []
    for _ in range(args.host_repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        meta, counts, starts = host_meta(layout, chunks, rows)
        meta_device.copy_(torch.tensor(meta), non_blocking=True)
        mixed_batch(meta_device, verify, lengths, device_table, block, tokens, layout, verify_tiles,
                    row_counts=counts, row_starts=starts, num_blocks=int(table.max()) + 1)
        ours.append(time.perf_counter() - t)
        host_rows = [RaggedRow(verify[r].tolist(), context - 1, table[r].tolist()[:per_row], k) for r in range(rows)]
        host_rows.append(RaggedRow(tokens[rows, :chunk].tolist(), 0, table[rows].tolist(), 0))
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        RaggedBatch.from_rows(host_rows, block_size=block, device=device)
        theirs.append(time.perf_counter() - t)
    return {"what": "host build ms", "rows": rows, "chunk": chunk, "mixed_batch_ms": 1e3 * statistics.median(ours),
            "from_rows_ms": 1e3 * statistics.median(theirs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--modes", nargs="+", choices=("plain", "spec"), default=["plain", "spec"])
    p.add_argument("--slots", type=int, default=32, help="max_batch_size")
    p.add_argument("--clients", type=int, default=None, help="closed-loop streams (default: --slots)")
    p.add_argument("--poisson", type=float, default=None, help="arrivals per second instead of a closed loop")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--prompt", type=int, nargs=2, default=[256, 1536], metavar=("MIN", "MAX"))
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--alpha", type=float, default=0.7, help="synthetic acceptance of the speculative arms")
    p.add_argument("--budget", default="auto", help="prefill_budget of the mixed arms (auto or tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", action="store_true", help="warm_steps over every batch bucket before each arm")
    p.add_argument("--host-rows", type=int, default=64)
    p.add_argument("--host-repeats", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    shape = LlamaShape(**SHAPES[args.shape])
    target = FastLlama.random(shape, device=device, dtype=dtype)
    draft = FastLlama.random(LlamaShape(**{**SHAPES[args.shape], "n_layers": 2}), device=device, dtype=dtype, seed=1)
    rows = [{"what": "setup", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
             "shape": args.shape, "torch": torch.__version__, "args": vars(args)}]

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)

    emit(rows.pop())
    emit(host_build(target, args))
    requests = traffic(args, shape.vocab_size)
    budget = args.budget if args.budget == "auto" else int(args.budget)
    seq_len = args.prompt[1] + args.new + 2 * args.gamma + 8
    for mode in args.modes:
        for arm in args.arms:
            spec = mode == "spec"
            config = EngineConfig(max_batch_size=args.slots, max_seq_len=seq_len, admit_min=1,
                                  num_draft_tokens=args.gamma if spec else 0, max_draft_tokens=max(args.gamma, 1),
                                  synthetic_acceptance=args.alpha if spec else None,
                                  prefill_budget=budget if arm != "whole" else None,
                                  mixed_step=arm.startswith("mixed"))
            engine = Engine(target, draft if spec else None, config)
            engine.runner.mixed_graphs = arm != "mixed_eager"
            warmup_s = None
            if args.warmup:
                t = time.perf_counter()
                warm_steps(engine.runner, sorted({0, *engine.policy.candidates}), range(1, args.slots + 1), seq_len)
                engine.policy.only_ready = True  # (as Engine.warmup; its prefill graphs are not this benchmark's)
                warmup_s = time.perf_counter() - t
            warm = max(len(requests) // 4, 1)
            drive(engine, requests[:warm], args.clients or args.slots, args.poisson, args.seed)
            row = drive(engine, requests, args.clients or args.slots, args.poisson, args.seed)
            captured = sum(1 for m in engine.runner.mixed_steps.values() if m.captured)
            emit({"what": "traffic", "mode": mode, "arm": arm, "warmup_s": warmup_s,
                  "mixed_shapes": len(engine.runner.mixed_steps), "mixed_captured": captured, **row})
            del engine
            gc.collect()  # (its graphs and pool, before the next arm's)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    by = {(r["mode"], r["arm"]): r for r in rows if r.get("what") == "traffic"}
    for mode in args.modes:
        base = by.get((mode, "whole"))
        for arm in args.arms:
            r = by.get((mode, arm))
            if base and r:
                emit({"what": "ratio", "mode": mode, "arm": arm,
                      "throughput_vs_whole": r["throughput_tok_s"] / base["throughput_tok_s"],
                      "itl_p99_vs_whole": r["itl_p99_ms"] / base["itl_p99_ms"] if base["itl_p99_ms"] else None})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
