"""SwiGLU's elementwise half: silu(gate) · up over the fused gate|up projection.

  gate_up `[..., 2·I]` (gate columns first, then up; rows with unit column stride) → `[..., I]` in its dtype.
Math in float32 inside (one rounding), the eager path rounds after silu and after the product.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec.fast.kernels.select import use_triton

__all__ = ["silu_mul", "silu_mul_reference"]

BLOCK = 1024


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """The eager definition: `gate, up = gate_up.chunk(2, -1); silu(gate) * up`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor, *, kernel: str = "auto") -> torch.Tensor:
    """`silu_mul_reference`'s function in one launch. kernel: "auto", "triton", "reference"."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension must be even (gate|up), got {gate_up.shape[-1]}")
    inter = gate_up.shape[-1] // 2
    supported = gate_up.stride(-1) == 1 and gate_up.numel() > 0
    if not use_triton(kernel, gate_up.device, supported, "silu_mul"):
        return silu_mul_reference(gate_up)
    rows = gate_up.reshape(-1, 2 * inter)
    out = torch.empty(rows.shape[0], inter, device=gate_up.device, dtype=gate_up.dtype)
    block = min(BLOCK, 1 << max(0, inter - 1).bit_length())
    _kernel()[(rows.shape[0], _cdiv(inter, block))](
        rows, out, rows.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4 if block >= 512 else 1,
    )
    return out.view(*gate_up.shape[:-1], inter)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    return silu_mul_kernel
