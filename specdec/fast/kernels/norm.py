"""RMSNorm, optionally fused with the residual add before it (one launch, one read of the row).

  rms_norm(x, w, eps)                 h = x / sqrt(mean(x²) + eps) · w
  add_rms_norm(x, delta, w, eps)      x += delta (in place), then h = rms_norm(x)  → (x, h)

x `[..., dim]` with contiguous rows; delta the same shape as x, or `[dim]` (a bias added to every row).
Math in float32 inside; x (after the add) and h are stored in x's dtype, matching `F.rms_norm` on the eager
path within one rounding of that dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec.fast.kernels.select import next_power_of_2, use_triton

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_reference", "add_rms_norm_reference"]

MAX_DIM = 1 << 16  # one row per program, held in registers


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The eager definition: `F.rms_norm` over the last dimension."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager definition: `x += delta` in place, then `rms_norm_reference(x)`."""
    x.add_(delta)
    return x, rms_norm_reference(x, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, kernel: str = "auto") -> torch.Tensor:
    """`rms_norm_reference`'s function → `[..., dim]` in x's dtype. kernel: "auto", "triton", "reference"."""
    if not use_triton(kernel, x.device, _supported(x, weight), "rms_norm"):
        return rms_norm_reference(x, weight, eps)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    _launch(rows, None, weight, out, eps)
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 kernel: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm_reference`'s function: x updated in place, h `[..., dim]`. kernel as in `rms_norm`."""
    dim = x.shape[-1]
    if delta.shape != x.shape and delta.shape != (dim,):
        raise ValueError(f"delta must have x's shape {tuple(x.shape)} or ({dim},), got {tuple(delta.shape)}")
    supported = _supported(x, weight) and _rows(x) is not None and delta.stride(-1) == 1
    if not use_triton(kernel, x.device, supported, "add_rms_norm"):
        return add_rms_norm_reference(x, delta, weight, eps)
    rows = _rows(x)
    deltas = delta.reshape(-1, dim) if delta.dim() > 1 else delta.view(1, dim).expand(rows.shape[0], dim)
    out = torch.empty_like(rows)
    _launch(rows, deltas, weight, out, eps)
    return x, out.view(x.shape)


def _supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.shape[-1] <= MAX_DIM and weight.shape == (x.shape[-1],) and weight.is_contiguous() and x.numel() > 0


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as `[N, dim]` rows sharing its storage (what an in-place add needs), or None."""
    if x.stride(-1) != 1:
        return None
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return None


def _launch(rows: torch.Tensor, deltas: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor,
            eps: float) -> None:
    n, dim = rows.shape
    block = next_power_of_2(dim)
    warps = 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16
    add = deltas is not None
    _kernel()[(n,)](
        rows, deltas if add else rows, weight, out,
        rows.stride(0), deltas.stride(0) if add else 0, out.stride(0), dim, float(eps),
        BLOCK=block, ADD=add, num_warps=warps,
    )


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, stride_x, stride_delta, stride_out, dim, eps,
                            BLOCK: tl.constexpr, ADD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if ADD:  # x += delta, rounded to x's dtype as the in-place add stores it
            delta = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + delta.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + row * stride_x + cols, x, mask=mask)
        xf = x.to(tl.float32)
        inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / dim + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (xf * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)

    return add_rms_norm_kernel
