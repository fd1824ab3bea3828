"""The paged KV pool against the static slot cache on one GPU: an 8B-shaped Llama (random bf16 weights), plain
decoding through the engine (CUDA graphs on both layouts) at batch 1 and 64, the layouts built side by side (the
pool with prefix caching off, and on as by default: fresh prompts each round, so it never hits) and measured
interleaved (`--repeats` rounds, the arms' order rotated each round so none always runs last; median and range of
the decode tokens/s), each arm's host µs per step (stub bodies: median, and mean over whole blocks of steps — the
rows run in lockstep, so every row crosses a block boundary at the same step — plus the prefix cache's own µs per
step); then what the pool buys at long context: an engine for 64 requests of up to 32k tokens
(`max_seq_len=32768`, the pool sized by `kv_cache_memory` as a fraction of free memory), which the static layout
refuses (it would need every slot's whole context), serving 64 concurrent requests — `--long` of them with
~30k-token prompts, the rest ~2k — with the pool's numbers (blocks, tokens it holds, full 32k contexts it holds at
once, peak usage, preemptions). On CUDA, between the two: the decode attention kernel alone, static vs through a
block table (µs per call in a CUDA graph).

    python scripts/bench_paged.py --out $OUT/paged.json                 (≈ 3–5 min on an H200)
    python scripts/bench_paged.py --skip-fit --skip-attention --batch 64 --arms paged paged+prefix --repeats 6 \
        --out $OUT/paged.json                                            (prefix caching's cost alone, ≈ 1–2 min)
    python scripts/bench_paged.py --device cpu --tiny --out /tmp/p.json  (the same code on a tiny shape, CPU)

Prints one JSON line per measurement and writes them all to --out after every row.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine.kv_pool import PagedSlotCache
from specdec.fast.model import FastLlama, LlamaShape
from specdec.request import SamplingParams

LLAMA_8B = LlamaShape(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                      intermediate_size=14336, rope_theta=500000.0, max_positions=131072)
TINY = LlamaShape(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=128,
                  rope_theta=10000.0, max_positions=131072)

ROWS: list = []
OUT_PATH: str | None = None


def emit(row: dict) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    if OUT_PATH is not None:
        with open(OUT_PATH, "w") as f:
            json.dump(ROWS, f, indent=1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def drive(engine: Engine, prompts, params) -> dict:
    """Run the prompts to the end → tokens, wall seconds, decode tokens/s after every request had its first token,
    the outputs, the peak KV usage and preemptions."""
    sync(engine.device)
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    outs = {rid: [] for rid in ids}
    waiting, first_at, first_tokens, tokens, peak = set(ids), None, 0, 0, 0.0
    while engine.has_unfinished():
        for out in engine.step():
            tokens += len(out.new_token_ids)
            outs[out.request_id].extend(out.new_token_ids)
            if out.new_token_ids:
                waiting.discard(out.request_id)
        peak = max(peak, engine.kv_cache_usage_perc)
        if first_at is None and not waiting:
            sync(engine.device)
            first_at, first_tokens = time.perf_counter(), tokens
    sync(engine.device)
    end = time.perf_counter()
    decode = (tokens - first_tokens) / (end - first_at) if first_at and end > first_at else None
    return dict(tokens=tokens, seconds=end - start, decode_tok_s=decode, outs=[outs[r] for r in ids], peak=peak)


ARMS = {"static": dict(kv_layout="static"), "paged": dict(kv_layout="paged", enable_prefix_caching=False),
        "paged+prefix": dict(kv_layout="paged", enable_prefix_caching=True)}  # (the last one is the default)


def ab_rows(target: FastLlama, batches: list[int], new: int, repeats: int, max_seq_len: int,
            arms: list[str] = tuple(ARMS)) -> None:
    """Plain decoding, static vs paged (prefix caching off) vs paged with prefix caching (the default), interleaved
    in one process, the arms' order rotated each round. Every round has prompts of its own, so the prefix cache never
    hits: the "paged+prefix" arm is the cost of indexing blocks when nothing is shared."""
    vocab = target.shape.vocab_size
    arms = list(arms)

    def prompts(round_: int, batch: int) -> list[list[int]]:  # (a text of its own per round, batch and row)
        return [[(1000 + 7 * i + 131 * round_ + 977 * batch + j) % vocab for j in range(128)] for i in range(batch)]

    params = SamplingParams(temperature=0, max_new_tokens=new, seed=0)
    engines = {arm: Engine(target, None, EngineConfig(max_batch_size=max(batches), max_seq_len=max_seq_len,
                                                      **ARMS[arm])) for arm in arms}
    for arm, engine in engines.items():
        emit({"what": "engine", "arm": arm, "cuda_graphs": engine.cuda_graphs, "kv_cache_bytes": engine.kv_cache_bytes})
        for batch in batches:  # warm: kernels picked, graphs captured for these shapes
            drive(engine, prompts(repeats, batch), params)
    measured: dict = {}
    outputs: dict = {}
    for round_ in range(repeats):
        order = arms[round_ % len(arms):] + arms[: round_ % len(arms)]  # (no arm always last)
        for batch in batches:
            for arm in order:
                run = drive(engines[arm], prompts(round_, batch), params)
                measured.setdefault((arm, batch), []).append(run["decode_tok_s"] or 0.0)
                outputs.setdefault((arm, batch), []).append(run["outs"])
    for batch in batches:
        row = {"what": "plain decode tok/s", "batch": batch, "new_tokens": new, "repeats": repeats}
        for arm in engines:
            values = measured[(arm, batch)]
            row[arm] = round(statistics.median(values), 1)
            row[f"{arm}_range"] = [round(min(values), 1), round(max(values), 1)]
        reference = "static" if "static" in engines else arms[0]  # (whose tokens the others must equal)
        for arm in arms:
            if arm == reference:
                continue
            if reference == "static":
                row[f"{arm}_vs_static"] = round(row[arm] / row["static"], 4) if row["static"] else None
            row[f"{arm}_same_tokens"] = outputs[(arm, batch)] == outputs[(reference, batch)]
        if "paged" in engines and "paged+prefix" in engines:  # (prefix caching's cost, nothing shared)
            row["prefix_vs_paged"] = round(row["paged+prefix"] / row["paged"], 4) if row["paged"] else None
        emit(row)
    del engines


def host_rows(target: FastLlama, batches: list[int], max_seq_len: int, steps: int = 64,
              arms: list[str] = tuple(ARMS)) -> None:
    """Each arm's host work per decode step: the step's model bodies replaced by a replay of one real step's output
    (`scripts/host_overhead.py --stub`), so the step time is the engine's bookkeeping, launches and its one device →
    host read — whether a paged step's extra time is the host's or the device's. The median step, and the mean
    (`{arm}_mean`: `steps` a multiple of the block size, the rows in lockstep as in the A/B, so the steps at which
    every row takes a block and enters one in the prefix cache count); for paged+prefix also the µs per step inside
    the prefix cache's own methods (`prefix_cache_us`)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_overhead import stub_step_times, time_prefix_cache

    vocab = target.shape.vocab_size
    params = SamplingParams(temperature=0, max_new_tokens=min(10 * steps, max_seq_len - 128), seed=0)
    for batch in batches:
        row = {"what": "host us per decode step (stub bodies)", "batch": batch, "steps": steps}
        for arm in arms:
            engine = Engine(target, None, EngineConfig(max_batch_size=max(batches), max_seq_len=max_seq_len,
                                                       **ARMS[arm]))
            for i in range(batch):
                engine.add_request([(5 + 3 * i + j) % vocab for j in range(128)], params)
            spent = time_prefix_cache(engine.prefix_cache) if engine.prefix_cache is not None else None
            engine.step()  # (admission and prefill: not a decode step's)
            before = spent[0] if spent else 0.0
            times = stub_step_times(engine, steps, warm=3)
            row[arm] = round(statistics.median(times) * 1e6, 1)
            row[f"{arm}_mean"] = round(statistics.mean(times) * 1e6, 1)
            if spent is not None:  # (its warm steps included: µs per step over warm + measured)
                row["prefix_cache_us"] = round((spent[0] - before) / (steps + 3) * 1e6, 1)
            del engine
        emit(row)


def attention_rows(batches: list[int], spans=(256, 2048), page: int = 16) -> None:
    """The decode attention alone (the Triton split-K kernel, one query per row, 8B heads: 32 query, 8 KV, dim 128,
    bf16), static `[B, H_kv, S, D]` against a pool `[N, page, H_kv, D]` read through a scrambled block table:
    µs per call in a CUDA graph — where a paged step's time goes, if it goes anywhere."""
    from specdec.fast.graphs import graph_time_us
    from specdec.fast.kernels.attention import slot_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch in batches:
        for span in spans:
            q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            keys = torch.randn(batch, 8, span, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            values = torch.randn_like(keys)
            blocks = span // page
            order = torch.randperm(batch * blocks, device="cuda", generator=gen) + 1
            table = order.view(batch, blocks).to(torch.int32)
            pool_k = torch.zeros(batch * blocks + 1, page, 8, 128, device="cuda", dtype=torch.bfloat16)
            pool_v = torch.zeros_like(pool_k)
            pool_k[table.long()] = keys.transpose(1, 2).reshape(batch, blocks, page, 8, 128)
            pool_v[table.long()] = values.transpose(1, 2).reshape(batch, blocks, page, 8, 128)
            positions = torch.full((batch, 1), span - 2, device="cuda", dtype=torch.long)
            static_us = graph_time_us(lambda: slot_attention(q, keys, values, positions, kernel="triton"))
            paged_us = graph_time_us(lambda: slot_attention(q, pool_k, pool_v, positions, kernel="triton",
                                                            block_table=table))
            same = torch.allclose(slot_attention(q, keys, values, positions, kernel="triton").float(),
                                  slot_attention(q, pool_k, pool_v, positions, kernel="triton",
                                                 block_table=table).float(), atol=2e-2)
            emit({"what": "decode attention us", "batch": batch, "span": span, "page": page,
                  "static_us": round(static_us, 2), "paged_us": round(paged_us, 2),
                  "paged_vs_static": round(static_us / paged_us, 4), "same_output": same})


def fit_rows(target: FastLlama, max_batch: int, max_seq_len: int, long: int, long_prompt: int, short_prompt: int,
             new: int, fraction: float) -> None:
    """64 requests at up to 32k context: the static layout refused, the paged pool serving them."""
    try:
        Engine(target, None, EngineConfig(max_batch_size=max_batch, max_seq_len=max_seq_len, kv_layout="static"))
        emit({"what": "static layout", "max_batch_size": max_batch, "max_seq_len": max_seq_len, "refused": False})
    except (ValueError, RuntimeError) as error:  # (refused before allocating: the memory check)
        emit({"what": "static layout", "max_batch_size": max_batch, "max_seq_len": max_seq_len, "refused": True,
              "error": str(error)[:300]})
    engine = Engine(target, None, EngineConfig(max_batch_size=max_batch, max_seq_len=max_seq_len, kv_layout="paged",
                                               kv_cache_memory=fraction))
    usage = engine.kv_cache_usage
    block = engine.config.block_size
    held = usage.num_blocks * block
    per_token = PagedSlotCache.block_bytes(target, block) / block  # K/V bytes a position takes, every layer
    emit({"what": "paged pool", "max_batch_size": max_batch, "max_seq_len": max_seq_len,
          "kv_cache_memory": fraction, "kv_cache_gib": round(engine.kv_cache_bytes / 2**30, 2),
          "blocks": usage.num_blocks, "block_size": block, "tokens_held": held,
          "full_contexts_at_once": held // max_seq_len,
          "static_would_need_gib": round(max_batch * engine.num_positions * per_token / 2**30, 1)})
    vocab = target.shape.vocab_size
    lengths = [short_prompt] * (max_batch - long) + [long_prompt] * long
    prompts = [[(3 + 11 * i + 5 * j) % vocab for j in range(n)] for i, n in enumerate(lengths)]
    budgets = [8 * new] * (max_batch - long) + [new] * long  # the short ones still run when the long ones join
    sync(engine.device)
    start = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, seed=0))
           for p, n in zip(prompts[: max_batch - long], budgets)]
    outs, running, peak, step = {}, 0, 0.0, 0
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
        step += 1
        if step == 1:  # the short ones admitted together (one prefill group), then the long ones join them
            ids += [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=new, seed=0))
                    for p in prompts[max_batch - long:]]
        running, peak = max(running, engine.num_running), max(peak, engine.kv_cache_usage_perc)
    sync(engine.device)
    engine.kv_pool.check()
    emit({"what": "concurrent requests at long context", "requests": len(prompts), "long_prompts": long,
          "long_prompt_tokens": long_prompt, "short_prompt_tokens": short_prompt, "new_tokens": {"short": 8 * new, "long": new},
          "context_tokens": sum(lengths) + sum(budgets), "peak_running": running,
          "all_finished": all(len(outs.get(r, [])) == n for r, n in zip(ids, budgets)),
          "seconds": round(time.perf_counter() - start, 2), "peak_kv_cache_usage": round(peak, 4),
          "preemptions": engine.kv_cache_usage.num_preemptions,
          "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if engine.device.type == "cuda" else None})


def main() -> None:
    global OUT_PATH
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny random shape (the script's own check, CPU)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--new", type=int, default=128, help="tokens per request in the A/B")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ab-seq-len", type=int, default=2048, help="max_seq_len of the A/B engines")
    parser.add_argument("--fit-seq-len", type=int, default=32768)
    parser.add_argument("--fit-batch", type=int, default=64)
    parser.add_argument("--long", type=int, default=4, help="requests with a ~30k prompt among the 64")
    parser.add_argument("--long-prompt", type=int, default=30000)
    parser.add_argument("--short-prompt", type=int, default=2000)
    parser.add_argument("--fit-new", type=int, default=32)
    parser.add_argument("--fraction", type=float, default=0.7, help="kv_cache_memory of the long-context engine")
    parser.add_argument("--skip-fit", action="store_true")
    parser.add_argument("--skip-attention", action="store_true", help="no decode-attention rows (CUDA)")
    parser.add_argument("--skip-host", action="store_true", help="no host-µs rows")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                        help="which layouts the A/B and host rows build (default: all three)")
    parser.add_argument("--host-steps", type=int, default=64, help="stub steps per host row (a multiple of 16)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    OUT_PATH = args.out
    dtype = torch.float32 if args.tiny else torch.bfloat16
    target = FastLlama.random(TINY if args.tiny else LLAMA_8B, device=args.device, dtype=dtype)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    emit({"what": "setup", "device": name, "torch": torch.__version__, "shape": "tiny" if args.tiny else "8B"})
    ab_rows(target, args.batch, args.new, args.repeats, args.ab_seq_len, args.arms)
    if not args.skip_host:
        host_rows(target, args.batch, args.ab_seq_len, args.host_steps, args.arms)
    if args.device == "cuda" and not args.skip_attention:
        try:  # (a diagnosis: a failure here leaves the other rows standing)
            attention_rows(args.batch)
        except Exception as error:  # noqa: BLE001
            emit({"what": "decode attention us", "error": repr(error)[:300]})
    if not args.skip_fit:
        gc.collect()  # (the A/B engines' graphs and caches)
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        fit_rows(target, args.fit_batch, args.fit_seq_len, args.long, args.long_prompt, args.short_prompt,
                 args.fit_new, args.fraction)


if __name__ == "__main__":
    main()
