"""The bitwise-exact mode's cost on the GPU (issue 26, item 1): an 8B-shaped Llama (random bf16 weights), plain
decoding and speculative decoding (γ = 4, a small random drafter, each draft accepted with probability 0.8) at
batch 1 and 64, default kernels vs `EngineConfig(bitwise=True)`, in the same process; whether the greedy tokens of
the batch-1 and batch-64 runs agree in each mode; and the invariant GEMM against cuBLAS on the 8B matrices at
M = 1, 5, 64, 320 — the shipped per-shape config (`_invariant_triton.config_for`: tiles and a fixed split-K chosen
from (N, K)) and a few alternatives — and the invariant attention against the default split-K kernel.

    python scripts/bench_bitwise.py --out $OUT/bitwise.json          (≈ 3 min on an H100)
    python scripts/bench_bitwise.py --pair specdec/assets/demo_pair --device cpu --batch 1 8 --new 32 --skip-gemm
                                                                     (the CPU numbers: the demo pair in fp32)

Prints one JSON line per measurement and writes them all to --out.
"""

from __future__ import annotations

import argparse
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def drive(engine: Engine, prompts, params) -> tuple[float, int, list]:
    """(wall seconds, tokens, tokens per prompt); the process's CPU seconds land in `drive.cpu_s` (the steadier
    figure on a shared CPU machine)."""
    sync(engine.device)
    start, cpu = time.perf_counter(), time.process_time()
    ids = [engine.add_request(p, params) for p in prompts]
    tokens, by_id = 0, {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens += len(out.new_token_ids)
            by_id[out.request_id].extend(out.new_token_ids)
    sync(engine.device)
    drive.cpu_s = time.process_time() - cpu
    return time.perf_counter() - start, tokens, [by_id[rid] for rid in ids]


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
    params = SamplingParams(temperature=0, max_new_tokens=new)
    for bitwise in (False, True):
        firsts = {}
        for name, drafter, gamma in (("plain", None, 0), ("spec", draft, 4)):
            config = EngineConfig(max_batch_size=max(batches), max_seq_len=512, num_draft_tokens=gamma,
                                  max_draft_tokens=4,
                                  synthetic_acceptance=0.8 if drafter is not None else None, bitwise=bitwise)
            engine = Engine(target, drafter, config)
            for batch in batches:
                drive(engine, prompts[:batch], params)  # warm: compiles, captures the decode graphs
                seconds, tokens, outs = drive(engine, prompts[:batch], params)
                if name == "plain":
                    firsts[batch] = outs[0]
                emit(rows, {"what": name, "bitwise": bitwise, "batch": batch, "gamma": gamma,
                            "tok_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                            "tok_per_cpu_s": round(tokens / max(drive.cpu_s, 1e-9), 1)})
            del engine
        emit(rows, {"what": f"greedy batch {batches[0]} == batch {batches[-1]} (plain, first prompt)",
                    "bitwise": bitwise, "same": firsts[batches[0]] == firsts[batches[-1]]})
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


def gemm_rows(rows: list) -> None:
    from specdec.fast.kernels.invariant import triton_kernels

    kt = triton_kernels()

    c = kt.MatmulConfig
    configs = [None,  # the shipped choice: config_for(N, K)
               c(32, 64, 64), c(32, 32, 128), c(64, 128, 64, 8, 3), c(64, 64, 64, 4, 3),
               c(32, 32, 128, split_k=2), c(32, 32, 128, split_k=4)]
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
              "lm_head": (128256, 4096)}
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        chosen = kt.config_for(n, k)
        for m in (1, 5, 64, 320):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row = {"what": "gemm", "matrix": name, "m": m, "cublas_us": round(time_cuda(lambda: torch.mm(x, w.t())), 1)}
            for cfg in configs:
                key = "chosen" if cfg is None else (f"bm{cfg.block_m}_bn{cfg.block_n}_bk{cfg.block_k}"
                                                    f"_w{cfg.num_warps}_st{cfg.num_stages}_s{cfg.split_k}")
                row[key] = round(time_cuda(lambda: kt.matmul(x, w, None, None, out, cfg or chosen)), 1)
            row["chosen_config"] = (f"bm{chosen.block_m}_bn{chosen.block_n}_bk{chosen.block_k}"
                                    f"_w{chosen.num_warps}_st{chosen.num_stages}_s{chosen.split_k}")
            row["bytes_gb"] = n * k * 2 / 1e9
            emit(rows, row)
        del w


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
        emit(rows, {"what": "attention", "batch": batch, "k": k, "live": live, "slots": slots,
                    "default_us": round(time_cuda(lambda: slot_attention(q, keys, values, pos, kernel="triton")), 1),
                    "bitwise_us": round(time_cuda(lambda: invariant_attention(q, keys, values, pos)), 1)})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/bench_bitwise.py")
    parser.add_argument("--out", default="bitwise.json", help="where the JSON list goes")
    parser.add_argument("--new", type=int, default=96, help="tokens generated per request")
    parser.add_argument("--skip-gemm", action="store_true", help="only the engine rows")
    parser.add_argument("--pair", default=None, help="a pair folder (target/, draft/) instead of the 8B-shaped one")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --pair and --skip-gemm)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="batch sizes (default 1 64)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu --pair DIR --skip-gemm)", file=sys.stderr)
        return 2
    if args.device != "cuda" and (args.pair is None or not args.skip_gemm):
        print("--device cpu needs --pair and --skip-gemm", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    global OUT_PATH
    OUT_PATH = args.out
    rows = [{"device": name, "torch": torch.__version__, "pair": args.pair or "8B-shaped random bf16"}]
    try:
        if not args.skip_gemm:  # the kernel rows first: seconds, and a run cut by a timeout still has them
            gemm_rows(rows)
            attention_rows(rows)
        engine_rows(rows, args.new, args.pair, args.device, sorted(args.batch))
    finally:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
