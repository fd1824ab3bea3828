"""The bitwise-exact mode's cost on the GPU (issue 26, item 1): an 8B-shaped Llama (random bf16 weights), plain
decoding and speculative decoding (γ = 4, a small random drafter, each draft accepted with probability 0.8) at
batch 1 and 64, default kernels vs `EngineConfig(bitwise=True)` with the GEMM's M-range tiles (where the device probe
allows them) and, at the largest batch, with the fixed tiles — in the same process; whether the greedy tokens of the
batch-1 and batch-64 runs agree in each mode, and whether the M-range and fixed tiles give the same tokens. Then the
device probe's verdict per base tile, and the invariant GEMM against cuBLAS on the 8B matrices at M = 1, 64, 320
(CUDA-graph timing): the fixed config (`_invariant_config.fixed_config`), the M-range one (`config_for(n, k, m)`),
other tiles of the same summation order (each with whether its output bits equal the fixed config's) and other
orders (timing only); and the invariant attention against the default split-K kernel.

    python scripts/bench_bitwise.py --out $OUT/bitwise.json          (≈ 3 min on an H100)
    python scripts/bench_bitwise.py --pair specdec/assets/demo_pair --device cpu --batch 1 8 --new 32 --skip-gemm
                                                                     (the CPU numbers: the demo pair in fp32)

Prints one JSON line per measurement and writes them all to --out (after every row: a run cut short keeps them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from specdec.engine import Engine, EngineConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.request import SamplingParams

LLAMA_8B = LlamaShape(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                      intermediate_size=14336, rope_theta=500000.0, max_positions=8192)
DRAFT = LlamaShape(vocab_size=128256, dim=1024, n_layers=2, n_heads=8, n_kv_heads=8, head_dim=128,
                   intermediate_size=2816, rope_theta=500000.0, max_positions=8192)


OUT_PATH: str | None = None  # rewritten after every row, so a run cut short by a timeout keeps what it measured


def emit(rows: list, row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)
    if OUT_PATH is not None:
        with open(OUT_PATH, "w") as f:
            json.dump(rows, f, indent=1)


BUDGET_S: float | None = None  # seconds from START after which the remaining sections are skipped
START = time.perf_counter()


def over_budget(rows: list, section: str) -> bool:
    if BUDGET_S is None or time.perf_counter() - START < BUDGET_S:
        return False
    emit(rows, {"what": "skipped (over --budget-s)", "section": section})
    return True


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def drive(engine: Engine, prompts, params) -> tuple[float, int, list]:
    """(wall seconds, tokens, tokens per prompt); the process's CPU seconds land in `drive.cpu_s` (the steadier
    figure on a shared CPU machine); the seconds until every request had its first token (the prefills, mostly) in
    `drive.first_s`, and the tokens per second after that in `drive.decode_tok_s`."""
    sync(engine.device)
    start, cpu = time.perf_counter(), time.process_time()
    ids = [engine.add_request(p, params) for p in prompts]
    tokens, by_id = 0, {rid: [] for rid in ids}
    first_at, first_tokens, waiting = None, 0, set(ids)
    while engine.has_unfinished():
        for out in engine.step():
            tokens += len(out.new_token_ids)
            by_id[out.request_id].extend(out.new_token_ids)
            if out.new_token_ids:
                waiting.discard(out.request_id)
        if first_at is None and not waiting:
            sync(engine.device)
            first_at, first_tokens = time.perf_counter(), tokens
    sync(engine.device)
    end = time.perf_counter()
    drive.cpu_s = time.process_time() - cpu
    drive.first_s = (first_at or end) - start
    drive.decode_tok_s = (tokens - first_tokens) / (end - first_at) if first_at and end > first_at else None
    return end - start, tokens, [by_id[rid] for rid in ids]


def load_pair(pair: str | None, device: str):
    """(target, drafter): the 8B-shaped random pair, or a trained pair's folders (`target/`, `draft/`)."""
    if pair is None:
        return (FastLlama.random(LLAMA_8B, device=device, dtype=torch.bfloat16),
                FastLlama.random(DRAFT, device=device, dtype=torch.bfloat16, seed=1))
    from pathlib import Path

    return tuple(FastLlama.from_hf(Path(pair) / name, device=device) for name in ("target", "draft"))


def engine_rows(rows: list, new: int, pair: str | None, device: str, batches: list[int]) -> None:
    target, draft = load_pair(pair, device)
    vocab = target.shape.vocab_size
    prompts = [[(1000 + 7 * i + j) % vocab for j in range(128)] for i in range(max(batches))]
    # seeded: the synthetic acceptance draws from each request's seed (an unseeded request gets OS randomness), and
    # what a γ = 4 run commits includes the drafter's tokens it accepted — unseeded, two runs cannot be compared
    params = SamplingParams(temperature=0, max_new_tokens=new, seed=0)
    warm = SamplingParams(temperature=0, max_new_tokens=min(new, 8), seed=0)
    kt = None
    if device == "cuda":
        from specdec.fast.kernels.invariant import triton_kernels

        kt = triton_kernels()
    tokens_of = {}
    modes = [("default", False, None, batches), ("bitwise", True, None, batches)]
    if kt is not None:  # the fixed tiles only where the M-range ones differ (M > SMALL_M rows)
        modes.append(("bitwise_fixed_tiles", True, False, [b for b in batches if b > 1] or batches))
    for mode, bitwise, tiles_by_m, mode_batches in modes:
        if kt is not None:
            kt.TILES_BY_M = tiles_by_m  # None: the device probe decides (the shipped behaviour)
        if over_budget(rows, f"engine rows {mode}"):
            break
        firsts = {}
        for name, drafter, gamma in (("plain", None, 0), ("spec", draft, 4)):
            config = EngineConfig(max_batch_size=max(batches), max_seq_len=512, num_draft_tokens=gamma,
                                  max_draft_tokens=4,
                                  synthetic_acceptance=0.8 if drafter is not None else None, bitwise=bitwise)
            engine = Engine(target, drafter, config)
            for batch in mode_batches:
                drive(engine, prompts[:batch], warm)  # compiles, captures the decode graphs
                seconds, tokens, outs = drive(engine, prompts[:batch], params)
                tokens_of[(mode, name, batch)] = outs
                if name == "plain":
                    firsts[batch] = outs[0]
                decode = drive.decode_tok_s
                emit(rows, {"what": name, "mode": mode, "bitwise": bitwise, "batch": batch, "gamma": gamma,
                            "tok_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                            "first_token_s": round(drive.first_s, 3),
                            "decode_tok_s": None if decode is None else round(decode, 1),
                            "tok_per_cpu_s": round(tokens / max(drive.cpu_s, 1e-9), 1)})
            del engine
        if len(firsts) > 1:
            emit(rows, {"what": f"greedy batch {mode_batches[0]} == batch {mode_batches[-1]} (plain, first prompt)",
                        "mode": mode, "bitwise": bitwise, "same": firsts[mode_batches[0]] == firsts[mode_batches[-1]]})
    for (mode, name, batch), outs in tokens_of.items():
        if mode == "bitwise_fixed_tiles" and ("bitwise", name, batch) in tokens_of:
            other = tokens_of[("bitwise", name, batch)]
            emit(rows, {"what": "M-range tiles == fixed tiles (greedy tokens, every prompt)", "run": name,
                        "batch": batch, "same_prompts": sum(a == b for a, b in zip(outs, other)), "of": len(outs)})
    if kt is not None:
        kt.TILES_BY_M = None
        probes = [dict(dataclasses.asdict(p), same=p.same) for p in kt.tile_probes()]
        emit(rows, {"what": "tile probes the engine ran", "probes": probes})
    if pair is not None:  # trained pair: what the shared race costs in acceptance (sampled rows, γ = 4)
        for bitwise in (False, True):
            engine = Engine(target, draft, EngineConfig(max_batch_size=max(batches), max_seq_len=512,
                                                        num_draft_tokens=4, bitwise=bitwise))
            sampled = SamplingParams(temperature=0.8, max_new_tokens=new, seed=0)
            drive(engine, prompts[:1], sampled)
            engine.stats = type(engine.stats)()
            seconds, tokens, _ = drive(engine, prompts[: max(batches)], sampled)
            emit(rows, {"what": "sampled T=0.8, gamma 4", "bitwise": bitwise, "batch": max(batches),
                        "tokens_per_step": round(engine.stats.mean_accepted_length, 3),
                        "tok_s": round(tokens / seconds, 1), "tok_per_cpu_s": round(tokens / max(drive.cpu_s, 1e-9), 1)})
            del engine
    del target, draft
    if device == "cuda":
        torch.cuda.empty_cache()


def time_cuda(fn, reps: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps * 1e3  # µs


def time_graph(fn, calls: int = 20, reps: int = 5) -> float:
    """µs per call of fn, `calls` calls captured in one CUDA graph and replayed (no launch overhead: what the
    engine's captured decode steps see); `specdec.fast.graphs.graph_time_us`."""
    from specdec.fast.graphs import graph_time_us

    return graph_time_us(fn, calls=calls, reps=reps, warmup=1)


GEMM_DEVICE = "cuda"  # (a smoke test runs the GEMM section in Triton's interpreter on "cpu")
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def probe_rows(rows: list) -> None:
    """The device probe's verdict (bf16) for each base tile of the 8B shapes: what the engine will run."""
    from specdec.fast.kernels.invariant import triton_kernels

    kt = triton_kernels()
    for base in sorted({kt.fixed_config(n, k) for n, k in SHAPES.values()}, key=lambda c: c.name()):
        start = time.perf_counter()
        result = kt.probe_tiles(base, torch.bfloat16, torch.device("cuda"))
        emit(rows, {"what": "tile probe", **dataclasses.asdict(result), "same": result.same,
                    "seconds": round(time.perf_counter() - start, 2)})


def gemm_rows(rows: list, heights=(1, 64, 320)) -> None:
    """Per matrix and M: cuBLAS, the fixed config, the M-range config, what the engine runs, other tiles of the
    fixed order and other orders (the engine's tile with 1, 2, 4, 8 splits; another BLOCK_K), each with whether its
    output bits equal the fixed config's (the proof on the real shape, and its control)."""
    from specdec.fast.kernels.invariant import triton_kernels

    kt = triton_kernels()
    t = kt.Tile
    tiles = [t(64, 64, 4, 3), t(64, 128, 8, 3), t(128, 128, 8, 2), t(128, 64, 4, 3)]
    for name, (n, k) in SHAPES.items():
        if over_budget(rows, f"gemm {name}"):
            return
        w = torch.randn(n, k, device=GEMM_DEVICE, dtype=torch.bfloat16) / k ** 0.5
        fixed = kt.fixed_config(n, k)
        for m in heights:
            x = torch.randn(m, k, device=GEMM_DEVICE, dtype=torch.bfloat16)
            by_m = kt.config_for(n, k, m)
            engine = kt.launch_config(n, k, m, torch.bfloat16, x.device)  # what the probe lets the engine run
            row = {"what": "gemm", "matrix": name, "m": m, "fixed_config": fixed.name(), "by_m_config": by_m.name(),
                   "engine_config": engine.name(),
                   "bytes_gb": n * k * 2 / 1e9, "cublas_us": round(time_graph(lambda: torch.mm(x, w.t())), 1)}
            want = torch.empty(m, n, device=GEMM_DEVICE, dtype=torch.bfloat16)
            kt.matmul(x, w, None, None, want, fixed)
            same_order = {fixed, by_m, engine}
            # other orders: the engine's tile with another split count (what choosing the split for M = 1 and the
            # large passes together would trade) ...
            other_orders = {dataclasses.replace(engine, split_k=s, fuse_splits=False) for s in (1, 2, 4, 8)
                            if s != fixed.split_k}
            if m > 16:  # (up to SMALL_M rows the fixed config runs whatever the table says)
                for tile in {*tiles, *(c for _, ts in kt.range_tiles(fixed) for c in ts)}:  # + every candidate
                    same_order.update({fixed.with_tile(tile, False), fixed.with_tile(tile, True)})
                # ... and another BLOCK_K over the same K ranges (whether it changes the bits is recorded)
                other_orders.add(dataclasses.replace(fixed, block_k=64 if fixed.block_k > 64 else 128, num_stages=2))
            timings, bits = {}, {}
            for cfg in sorted(same_order, key=lambda c: c.name()) + sorted(other_orders, key=lambda c: c.name()):
                out = torch.empty(m, n, device=GEMM_DEVICE, dtype=torch.bfloat16)
                try:
                    timings[cfg.name()] = round(time_graph(lambda: kt.matmul(x, w, None, None, out, cfg)), 1)
                except Exception as exc:  # e.g. out of shared memory for a deep tile: recorded, not fatal
                    timings[cfg.name()] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                    continue
                kt.matmul(x, w, None, None, out, cfg)
                bits[cfg.name()] = bool(torch.equal(out, want))
            row.update(fixed_us=timings[fixed.name()], by_m_us=timings[by_m.name()],
                       engine_us=timings[engine.name()], timings=timings,
                       same_bits_as_fixed=bits)
            emit(rows, row)
        del w


def graph_or_none(fn) -> float | str:
    try:
        return round(time_graph(fn), 1)
    except RuntimeError as exc:  # a kernel path that syncs the host cannot be captured: say so, keep going
        return f"not capturable: {str(exc)[:80]}"


def attention_rows(rows: list) -> None:
    """The invariant attention against the default split-K kernel, 8B shapes (32 heads, 8 KV heads, dim 128)."""
    from specdec.fast.kernels.attention import slot_attention
    from specdec.fast.kernels.invariant import invariant_attention

    for batch, k, live in ((1, 1, 512), (1, 5, 512), (1, 1, 4000), (64, 1, 512), (64, 5, 512)):
        slots = 1 << (live + k + 1).bit_length()
        q = torch.randn(batch, k, 32, 128, device="cuda", dtype=torch.bfloat16)
        keys = torch.randn(batch, 8, slots, 128, device="cuda", dtype=torch.bfloat16)
        values = torch.randn_like(keys)
        pos = live - k + torch.arange(k, device="cuda")[None, :].expand(batch, k)
        default = lambda: slot_attention(q, keys, values, pos, kernel="triton")  # noqa: E731
        bitwise = lambda: invariant_attention(q, keys, values, pos)  # noqa: E731
        emit(rows, {"what": "attention", "batch": batch, "k": k, "live": live, "slots": slots,
                    "default_us": graph_or_none(default), "bitwise_us": graph_or_none(bitwise),
                    "default_launch_us": round(time_cuda(default), 1),
                    "bitwise_launch_us": round(time_cuda(bitwise), 1)})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/bench_bitwise.py")
    parser.add_argument("--out", default="bitwise.json", help="where the JSON list goes")
    parser.add_argument("--new", type=int, default=96, help="tokens generated per request")
    parser.add_argument("--skip-gemm", action="store_true", help="only the engine rows")
    parser.add_argument("--pair", default=None, help="a pair folder (target/, draft/) instead of the 8B-shaped one")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --pair and --skip-gemm)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="batch sizes (default 1 64)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the sections that would start after this many seconds (the rows so far are kept)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu --pair DIR --skip-gemm)", file=sys.stderr)
        return 2
    if args.device != "cuda" and (args.pair is None or not args.skip_gemm):
        print("--device cpu needs --pair and --skip-gemm", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    if args.budget_s is not None and args.budget_s <= 0:
        print(f"--budget-s must be > 0, got {args.budget_s}", file=sys.stderr)
        return 2
    global OUT_PATH, BUDGET_S
    OUT_PATH, BUDGET_S = args.out, args.budget_s
    rows = [{"device": name, "torch": torch.__version__, "pair": args.pair or "8B-shaped random bf16"}]
    try:
        if not args.skip_gemm:
            probe_rows(rows)
        engine_rows(rows, args.new, args.pair, args.device, sorted(args.batch))
        if not args.skip_gemm:
            gemm_rows(rows)
            if not over_budget(rows, "attention"):
                attention_rows(rows)
    finally:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
