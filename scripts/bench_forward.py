"""Forward cost of the fast model, eager layers vs fused Triton kernels: CUDA-graph replays of k = 1..9 new tokens.

    python scripts/bench_forward.py --out forward.json          # H200: zoo `gpu` target shape + 8B Llama shape
    python scripts/bench_forward.py --tiny --out tiny.json      # CPU: the same logic on a tiny shape, eager
                                                                #      timing, Triton in its interpreter

For each shape and batch size: `FastLlama.random` (bf16), a slot cache with `--live` tokens already cached, one
captured graph per (kernels, k) replayed `--iters` times (median ms). Printed and written: ms per forward,
verify(k) / verify(1), tokens/s (batch·k / time) and MBU = weight_bytes / time / 4.8e12 (meaningful at k = 1),
the fused/eager speedup, max |Δlogit| between the two kernel modes on the same input, and (CUDA) kernels per
forward from one profiled eager forward at k = 1 and 9.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HBM_BYTES_PER_S = 4.8e12  # H200

SHAPES = {
    # the zoo `gpu` target (specdec/zoo/presets.py: dim 1024, 24 layers, 16 heads, ff 2816, vocab 8192)
    "zoo-gpu": dict(vocab_size=8192, dim=1024, n_layers=24, n_heads=16, n_kv_heads=16, head_dim=64,
                    intermediate_size=2816, rms_norm_eps=1e-5, rope_theta=10000.0),
    # Llama-3-8B
    "llama-8b": dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     intermediate_size=14336, rms_norm_eps=1e-5, rope_theta=500000.0),
    # CPU logic check
    "tiny": dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0),
}
BATCHES = {"zoo-gpu": (1, 64), "llama-8b": (1,), "tiny": (1, 3)}
# eager; fused kernels with cuBLAS GEMMs; fused + kernels.linear where it measured faster (the default); fused +
# kernels.linear for every GEMM
MODES = ("reference", "triton-cublas", "triton", "triton-linear")
_SETTINGS = {"reference": ("reference", "reference"), "triton-cublas": ("triton", "reference"),
             "triton": ("triton", "auto"), "triton-linear": ("triton", "triton")}  # → (kernels, linear_kernel)


def _timer(model, cache, tokens, live, iters, cuda):
    """Median ms of one forward of `tokens [B, k]` after `live` cached tokens (graph replay on CUDA)."""
    def body():
        cache.lengths.fill_(live)
        return model(tokens, cache)

    if not cuda:  # CPU: eager wall time
        body()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            body()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), body
    from specdec.fast.graphs import CapturedStep

    step = CapturedStep(body, restore=[cache.lengths])
    for _ in range(3):
        step.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        step.replay()
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    del step
    return ms, body


def bench_shape(name: str, args, device: torch.device) -> list[dict]:
    from specdec.fast import FastLlama, LlamaShape

    cuda = device.type == "cuda"
    shape = LlamaShape(**SHAPES[name])
    dtype = torch.bfloat16 if cuda else torch.float32
    model = FastLlama.random(shape, device=device, dtype=dtype, seed=0)
    weight_bytes = model.weight_bytes
    ks = range(1, args.max_k + 1)
    rows = []
    for batch in BATCHES[name]:
        cache = model.new_cache(batch, args.live + args.max_k + 8)
        model.rope_tables(cache.keys[0].shape[2])  # before any capture
        gen = torch.Generator().manual_seed(batch)
        on_device = torch.Generator(device=device).manual_seed(batch)
        with torch.no_grad():  # cached keys/values: random numbers (timing does not depend on them)
            for t in cache.keys + cache.values:
                t.normal_(0.0, 0.5, generator=on_device)
        tokens = {k: torch.randint(3, shape.vocab_size, (batch, k), generator=gen).to(device) for k in ks}
        logits = {}
        for mode in MODES:
            model.kernels, model.linear_kernel = _SETTINGS[mode]
            with torch.inference_mode():
                base = None
                for k in ks:
                    ms, body = _timer(model, cache, tokens[k], args.live, args.iters, cuda)
                    if k == 1:
                        base = ms
                        logits[mode] = body()[:, -1].float().cpu()
                    row = dict(shape=name, batch=batch, kernels=mode, k=k, ms=round(ms, 4),
                               verify_ratio=round(ms / base, 4), tokens_per_s=round(batch * k / ms * 1e3, 1),
                               mbu=round(weight_bytes / (ms / 1e3) / HBM_BYTES_PER_S, 4))
                    if cuda and args.profile and k in (1, args.max_k):
                        from specdec.bench.profile import profile_steps

                        prof = profile_steps(body, 1, device)
                        row["kernels_per_forward"] = prof["kernels_per_step"]
                        row["kernel_ms_by_kind"] = prof["by_kind_ms_per_step"]
                    rows.append(row)
                    print(_line(row), file=sys.stderr, flush=True)
        diff = float((logits["triton"] - logits["reference"]).abs().max())
        scale = float(logits["reference"].abs().max())
        for row in rows:
            if row["shape"] == name and row["batch"] == batch:
                row["max_abs_logit_diff_k1"] = round(diff, 5)
                row["max_abs_logit_k1"] = round(scale, 5)
                if row["kernels"] != "reference":
                    ref = next(r for r in rows if r["shape"] == name and r["batch"] == batch
                               and r["kernels"] == "reference" and r["k"] == row["k"])
                    row["speedup_vs_reference"] = round(ref["ms"] / row["ms"], 4)
        del cache
    del model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def _line(row: dict) -> str:
    extra = f"  kernels/fwd {row['kernels_per_forward']:.0f}" if "kernels_per_forward" in row else ""
    return (f"{row['shape']:>9} B={row['batch']:<3} {row['kernels']:>9} k={row['k']}  {row['ms']:8.4f} ms  "
            f"x{row['verify_ratio']:.3f}  {row['tokens_per_s']:>10.1f} tok/s  MBU {row['mbu']:.3f}{extra}")


def table(rows: list[dict]) -> str:
    head = "| shape | batch | kernels | k | ms/forward | verify(k)/verify(1) | tokens/s | MBU (k=1) | fused speedup |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        mbu = f"{r['mbu']:.3f}" if r["k"] == 1 else ""
        speed = f"{r['speedup_vs_reference']:.3f}" if "speedup_vs_reference" in r else ""
        lines.append(f"| {r['shape']} | {r['batch']} | {r['kernels']} | {r['k']} | {r['ms']:.4f} | "
                     f"{r['verify_ratio']:.3f} | {r['tokens_per_s']:.1f} | {mbu} | {speed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--tiny", action="store_true", help="CPU logic check: tiny shape, Triton interpreter")
    parser.add_argument("--shapes", default=None, help="comma-separated subset of " + ", ".join(SHAPES))
    parser.add_argument("--live", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--max-k", type=int, default=9)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the kernel counts")
    args = parser.parse_args(argv)
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first built
        args.live, args.max_k, args.iters = min(args.live, 24), min(args.max_k, 3), min(args.iters, 2)
        device = torch.device("cpu")
        names = ["tiny"]
    else:
        if not torch.cuda.is_available():
            parser.error("needs CUDA (use --tiny for the CPU logic check)")
        device = torch.device("cuda")
        names = ["zoo-gpu", "llama-8b"]
    if args.shapes:
        names = args.shapes.split(",")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    start = time.time()
    rows = []
    for name in names:
        rows += bench_shape(name, args, device)
    import triton  # noqa: F401  (imported by the kernels already; its version goes into the record)

    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + (argv or sys.argv[1:])),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "triton": triton.__version__, "live_tokens": args.live,
        "iters": args.iters, "hbm_bytes_per_s": HBM_BYTES_PER_S, "seconds": round(time.time() - start, 1),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
