"""The quantized GEMV's A/B rows for `scripts/bench_quant_gpu.py --gemv-ab`: µs and GB/s of one product y = x @ Wᵀ at
the 8B shapes for M = 1, 4, 8 rows, in a CUDA graph (`fast.graphs.graph_time_us`), per format (int4 GPTQ, FP8 per
channel, FP8 128 × 128 blocks): bf16 cuBLAS (F.linear on the dense weight), the split-K kernel (`quant_triton`, today's
default), the GEMV (`quant_gemv`, its table's config) in the "nk" word layout and, int4, "kn". Each quantized result
is also checked against the dequantized fp32 product (bf16 bound 2⁻⁷ · |x| @ |W|ᵀ + 1e-3): "ok".

Rows (JSON lines): "gemv_ab" one per (matrix, format, M, kernel) with us, gb_s (the weight bytes read: the quantized
matrix with its scales / zeros; bf16 N·K·2), over_bf16 and over_splitk (their µs over this one's); with --gemv-sweep,
"gemv_sweep" the fastest candidate config per (format, matrix, M) within --gemv-sweep-s seconds, and last
"gemv_configs": the measured table by (format, shape class, row bucket) as `GemvConfig` fields, to paste into
`quant_gemv.GEMV_CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import time

import torch

# (name, N, K): out × in, the 8B matrices (o = q / k / v's square, up = one of gate|up, down, the LM head)
AB_MATRICES = (("o", 4096, 4096), ("up", 14336, 4096), ("down", 4096, 14336), ("head", 128256, 4096))
SMOKE_MATRICES = (("o", 96, 256), ("down", 64, 512))
AB_FORMATS = ("gptq", "fp8", "fp8-block")
AB_ROWS = (1, 4, 8)


def sweep_candidates(fmt: str, m: int) -> list:
    """The sweep's configs for a format at M rows: FMA tiles (int4 up to 2 rows, FP8 one: the FMAs and registers grow
    with the rows) and tensor-core ones, each at the automatic split summed by the reduce kernel, at 8 slices, and
    at the automatic split summed by the last slice to arrive."""
    from specdec.fast.kernels.quant_gemv import GemvConfig

    fma_rows = 2 if fmt in ("gptq", "awq") else 1
    fma = [GemvConfig(block_n=bn, block_k=128, num_warps=w, num_stages=st, prefetch=pre, variant="fma")
           for bn in (64, 128) for w in (4, 8) for st, pre in ((2, False), (1, True))] if m <= fma_rows else []
    dot = [GemvConfig(block_n=bn, block_k=bk, num_stages=st, prefetch=False, variant="dot")
           for bn in (64, 128) for bk in (64, 128) for st in (3, 4)]
    out = []
    for c in fma + dot:  # (the splits share one binary; the last-arrival sum is a second one)
        out += [c, dataclasses.replace(c, split_k=8), dataclasses.replace(c, reduce="fused")]
    return out


def _close(y, x, d) -> bool:
    ref = x.float() @ d.t()
    return bool(((y.float() - ref).abs() <= 2**-7 * (x.float().abs() @ d.abs().t()) + 1e-3).all())


def ab_rows(emit, time_us, device: str, formats=AB_FORMATS, ms=AB_ROWS, sweep_s: float = 0.0) -> None:
    """Emit the module doc's rows (`emit(row)`, `time_us(fn, calls=, reps=)`: the bench's own)."""
    import torch.nn.functional as F

    from specdec.fast.kernels import quant_gemv
    from specdec.fast.kernels.quant_gemv import gemv, row_bucket, shape_class
    from specdec.fast.quant.gpu_attach import quantize_weight

    gen = torch.Generator(device=device).manual_seed(0)
    best: dict = {}
    deadline = time.perf_counter() + sweep_s
    for name, n, k in (AB_MATRICES if device == "cuda" else SMOKE_MATRICES):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                        generator=gen) * 0.02
        qws = {fmt: quantize_weight(w, fmt, 128) for fmt in formats}
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=w.dtype, generator=gen)
            bf16_us = time_us(lambda: F.linear(x, w), calls=20, reps=10)
            emit({"row": "gemv_ab", "matrix": name, "n": n, "k": k, "m": m, "format": "bf16", "kernel": "cublas",
                  "us": round(bf16_us, 2), "gb_s": round(n * k * w.element_size() / bf16_us / 1e3, 1)})
            for fmt, qw in qws.items():
                d = qw.dequantize()
                runs = {"splitk": lambda qw=qw: qw.linear(x, kernel="triton"),
                        "gemv": lambda qw=qw: gemv(x, qw, layout="nk")}
                if fmt in ("gptq", "awq"):
                    runs["gemv-kn"] = lambda qw=qw: gemv(x, qw, layout="kn")
                base = None
                for kernel, fn in runs.items():
                    row = {"row": "gemv_ab", "matrix": name, "n": n, "k": k, "m": m, "format": fmt, "kernel": kernel}
                    try:
                        row["ok"] = _close(fn(), x, d)
                        us = time_us(fn, calls=20, reps=10)
                    except Exception as exc:  # noqa: BLE001 - the other kernels' rows still count
                        emit({**row, "error": f"{type(exc).__name__}: {exc}"[:300]})
                        continue
                    base = us if kernel == "splitk" else base
                    emit({**row, "us": round(us, 2), "gb_s": round(qw.nbytes / us / 1e3, 1),
                          "over_bf16": round(bf16_us / us, 3), "over_splitk": round(base / us, 3) if base else None})
                if time.perf_counter() < deadline:
                    _sweep_one(emit, time_us, qw, x, d, name, fmt, m, best, deadline)
            del x
        del w, qws
        if device == "cuda":
            torch.cuda.empty_cache()
    if best:
        table = {}
        for (fmt, name, m), (us, config) in best.items():
            n, k = next((n, k) for nm, n, k in (AB_MATRICES if device == "cuda" else SMOKE_MATRICES) if nm == name)
            key = ("int4" if fmt == "gptq" else "fp8", shape_class(n, k), row_bucket(m))
            table.setdefault(key, config.__dict__)  # (the first matrix of a class measured decides)
        emit({"row": "gemv_configs", "GEMV_CONFIGS": {"|".join(map(str, key)): v for key, v in table.items()},
              "default_kernel": quant_gemv.DEFAULT_KERNEL})


def _sweep_one(emit, time_us, qw, x, d, name, fmt, m, best, deadline) -> None:
    from specdec.fast.kernels.quant_gemv import gemv, pick_gemv_config

    fmt_key = qw.kernel_args()[0]
    default = pick_gemv_config(fmt_key, *qw.shape, m, group=qw.kernel_args()[4])
    found, failed = [], []
    for config in [default] + sweep_candidates(fmt, m):
        if time.perf_counter() > deadline:
            break
        if fmt_key == "fp8_block" and config.block_k > 128:
            continue
        for layout in (("nk", "kn") if fmt in ("gptq", "awq") else ("nk",)):
            try:
                fn = lambda c=config, lay=layout: gemv(x, qw, config=c, layout=lay)  # noqa: E731
                if not _close(fn(), x, d):
                    failed.append(f"{config} {layout}: wrong result")
                    continue
                found.append((time_us(fn, calls=20, reps=5), config, layout))
            except Exception as exc:  # noqa: BLE001 - a config that does not compile / fit is skipped
                failed.append(f"{config} {layout}: {type(exc).__name__}: {exc}"[:200])
    if not found:
        emit({"row": "gemv_sweep", "matrix": name, "format": fmt, "m": m, "error": "no config ran",
              "failed": failed[:3]})
        return
    found.sort(key=lambda r: r[0])
    us, config, layout = found[0]
    best[(fmt, name, m)] = (us, config)
    emit({"row": "gemv_sweep", "matrix": name, "format": fmt, "m": m, "us": round(us, 2),
          "gb_s": round(qw.nbytes / us / 1e3, 1), "config": config.__dict__, "layout": layout,
          "table_us": round(next(u for u, c, _ in found if c == default), 2) if any(c == default for _, c, _ in found)
          else None, "tried": len(found), "failed": failed[:3], "failed_count": len(failed)})


def main(argv=None) -> None:
    """`bench_quant_gpu.py --gemv-ab` with these arguments (e.g. --gemv-sweep --out FILE)."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_quant_gpu import main as bench

    bench(["--gemv-ab", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
