"""Attention of k new tokens per row over a static slot cache.

Terms (as in `specdec.fast.model`): row b's token at position t lives in slot t of `keys/values [B, H_kv, S, D]`;
slot S−1 is the junk slot (never attended to). Query i of row b sits at `positions[b, i]` and sees slots
j <= positions[b, i] (j < S−1). Query heads are grouped over KV heads: head h reads KV head h // (H / H_kv).

Two implementations of one function: `slot_attention_reference` (eager SDPA with an additive mask: reads every
slot, and SDPA picks a different kernel for k = 1 than for k > 1) and the Triton split-K kernel in
`triton_attention` (reads only each row's live slots, one kernel for k = 1..32). `slot_attention(kernel=...)`
chooses; "auto" takes the kernel on CUDA where triton imports and the shape is supported.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

__all__ = ["slot_attention", "slot_attention_reference", "slot_attention_bias", "triton_unsupported"]


def slot_attention_bias(positions: torch.Tensor, num_slots: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """The reference's additive mask: positions `[B, k]` → `[B, 1, group·k, S]` (0 where query row r may read slot
    j: j <= its position and j is not the junk slot S − 1; −inf elsewhere). It depends on the positions and the
    span only, so a forward builds it once for all its layers (`slot_attention_reference(bias=...)`)."""
    batch, k = positions.shape
    j = torch.arange(num_slots, device=positions.device)
    allowed = (j[None, None, :] <= positions[:, :, None]) & (j < num_slots - 1)  # [B, k, S]
    bias = torch.zeros(allowed.shape, device=positions.device, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return bias[:, None, None].expand(batch, 1, group, k, num_slots).reshape(batch, 1, group * k, num_slots)


def slot_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                             scale: float | None = None, *, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The eager definition: q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, positions `[B, k]` → `[B, k, H, D]`.

    One SDPA call over the whole cache with an additive mask (`slot_attention_bias`; pass `bias` when it is
    already built for these positions and this span); the query heads that share a KV head are folded into
    the query length (plain MHA over H_kv heads).
    """
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    if bias is None:
        bias = slot_attention_bias(positions, num_slots, group, q.dtype)
    q = q.reshape(batch, k, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * k, dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)
    return out.view(batch, kv_heads, group, k, dim).permute(0, 3, 1, 2, 4).reshape(batch, k, heads, dim)


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_TRITON_K = 32  # longer query blocks (prefill chunks) take the reference under kernel="auto"


@functools.cache
def _triton_module():
    """The Triton kernels' module, or None where triton does not import (imported on first use, so that
    TRITON_INTERPRET set before it takes effect)."""
    try:
        from specdec.fast.kernels import triton_attention
    except ImportError:
        return None
    return triton_attention


def triton_unsupported(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       positions: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot run these arguments (None when it can)."""
    dim = q.shape[-1]
    if q.dtype not in _TRITON_DTYPES or keys.dtype != q.dtype or values.dtype != q.dtype:
        return f"q, keys and values must share one of {_TRITON_DTYPES}, got {q.dtype}, {keys.dtype}, {values.dtype}"
    if dim < 16 or dim > 256 or dim & (dim - 1):
        return f"head dim must be a power of two in [16, 256], got {dim}"
    interpreting = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
    if not (q.is_cuda or interpreting):
        return "needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
    if positions.dtype not in (torch.int32, torch.int64):
        return f"positions must be int32 or int64, got {positions.dtype}"
    return None


def slot_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                   scale: float | None = None, *, kernel: str = "auto", num_splits: int | None = None) -> torch.Tensor:
    """`slot_attention_reference`'s function. kernel: "auto" (the fused kernel where one runs), "triton", "reference".

    "auto" takes the Triton split-K kernel for CUDA tensors of a supported shape with k <= 32 when triton
    imports, else the reference; "triton" insists (ValueError where it cannot run). num_splits overrides the
    kernel's split count (tests); None picks it from shapes.
    """
    if kernel not in ("auto", "triton", "reference"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'reference', got {kernel!r}")
    batch, k, heads, dim = q.shape
    if kernel == "reference" or (kernel == "auto" and (not q.is_cuda or k > MAX_TRITON_K)):
        return slot_attention_reference(q, keys, values, positions, scale)
    if keys.shape[0] != batch or keys.shape[-1] != dim or heads % keys.shape[1] or values.shape != keys.shape:
        raise ValueError(f"keys/values must be [B, H_kv, S, D] with H % H_kv == 0 for q {tuple(q.shape)}, "
                         f"got {tuple(keys.shape)} and {tuple(values.shape)}")
    if positions.shape != (batch, k):
        raise ValueError(f"positions must be [B, k] = {(batch, k)}, got {tuple(positions.shape)}")
    module = _triton_module()
    why = "triton does not import" if module is None else triton_unsupported(q, keys, values, positions)
    if why is not None:
        if kernel == "auto":
            return slot_attention_reference(q, keys, values, positions, scale)
        raise ValueError(f"kernel='triton': {why}")
    return module.attention(q, keys, values, positions, scale, num_splits=num_splits)
