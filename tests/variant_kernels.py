"""Kernels that are NOT batch-invariant by construction: the negative controls of the bitwise tests.

A control must fail on every host. The host's own kernels (MKL's or oneDNN's GEMM, SDPA) change a row's bits with
the number of rows on some CPUs and keep them on others (an AVX-512/AMX Xeon kept them for the tiny shapes of these
tests), so a control that relied on them passed or failed with the machine. These compute the product exactly
(float64 accumulation of fp32 values, rounded once: the same bits on every host) and then move the result one ulp
up when the call holds more than one row — a kernel whose last bit depends on its company, deliberately.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def nudged(out: torch.Tensor, nudge: bool) -> torch.Tensor:
    """`out` moved one ulp towards +inf when `nudge` (the row-count-dependent part)."""
    return torch.nextafter(out, torch.full_like(out, float("inf"))) if nudge else out


def row_count_dependent_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[..., K]` @ weight `[N, K]`ᵀ (+ bias) whose bits depend on how many rows the call holds."""
    rows = x.reshape(-1, x.shape[-1]).shape[0]
    out = F.linear(x.double(), weight.double(), None if bias is None else bias.double()).to(x.dtype)
    return nudged(out, rows > 1)


def row_count_dependent_add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual += x @ weightᵀ in place, through `row_count_dependent_linear` (`cpu_linear.add_linear_`'s shape)."""
    return residual.add_(row_count_dependent_linear(x, weight).reshape(residual.shape))


def patch_cpu_gemms(monkeypatch) -> None:
    """Route `FastLlama`'s default CPU GEMMs (`fast.kernels.cpu_linear`) through the row-count-dependent product."""
    from specdec.fast.kernels import cpu_linear

    monkeypatch.setattr(cpu_linear, "linear", row_count_dependent_linear)
    monkeypatch.setattr(cpu_linear, "add_linear_", row_count_dependent_add_linear_)
