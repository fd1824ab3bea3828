"""Weight-only quantized GEMM for the decode and verify shapes: y = x @ Wᵀ (+ bias) (+ residual), W int4 (GPTQ / AWQ,
`fast.quant.int4`) or FP8 e4m3 (`fast.quant.fp8`), read quantized by one Triton kernel (`quant_triton.py`).

Every weight byte is streamed once per call for up to `block_m` rows (16 by default, 32 or 64 for a batch of verify
passes or a prefill chunk), so a verify pass of γ + 1 rows costs about one plain step. Configs: `CONFIGS` (keyed by
format, N, K; filled from a device sweep, `scripts/bench_quant_gpu.py --sweep`) else the heuristic of `pick_config`;
no autotuning at run time, so a call inside CUDA-graph capture launches what its warm-up launched. Rows above
`TRITON_ROWS` (a long prefill chunk) take the reference: the weight dequantized to x's dtype, then cuBLAS — unless
`invariant`, where every row count runs the kernel with one config per weight shape (one summation order per output
element whatever the batch: the bitwise mode's contract).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specdec.fast.kernels.quant_gemv import gemv, gemv_ok, quant_kernel
from specdec.fast.kernels.select import NUM_SMS, interpreting, kernel_module, sm_count

__all__ = ["QuantConfig", "CONFIGS", "TRITON_ROWS", "pick_config", "triton_rows_ok", "run_kernel"]

TRITON_ROWS = 4096  # rows up to which "auto" runs the kernel on CUDA (64-row tiles above 32 rows: verify batches and
# prefill chunks re-read the weight per tile); above: the weight dequantized to x's dtype, then cuBLAS


@dataclass(frozen=True)
class QuantConfig:
    """One launch shape: output columns and K per tile, K slices, rows per program, warps, pipeline stages, the
    int4 unpacking ("reshape", "gather", "-magic" variants), the split-K sum ("fused" or "kernel") and the product
    ("dot", or "fma" for a row or a few), and whether the next tile's loads are issued by hand: see `quant_triton`'s module
    doc."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    block_m: int = 16
    num_warps: int = 4
    num_stages: int = 3
    unpack: str = "reshape"
    split_reduce: str = "fused"
    variant: str = "dot"
    prefetch: bool = False


# (format, N, K[, M bucket]) → QuantConfig fields (block_n, block_k, split_k, num_warps, num_stages, unpack, variant,
# prefetch); format "int4" or "fp8"; an entry with M bucket 1 serves one row (plain decoding at batch 1: where the FMA
# variant may win), the 3-key one the rest.
# Empty until a device sweep fills it (scripts/bench_quant_gpu.py prints the table it measured).
CONFIGS: dict[tuple[str, int, int], tuple] = {}


def pick_config(fmt: str, n: int, k: int, m: int = 1, num_sms: int = NUM_SMS, *, group: int = 128,
                invariant: bool = False) -> QuantConfig:
    """The table's config for (format, N, K), else: 64 columns a program, K tiles of one group (int4) or 128 (FP8;
    smaller where 128 does not divide K), K split until there are ≥ 4 programs per SM (a weight GEMV wants many
    loads in flight: the 8B shapes ran at a fifth of the bandwidth with ≤ 2 per SM), each slice ≥ 2 tiles deep, and
    the "-magic" int4 unpacking. block_m: 16, or 32 / 64 for more rows (per row count: never under `invariant`,
    which keeps 16 and the table's split)."""
    block_m = 16 if invariant or m <= 16 else (32 if m <= 32 else 64)
    entry = None if invariant or m > 1 else CONFIGS.get((fmt, n, k, 1))
    entry = entry or CONFIGS.get((fmt, n, k))
    if entry is not None:
        block_n, block_k, split_k, warps, stages, unpack, variant, prefetch = entry
        if k % block_k or (fmt == "int4" and group != block_k):
            raise ValueError(f"CONFIGS[{fmt!r}, {n}, {k}]: block_k {block_k} must divide K (int4: equal the group)")
        block_m = 4 if variant == "fma" else block_m  # (fma: rows padded to a power of two ≤ 4)
        return QuantConfig(block_n, block_k, split_k, block_m, warps, stages, unpack, "fused", variant, prefetch)
    if fmt == "int4":  # (one group per tile)
        block_k = group
    else:
        block_k = 128
        while block_k > 16 and k % block_k:
            block_k //= 2
    block_n = 64
    tiles = -(-n // block_n)
    split_k = 1
    while tiles * split_k < 4 * num_sms and k // (2 * split_k) >= 2 * block_k:
        split_k *= 2
    return QuantConfig(block_n, block_k, split_k, block_m, 4, 3, "reshape-magic" if fmt == "int4" else "reshape")


def _triton():
    """The kernel's module (`quant_triton`), or None where Triton is not installed."""
    return kernel_module("quant_triton")


def triton_rows_ok(x: torch.Tensor, rows: int, invariant: bool = False) -> bool:
    """Whether "auto" runs the kernel for this input: CUDA (or the interpreter) with Triton, 16/32-bit floats, and
    ≤ TRITON_ROWS rows (any count when `invariant`)."""
    return ((x.is_cuda or interpreting()) and (invariant or rows <= TRITON_ROWS) and _triton() is not None
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32))


def run_kernel(x: torch.Tensor, fmt: str, q: torch.Tensor, zeros, scales: torch.Tensor, group: int, n: int,
               bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
               out: torch.Tensor | None = None, config: QuantConfig | None = None,
               invariant: bool = False) -> torch.Tensor:
    """x `[..., K]` through the kernel (format "int4", "fp8" (per-column scales `[N]`) or "fp8_block" (128 × 128
    block scales)) → `[..., N]` in x's dtype; out may be `residual` itself (each element is read, then written, by
    the same program). No host sync: capturable once warm."""
    if _triton() is None:
        raise ValueError("the quantized GPU kernel needs the triton package")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1 or x2.stride(0) != k:
        x2 = x2.contiguous()
    m = x2.shape[0]
    key = "int4" if fmt == "int4" else "fp8"
    if config is None:
        config = pick_config(key, n, k, m, sm_count(x.device),
                             group=group if fmt == "int4" else 128, invariant=invariant)
        if fmt == "fp8_block" and config.block_k > 128:  # (a per-channel config: a tile must not cross a block)
            config = dataclasses.replace(config, block_k=128)
    res2 = None if residual is None else residual.reshape(-1, n)
    if res2 is not None and res2.stride(-1) != 1:
        res2 = res2.contiguous()
    out2 = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out.view(-1, n)
    if m:
        code = {"int4": 0, "fp8": 1, "fp8_block": 2}[fmt]
        _triton().launch(x2, code, q, zeros, scales, group, n, bias, res2, out2, config)
    return out2.view(*x.shape[:-1], n) if out is None else out


def weight_only(x: torch.Tensor, weight, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                kernel: str = "auto") -> torch.Tensor:
    """x `[..., K]` @ Wᵀ (+ bias) (+ residual, written in place when given) for a GPU-format quantized weight
    (`Int4Weight`, `Fp8Weight`: their `kernel_args()` and `dequantize`). kernel: "bitwise" (the kernel, one config
    per shape for every row count; CUDA or the interpreter), "gemv" (`quant_gemv`, forced: 1–8 rows), "triton"
    (forced: CUDA or the interpreter; `quant_gemv` for ≤ 8 rows under SPECDEC_QUANT_KERNEL=gemv), anything
    else ("auto", "reference", the GEMM helpers' modes): the kernel on CUDA for ≤ TRITON_ROWS rows, else the
    reference — the weight dequantized to x's dtype, then F.linear (cuBLAS on CUDA, the BLAS on CPU); on CUDA
    under SPECDEC_QUANT_KERNEL=gemv, ≤ 8 rows take `quant_gemv`."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal the weight's K ({k})")
    rows = x.numel() // max(k, 1)
    invariant = kernel == "bitwise"
    choice = quant_kernel()  # (read on every call: a bad SPECDEC_QUANT_KERNEL fails here, naming itself)
    if kernel == "gemv" or (choice == "gemv" and not invariant and gemv_ok(x, rows)
                            and (x.is_cuda or kernel == "triton")):
        return gemv(x, weight, bias, residual)
    if kernel in ("triton", "bitwise"):
        if _triton() is None or not (x.is_cuda or interpreting()):
            raise ValueError(f"kernel={kernel!r} on a quantized weight needs Triton and CUDA tensors (or "
                             "TRITON_INTERPRET=1)")
        use = True
    else:
        use = x.is_cuda and triton_rows_ok(x, rows)
    if use:
        fmt, q, zeros, scales, group = weight.kernel_args()
        return run_kernel(x, fmt, q, zeros, scales, group, n, bias, residual,
                          out=residual, invariant=invariant)
    y = torch.nn.functional.linear(x, weight.dequantize().to(x.dtype), bias)
    return y if residual is None else residual.add_(y)
