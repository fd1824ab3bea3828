"""A weight-streaming linear for few rows (decode and verify: M ≤ 16): y = x @ Wᵀ (+ bias) (+ residual).

At batch 1 a decode step is a read of every weight once; the activation rows are nearly free. cuBLAS switches
kernels between M = 1 and M = 5 (a 5-token verify then costs 1.4x a 1-token pass). Here one kernel serves
M = 1..16: each program owns `block_n` output columns and one slice of K, streams its weight tile
`[block_n, block_k]` through a software pipeline (num_stages), and multiplies it with the M rows padded to 16
(`tl.dot` on tensor cores, weights as the wide operand: "swap AB"), or, variant "fma", with plain FMAs.

Split-K (when N / block_n programs would leave SMs idle): each K slice writes an fp32 partial product
`[split_k, M, N]` and a second small kernel sums the slices in a fixed order, then adds bias and residual and
casts. Deterministic (no atomics, no memset) at the cost of one extra launch and an fp32 round trip through L2.

Configs come from a table filled from `scripts/bench_linear.py` (keyed by M bucket, N, K) with a heuristic
fallback: no autotuning at run time, so a call inside CUDA-graph capture launches exactly what a warm-up launched.
Warm up once before capture (Triton compiles on first use). Triton is imported lazily: `import specdec` works
without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.fast.kernels.select import NUM_SMS, interpreting, kernel_module, sm_count

__all__ = ["LinearConfig", "linear", "linear_reference", "pick_config", "CONFIGS", "M_BUCKETS"]


@dataclass(frozen=True)
class LinearConfig:
    """One launch shape. variant: "dot" (tensor cores, rows padded to 16) or "fma" (M ≤ 4: rows padded to a
    power of two, products summed in registers). split_k: number of K slices (1 = no reduction kernel)."""

    variant: str = "dot"
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


# Measured M buckets: an M runs with the config of the smallest bucket ≥ M.
M_BUCKETS = (1, 2, 5, 9, 16)
# (M bucket, N, K) → (variant, block_n, block_k, split_k, num_warps, num_stages); from scripts/bench_linear.py on an
# H200 (torch 2.11, Triton 3.6): one config per matrix for every M (the same kernel for decode and verify), for the
# zoo `gpu` target and the 8B Llama shapes. Other shapes take the heuristic.
CONFIGS: dict[tuple[int, int, int], tuple] = {
    (1, 3072, 1024): ('dot', 64, 256, 1, 4, 3),
    (2, 3072, 1024): ('dot', 64, 256, 1, 4, 3),
    (5, 3072, 1024): ('dot', 64, 256, 1, 4, 3),
    (9, 3072, 1024): ('dot', 64, 256, 1, 4, 3),
    (16, 3072, 1024): ('dot', 64, 256, 1, 4, 3),
    (1, 1024, 1024): ('dot', 16, 256, 1, 4, 4),
    (2, 1024, 1024): ('dot', 16, 256, 1, 4, 4),
    (5, 1024, 1024): ('dot', 16, 256, 1, 4, 4),
    (9, 1024, 1024): ('dot', 16, 256, 1, 4, 4),
    (16, 1024, 1024): ('dot', 16, 256, 1, 4, 4),
    (1, 5632, 1024): ('dot', 64, 256, 1, 4, 3),
    (2, 5632, 1024): ('dot', 64, 256, 1, 4, 3),
    (5, 5632, 1024): ('dot', 64, 256, 1, 4, 3),
    (9, 5632, 1024): ('dot', 64, 256, 1, 4, 3),
    (16, 5632, 1024): ('dot', 64, 256, 1, 4, 3),
    (1, 1024, 2816): ('dot', 32, 128, 8, 4, 4),
    (2, 1024, 2816): ('dot', 32, 128, 8, 4, 4),
    (5, 1024, 2816): ('dot', 32, 128, 8, 4, 4),
    (9, 1024, 2816): ('dot', 32, 128, 8, 4, 4),
    (16, 1024, 2816): ('dot', 32, 128, 8, 4, 4),
    (1, 8192, 1024): ('dot', 64, 256, 1, 4, 3),
    (2, 8192, 1024): ('dot', 64, 256, 1, 4, 3),
    (5, 8192, 1024): ('dot', 64, 256, 1, 4, 3),
    (9, 8192, 1024): ('dot', 64, 256, 1, 4, 3),
    (16, 8192, 1024): ('dot', 64, 256, 1, 4, 3),
    (1, 6144, 4096): ('dot', 64, 256, 2, 4, 3),
    (2, 6144, 4096): ('dot', 64, 256, 2, 4, 3),
    (5, 6144, 4096): ('dot', 64, 256, 2, 4, 3),
    (9, 6144, 4096): ('dot', 64, 256, 2, 4, 3),
    (16, 6144, 4096): ('dot', 64, 256, 2, 4, 3),
    (1, 4096, 4096): ('dot', 64, 256, 4, 4, 3),
    (2, 4096, 4096): ('dot', 64, 256, 4, 4, 3),
    (5, 4096, 4096): ('dot', 64, 256, 4, 4, 3),
    (9, 4096, 4096): ('dot', 64, 256, 4, 4, 3),
    (16, 4096, 4096): ('dot', 64, 256, 4, 4, 3),
    (1, 28672, 4096): ('dot', 128, 128, 1, 8, 3),
    (2, 28672, 4096): ('dot', 128, 128, 1, 8, 3),
    (5, 28672, 4096): ('dot', 128, 128, 1, 8, 3),
    (9, 28672, 4096): ('dot', 128, 128, 1, 8, 3),
    (16, 28672, 4096): ('dot', 128, 128, 1, 8, 3),
    (1, 4096, 14336): ('dot', 64, 256, 4, 4, 3),
    (2, 4096, 14336): ('dot', 64, 256, 4, 4, 3),
    (5, 4096, 14336): ('dot', 64, 256, 4, 4, 3),
    (9, 4096, 14336): ('dot', 64, 256, 4, 4, 3),
    (16, 4096, 14336): ('dot', 64, 256, 4, 4, 3),
    (1, 128256, 4096): ('dot', 128, 128, 1, 8, 3),
    (2, 128256, 4096): ('dot', 128, 128, 1, 8, 3),
    (5, 128256, 4096): ('dot', 128, 128, 1, 8, 3),
    (9, 128256, 4096): ('dot', 128, 128, 1, 8, 3),
    (16, 128256, 4096): ('dot', 128, 128, 1, 8, 3),
}
# (N, K) of the weights the fast model's "auto" sends through this kernel (cuBLAS for the rest; see BENCHMARKS.md):
# - the zoo target's o-proj: at least as fast as cuBLAS at every M in M_BUCKETS and 1.75x at M ≤ 5 (bench_linear.py);
# - the 8B Llama's five matrices (q|k|v, o, gate|up, down, LM head): one at a time cuBLAS matched or beat this kernel
#   on three of them, but inside the decode step (scripts/profile_decode.py, H200, batch 1, CUDA graph) this kernel
#   for all five ran the step in 4518 µs vs 4752 with cuBLAS (224.5 vs 214.4 tok/s, 80.0% vs 76.4% of the measured
#   copy bandwidth): gate|up 1776 vs 1892 µs in the step, and no split-K reduce launches (331 vs 396 kernels).
# Shapes measured on another card can be chosen there with `linear_choice` (`FastLlama.triton_linear_shapes`).
FASTER_THAN_CUBLAS: frozenset[tuple[int, int]] = frozenset({
    (1024, 1024),
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096),
})

def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     residual: torch.Tensor | None = None) -> torch.Tensor:
    """The eager definition: x `[..., K]`, weight `[N, K]`, bias `[N]`, residual `[..., N]` → `[..., N]`.

    With a residual the product is added as `addmm` does it (one rounding, as the fast model's in-place addmm_).
    """
    if residual is None:
        return F.linear(x, weight, bias)
    add = residual if bias is None else residual + bias
    out = torch.addmm(add.reshape(-1, weight.shape[0]), x.reshape(-1, weight.shape[1]), weight.t())
    return out.view(residual.shape)


def _triton():
    """The kernels' module (`_linear_triton`), or None where Triton is not installed."""
    return kernel_module("_linear_triton")


def _m_bucket(m: int) -> int:
    for bucket in M_BUCKETS:
        if m <= bucket:
            return bucket
    return M_BUCKETS[-1]


def pick_config(m: int, n: int, k: int, num_sms: int = NUM_SMS) -> LinearConfig:
    """The table's config for (M bucket, N, K), else a heuristic: the widest column block (64, 32, 16) that
    can still fill the SMs, then K split in halves until there are ≥ 2 programs per SM, keeping slices ≥ 2
    tiles deep."""
    entry = CONFIGS.get((_m_bucket(m), n, k))
    if entry is not None:
        return LinearConfig(*entry)
    block_k = 128
    max_split = max(1, k // (2 * block_k))
    for block_n in (64, 32, 16):
        if -(-n // block_n) * max_split >= num_sms:
            break
    blocks = -(-n // block_n)
    split_k = 1
    while blocks * split_k < 2 * num_sms and k // (2 * split_k) >= 2 * block_k:
        split_k *= 2
    return LinearConfig("dot", block_n, block_k, split_k, 4, 4)


def _check(x, weight, bias, residual, out):
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise TypeError("x must be a tensor [..., K]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError("weight must be a 2-D tensor [N, K]")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's K ({k})")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must equal x's {x.dtype}")
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{n}] of x's dtype, got {tuple(bias.shape)} {bias.dtype}")
    want = (*x.shape[:-1], n)
    for name, t in (("residual", residual), ("out", out)):
        if t is not None and (tuple(t.shape) != want or t.dtype != x.dtype):
            raise ValueError(f"{name} must be {list(want)} of x's dtype, got {list(t.shape)} {t.dtype}")
    if out is not None and not out.is_contiguous():
        raise ValueError("out must be contiguous")


def _triton_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Where "auto" runs the kernel: CUDA, few rows, 16-bit floats, K a multiple of 16 and K-contiguous weight
    rows (16-byte loads)."""
    rows = x.numel() // max(x.shape[-1], 1)
    return (x.is_cuda and weight.is_cuda and not interpreting() and 1 <= rows <= 16 and weight.stride(1) == 1
            and x.dtype in (torch.bfloat16, torch.float16) and x.shape[-1] % 16 == 0 and _triton() is not None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, out: torch.Tensor | None = None, kernel: str = "auto",
           config: LinearConfig | None = None, split_k: int | None = None,
           split_reduce: str = "fused") -> torch.Tensor:
    """`linear_reference`'s function: x `[..., K]` @ weight `[N, K]`ᵀ (+ bias `[N]`) (+ residual `[..., N]`).

    fp32 accumulation, output in x's dtype. out `[..., N]` (optional) receives the result and may be `residual`
    itself (each output element is read and written by the same program). kernel: "auto" (the Triton kernel
    on CUDA for ≤ 16 rows of bf16/fp16 with K % 16 == 0, else the reference), "triton" (forced; any M, also in
    Triton's interpreter on CPU tensors), "reference". config / split_k override the table (tests, benchmarks).
    split_reduce: how split-K partials are summed, "fused" (by the last slice to finish, no second launch) or
    "kernel" (a second small kernel); the same bits either way. Fused split-K launches share per-device arrival
    counters: run them on one stream at a time. No host synchronization: capturable in a CUDA graph once warm
    (the first call compiles; a first call inside a capture takes the two-kernel reduce).
    """
    if kernel not in ("auto", "triton", "reference"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'reference', got {kernel!r}")
    if split_reduce not in ("fused", "kernel"):
        raise ValueError(f"split_reduce must be 'fused' or 'kernel', got {split_reduce!r}")
    if split_k is not None and split_k < 1:
        raise ValueError(f"split_k must be ≥ 1, got {split_k}")
    if config is not None and config.variant not in ("dot", "fma"):
        raise ValueError(f"config.variant must be 'dot' or 'fma', got {config.variant!r}")
    _check(x, weight, bias, residual, out)
    use_triton = kernel == "triton" or (kernel == "auto" and _triton_supported(x, weight))
    if use_triton and _triton() is None:
        raise ValueError("kernel='triton' needs Triton installed")
    if use_triton and not (x.is_cuda or interpreting()):
        raise ValueError("kernel='triton' needs CUDA tensors or TRITON_INTERPRET=1")
    if not use_triton:
        result = linear_reference(x, weight, bias, residual=residual)
        return result if out is None else out.copy_(result)
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if config is None:
        config = pick_config(m, n, k, sm_count(x.device))
    if split_k is not None:
        config = dataclasses.replace(config, split_k=split_k)
    res2 = None if residual is None else residual.reshape(-1, n)
    if res2 is not None and res2.stride(1) != 1:
        res2 = res2.contiguous()
    if x2.stride(1) != 1 and x2.stride(0) != 1:
        x2 = x2.contiguous()
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    out2 = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out.view(-1, n)
    if m > 0:
        _triton().launch(x2, weight if weight.stride(1) == 1 else weight.contiguous(), bias, res2, out2, config,
                         split_reduce)
    return out2.view(*lead, n) if out is None else out
