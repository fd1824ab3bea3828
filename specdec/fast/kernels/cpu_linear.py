"""CPU fp32 products of a few rows (a verify pass of γ + 1 tokens at batch 1) with the weight as the long side.

y = x @ Wᵀ for x `[M, K]`, W `[N, K]`. MKL runs `F.linear` (x @ Wᵀ: the weight is the transposed operand) for 2–6 rows
at about twice the time of a one-row pass over SmolLM2-135M's matrices on the 2-core machine here, while the same
product written W @ xᵀ (the rows become the short side N of the GEMM, and the weight streams once, as in a GEMV) costs
1.0–1.35x of it (BENCHMARKS.md, `scripts/smol_cpu_gemm.py`). A verify pass reads every weight once either way; this
is what makes it cost about one plain step instead of two.

`FastLlama` uses it on the CPU for fp32 inputs of 2..`FEW_ROWS` rows (its "reference" GEMMs; bitwise mode keeps its
own invariant kernel); every other shape keeps `F.linear` / `addmm`. The result is the same product summed in
another order: equal to `F.linear`'s to fp32 rounding, not bit for bit (as the 1-row and k-row `F.linear` paths
already differ from each other).
"""

from __future__ import annotations

import torch

__all__ = ["FEW_ROWS", "weight_major", "linear_weight_major", "add_linear_weight_major_"]

FEW_ROWS = 6  # rows up to which the weight-major product is used (0: never); 8 rows measured no faster than F.linear


def weight_major(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x [..., K] @ weight [N, K]ᵀ` takes the weight-major product: CPU, fp32, 2..FEW_ROWS rows."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.shape[-1] == 0:
        return False
    rows = x.numel() // x.shape[-1]
    return 2 <= rows <= FEW_ROWS


def linear_weight_major(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[..., K]` @ weight `[N, K]`ᵀ (+ bias `[N]`) → `[..., N]`, computed as (weight @ xᵀ)ᵀ."""
    out = torch.mm(weight, x.reshape(-1, weight.shape[1]).t()).t().contiguous()  # (row-major, as F.linear's:
    if bias is not None:  # the fused kernels downstream need a unit stride; ≤ FEW_ROWS rows, a small copy)
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def add_linear_weight_major_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual `[..., N]` += x `[..., K]` @ weight `[N, K]`ᵀ in place; returns residual."""
    product = torch.mm(weight, x.reshape(-1, weight.shape[1]).t()).t()
    return residual.add_(product.reshape(residual.shape))
