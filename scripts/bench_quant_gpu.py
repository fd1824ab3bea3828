"""FP8 and int4 weight-only decoding on the GPU against bf16, random weights of an 8B shape (no checkpoint), one run.

    python scripts/bench_quant_gpu.py --out $OUT/quant_gpu.jsonl                 # ops, then the end-to-end rows
    python scripts/bench_quant_gpu.py --sweep --formats bf16 gptq fp8 --new 128  # pick the kernel configs first
    python scripts/bench_quant_gpu.py --smoke --sweep                             # CPU dry run (tiny, interpreter)
    python scripts/bench_quant_gpu.py --gemv-ab [--gemv-sweep] --out $OUT/quant_gemv.jsonl   # split-K vs GEMV vs bf16
    python scripts/bench_quant_gpu.py --formats bf16 gptq gptq@gemv fp8 fp8@gemv --no-ops    # end to end, each kernel

Rows (JSON lines, printed and appended to --out):
  "op"      (last) µs per product y = x @ Wᵀ of each 8B matrix (q|k|v, o, gate|up, down, LM head) at M = 1 and 5, in a CUDA
            graph (`fast.graphs.graph_time_us`): bf16 cuBLAS, the quantized kernel (int4 GPTQ, FP8 per channel, FP8
            128 × 128 blocks) and `torch._scaled_mm` (FP8 W8A8, per-token activations); GB/s of the weight bytes
  "sweep"   (--sweep, first) the fastest kernel config per (format, N, K): compile-time candidates × K splits at
            1 row, the best 4 also at 5 (their sum decides); the FMA variant against it at 1 row (kept for one row
            where faster); put in `quant_linear.CONFIGS` for every row after it
  "step"    one forward of the whole model at batch 1 (CUDA graph, 128 cached tokens): 1 row (a plain step) and
            γ + 1 = 5 rows (a verify pass); verify_over_plain = their ratio
  "plain"   the engine's plain greedy decoding at batch 1 (prompt 128, --new tokens, the second of two runs), tok/s,
            and the speed-up over bf16 in the same run
  "spec"    (--spec-alpha α) the same with a random bf16 drafter accepted with probability α (synthetic), γ = --gamma:
            tok/s, over this format's plain, and that ratio over bf16's
  "gemv_ab" (--gemv-ab, instead of the rows above) µs / GB/s per product at the 8B shapes, M = 1, 4, 8: bf16, the
            split-K kernel, the GEMV (`fast.kernels.quant_gemv`); "gemv_sweep" / "gemv_configs" with --gemv-sweep
            (`scripts/quant_gemv_ab.py`'s doc)
Formats: bf16, gptq (int4, group 128), awq, fp8 (per channel), fp8-block, fp8-scaled-mm (per channel, through
`torch._scaled_mm`); a "+head" suffix quantizes the LM head too; an "@gemv" suffix (or "@gemv-kn": int4 words
transposed) runs that format's rows under SPECDEC_QUANT_KERNEL=gemv (the decode GEMV for ≤ 8 rows), none the
default. The LM head stays bf16 otherwise (as GPTQ / AWQ / FP8 checkpoints ship it), or with --quantize-head for
every format.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MATRICES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
            "head": (128256, 4096)}
SMOKE_MATRICES = {"qkv": (256, 128), "down": (128, 256)}
DEVICE = "cuda"


def time_us(fn, calls: int, reps: int) -> float:
    """`fast.graphs.graph_time_us` on CUDA; a plain loop on the CPU (the smoke run)."""
    if DEVICE == "cuda":
        from specdec.fast.graphs import graph_time_us

        return graph_time_us(fn, calls=calls, reps=reps)
    fn()
    start = time.perf_counter()
    for _ in range(2):
        fn()
    return (time.perf_counter() - start) / 2 * 1e6


def emit(row: dict, out) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def quantized(fmt: str, w: torch.Tensor):
    from specdec.fast.quant.gpu_attach import quantize_weight

    return quantize_weight(w, "fp8" if fmt == "fp8-scaled-mm" else fmt, 128)


def op_rows(out, formats) -> None:
    import torch.nn.functional as F

    from specdec.fast.quant.fp8 import scaled_mm_linear

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for name, (n, k) in (MATRICES if DEVICE == "cuda" else SMOKE_MATRICES).items():
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) * 0.02
        qws = {}
        for fmt in dict.fromkeys(f.removesuffix("+head") for f in formats if f != "bf16"):
            try:
                qws[fmt] = quantized(fmt, w)
            except Exception as exc:  # noqa: BLE001
                emit({"row": "op", "matrix": name, "format": fmt, "error": f"{type(exc).__name__}: {exc}"[:200]}, out)
        for m in (1, 5):
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            row = {"row": "op", "matrix": name, "n": n, "k": k, "m": m}
            runs = {"bf16": (lambda: F.linear(x, w), n * k * 2)}
            for fmt, qw in qws.items():
                if fmt == "fp8-scaled-mm":
                    runs[fmt] = ((lambda qw=qw: scaled_mm_linear(x, qw)), qw.nbytes)
                else:
                    runs[fmt] = ((lambda qw=qw: qw.linear(x, kernel="triton")), qw.nbytes)
            for fmt, (fn, nbytes) in runs.items():
                try:
                    us = time_us(fn, calls=20, reps=10)
                    row[f"{fmt}_us"] = round(us, 2)
                    row[f"{fmt}_gb_s"] = round(nbytes / us / 1e3, 1)
                except Exception as exc:  # noqa: BLE001 - the other columns still count
                    row[f"{fmt}_error"] = f"{type(exc).__name__}: {exc}"[:200]
            emit(row, out)
        del w, qws
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


# Kernel configs the sweep tries: compile-time candidates (block_n, block_k, num_warps, num_stages, unpack, variant,
# prefetch), each at every K split in SPLITS (a run-time value: no recompilation).
DOT_INT4 = [(bn, 128, 4, 3, "reshape-magic", "dot", pre) for bn in (64, 128) for pre in (False, True)] + [
    (64, 128, 4, 3, "reshape", "dot", False)]
DOT_FP8 = [(64, 128, 4, 3, "reshape", "dot", False), (64, 128, 4, 3, "reshape", "dot", True),
           (128, 128, 4, 3, "reshape", "dot", False), (64, 256, 4, 3, "reshape", "dot", False)]
FMA_INT4 = [(bn, 128, 4, 3, "reshape-magic", "fma", True) for bn in (32, 64)]
FMA_FP8 = [(64, 128, 4, 3, "reshape", "fma", True)]
SPLITS = (1, 2, 4, 8, 16, 32)


def candidates(fmt: str, few: bool = False) -> list:
    """The sweep's configs for a format: "gptq" / "fp8" (the dot variant) or, few=True, the FMA one (one row)."""
    if few:
        return FMA_INT4 if fmt == "gptq" else FMA_FP8
    return DOT_INT4 if fmt == "gptq" else DOT_FP8


def config_of(entry, split: int):
    from specdec.fast.kernels.quant_linear import QuantConfig

    block_n, block_k, warps, stages, unpack, variant, prefetch = entry
    return QuantConfig(block_n, block_k, split, 4 if variant == "fma" else 16, warps, stages, unpack, "fused",
                       variant, prefetch)


def sweep(out, formats) -> None:
    """Per (format, matrix): every candidate × split at 1 row, the 4 fastest also at 5 (the sum decides); then the
    FMA variant at 1 row against the winner, kept for one row where it is faster."""
    from specdec.fast.kernels import quant_linear

    gen = torch.Generator(device=DEVICE).manual_seed(1)
    kinds = {f.removesuffix("+head") for f in formats} - {"bf16", "fp8-scaled-mm"}
    head = any(f.endswith("+head") for f in formats)
    for fmt in sorted({"gptq" if f in ("gptq", "awq") else "fp8" for f in kinds}):
        matrices = dict(MATRICES if DEVICE == "cuda" else SMOKE_MATRICES)
        if not (head and fmt == "gptq"):
            matrices.pop("head", None)
        for name, (n, k) in matrices.items():
            w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) * 0.02
            qw = quantized(fmt, w)
            del w
            kind, q, zeros, scales, group = qw.kernel_args()
            xs = {m: torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) for m in (1, 5)}

            def us(cfg, m):
                return time_us(lambda: quant_linear.run_kernel(xs[m], kind, q, zeros, scales, group, n, config=cfg),
                               calls=20, reps=5)

            failed = []

            def ranked(entries, m):
                found = []
                for entry in entries:
                    for split in SPLITS:
                        if k // split < entry[1]:
                            continue
                        try:
                            found.append((us(config_of(entry, split), m), entry, split))
                        except Exception as exc:  # noqa: BLE001 - a config that does not compile / fit is skipped
                            failed.append(f"{list(entry)} split {split}: {type(exc).__name__}: {exc}"[:160])
                return sorted(found, key=lambda r: r[0])

            key = ("int4" if fmt == "gptq" else "fp8", n, k)
            default = us(quant_linear.pick_config(key[0], n, k, 1), 1)
            dots = [(t + us(config_of(e, sp), 5), t, e, sp) for t, e, sp in ranked(candidates(fmt), 1)[:4]]
            if not dots:
                emit({"row": "sweep", "format": fmt, "matrix": name, "error": "no config ran", "failed": failed[:3]}, out)
                continue
            total, m1, entry, split = min(dots, key=lambda r: r[0])
            bn, bk, warps, stages, unpack, variant, pre = entry
            quant_linear.CONFIGS[key] = (bn, bk, split, warps, stages, unpack, variant, pre)
            fma = ranked(candidates(fmt, True), 1)  # one row (plain decoding at batch 1): the FMA variant
            best_fma = fma[0] if fma else None
            if best_fma is not None and best_fma[0] < m1:
                bn, bk, warps, stages, unpack, variant, pre = best_fma[1]
                quant_linear.CONFIGS[(*key, 1)] = (bn, bk, best_fma[2], warps, stages, unpack, variant, pre)
            emit({"row": "sweep", "format": fmt, "matrix": name, "n": n, "k": k, "config": list(quant_linear.CONFIGS[key]),
                  "m1_us": round(m1, 2), "m1_plus_m5_us": round(total, 2), "heuristic_m1_us": round(default, 2),
                  "gb_s_m1": round(qw.nbytes / m1 / 1e3, 1),
                  "fma_m1_us": round(best_fma[0], 2) if best_fma else None,
                  "one_row_config": list(quant_linear.CONFIGS.get((*key, 1), [])) or None,
                  "failed": failed[:3], "failed_count": len(failed)}, out)
            del qw, q, zeros, scales
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    emit({"row": "configs", "CONFIGS": {"|".join(map(str, key)): list(v) for key, v in quant_linear.CONFIGS.items()}},
         out)


def build(fmt: str, shape, quantize_head: bool):
    from specdec.fast.model import FastLlama
    from specdec.fast.quant.gpu_attach import quantize_model

    model = FastLlama.random(shape, device=DEVICE, dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    head = quantize_head or fmt.endswith("+head")
    fmt = fmt.removesuffix("+head")
    if fmt != "bf16":
        quantize_model(model, "fp8" if fmt == "fp8-scaled-mm" else fmt, lm_head=head)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return model


def step_row(model, fmt: str, out) -> dict:
    cache = model.new_cache(1, 512)
    cache.lengths.fill_(128)
    times = {}
    for k in (1, 5):
        tokens = torch.arange(5, 5 + k, device=DEVICE)[None]
        times[k] = time_us(lambda tokens=tokens: model(tokens, cache, advance=False), calls=1, reps=20)
    row = {"row": "step", "format": fmt, "plain_us": round(times[1], 1), "verify5_us": round(times[5], 1),
           "verify_over_plain": round(times[5] / times[1], 3)}
    emit(row, out)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", nargs="+", default=["bf16", "gptq", "fp8", "fp8-block", "gptq+head"],
                    help="the end-to-end rows' formats (and the sweep's)")
    ap.add_argument("--ops-formats", nargs="+", default=["awq", "fp8-scaled-mm"],
                    help="formats measured in the op rows only (beside --formats)")
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--quantize-head", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="a CPU dry run: tiny shapes, Triton's interpreter")
    ap.add_argument("--spec-alpha", type=float, default=None,
                    help="also decode speculatively: a random bf16 drafter (--draft-shape), each draft accepted with "
                         "probability α (EngineConfig.synthetic_acceptance: benchmark only)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--draft-shape", default="1b")
    ap.add_argument("--gemv-ab", action="store_true", help="only the GEMV A/B rows (scripts/quant_gemv_ab.py)")
    ap.add_argument("--gemv-sweep", action="store_true", help="with --gemv-ab: sweep GEMV configs too")
    ap.add_argument("--gemv-sweep-s", type=float, default=90.0, help="the sweep's time budget (s)")
    args = ap.parse_args(argv)
    global DEVICE
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        DEVICE = "cpu"
        args.formats = [f for f in args.formats if f != "fp8-scaled-mm"]
        args.ops_formats = [f for f in args.ops_formats if f != "fp8-scaled-mm"]
    from tp_probe import llama_shape, timed

    from specdec.engine import Engine, EngineConfig
    from specdec.fast.quant.gpu_attach import describe, quant_bytes
    from specdec.request import SamplingParams

    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    emit({"row": "env", "gpu": gpu, "torch": torch.__version__, "triton": __import__("triton").__version__}, out=args.out)
    if args.gemv_ab:
        from quant_gemv_ab import ab_rows

        ab_rows(lambda row: emit(row, args.out), time_us, DEVICE, sweep_s=args.gemv_sweep_s if args.gemv_sweep else 0)
        return
    if args.sweep:
        sweep(args.out, [f.partition("@")[0] for f in args.formats])
    shape = llama_shape(args.shape)
    if args.smoke:
        import dataclasses

        shape = dataclasses.replace(shape, vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                                    intermediate_size=256)
    base = spec_base = drafter = None
    device = torch.device(DEVICE)
    if args.spec_alpha is not None:
        from specdec.fast.model import FastLlama

        draft_shape = shape if args.smoke else llama_shape(args.draft_shape)
        drafter = FastLlama.random(draft_shape, device=DEVICE, dtype=torch.bfloat16 if DEVICE == "cuda" else
                                   torch.float32, seed=1)
    for fmt in args.formats:
        os.environ["SPECDEC_FP8_KERNEL"] = "scaled_mm" if fmt.startswith("fp8-scaled-mm") else "triton"
        kernel = fmt.partition("@")[2]  # "", "gemv" or "gemv-kn"
        os.environ["SPECDEC_QUANT_KERNEL"] = "gemv" if kernel.startswith("gemv") else "splitk"
        os.environ["SPECDEC_INT4_LAYOUT"] = "kn" if kernel == "gemv-kn" else "nk"
        started = time.perf_counter()
        try:
            model = build(fmt.partition("@")[0], shape, args.quantize_head)
            step = step_row(model, fmt, args.out)
            prompts = [[(3 * j) % 1000 + 5 for j in range(args.prompt_len)]]
            config = EngineConfig(max_batch_size=1, max_seq_len=args.prompt_len + args.new + 16, num_draft_tokens=0)
            engine = Engine(model, None, config)
            result, _ = timed(engine, prompts, SamplingParams(temperature=0, max_new_tokens=args.new), device)
            tok_s = result["decode_tokens"] / result["decode_s"]
            base = tok_s if fmt == "bf16" else base
            emit({"row": "plain", "format": fmt, "batch": 1, "tok_per_s": round(tok_s, 1),
                  "speedup_over_bf16": round(tok_s / base, 3) if base else None,
                  "gb_per_step": round(quant_bytes(model) / 1e9, 3), "weights": describe(model) or "bf16",
                  "verify_over_plain": step["verify_over_plain"], "first_tokens": result["tokens"][0][:8],
                  "build_s": round(time.perf_counter() - started, 1)}, args.out)
            if drafter is not None:
                engine = None
                config = EngineConfig(max_batch_size=1, max_seq_len=args.prompt_len + args.new + 16,
                                      num_draft_tokens=args.gamma, synthetic_acceptance=args.spec_alpha)
                engine = Engine(model, drafter, config)
                spec, _ = timed(engine, prompts, SamplingParams(temperature=0, max_new_tokens=args.new), device)
                spec_s = spec["decode_tokens"] / spec["decode_s"]
                spec_base = spec_s / tok_s if fmt == "bf16" else spec_base
                emit({"row": "spec", "format": fmt, "alpha": args.spec_alpha, "gamma": args.gamma,
                      "tok_per_s": round(spec_s, 1), "over_plain": round(spec_s / tok_s, 3),
                      "over_plain_vs_bf16s": round(spec_s / tok_s / spec_base, 3) if spec_base else None}, args.out)
        except Exception as exc:  # noqa: BLE001 - the other formats still run
            emit({"row": "plain", "format": fmt, "error": f"{type(exc).__name__}: {exc}"[:400]}, args.out)
        finally:
            engine = model = None
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    os.environ["SPECDEC_QUANT_KERNEL"], os.environ["SPECDEC_INT4_LAYOUT"] = "splitk", "nk"
    if not args.no_ops:  # (last: what a time limit cuts first)
        formats = list(dict.fromkeys(f.partition("@")[0] for f in args.formats))
        op_rows(args.out, formats + [f for f in args.ops_formats if f not in formats])


if __name__ == "__main__":
    main()
