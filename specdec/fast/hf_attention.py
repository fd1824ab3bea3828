"""What the transformers backend's attention adds to the engine's: ALiBi biases (and attention sinks with them).

The fast bodies never pass an ALiBi bias, so the engine's kernels (`kernels.attention`: SDPA with a positional mask,
the Triton split-K kernel) do not take one; they do take attention sinks alone (`slot_attention(sinks=...)`).
`extras_attention` is the eager definition with both, over a row's slots gathered from the cache
(`fast.cache.KVCache.layer` / `PagedKVCache.layer`: every layout, every device — on CUDA too, where the backend
routes a layer with a bias here instead of the Triton kernel):

    logits[b, h, i, j] = scale · q[b, i, h] · k[b, j, h // G]  (then c·tanh(·/c) with a softcap c)
                         + alibi[h, j]        (an ALiBi bias by the absolute position of slot j's key, scaled)
                         + mask[b, i, j]      (0 / −inf: `slot_attention_bias`'s positions, window, tree, junk slot)
    p = softmax over j of logits, with sinks[h] as one more logit in the denominator (gpt-oss) that no value reads
    out[b, i, h] = Σ_j p[b, h, i, j] · v[b, j, h // G]

The softmax runs in float32, as the families' own eager attention does.
"""

from __future__ import annotations

import torch

__all__ = ["extras_attention"]


def extras_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     scale: float | None, *, softcap: float | None = None, alibi: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, mask `[B, 1, k, S]` additive (`slot_attention_bias(...,
    group=1)`), alibi `[H, S]` (or `[B, H, S]`: a token tree's slots, by each row's key positions) or None, sinks `[H]` or None → `[B, k, H, D]` (see the module doc)."""
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    if mask.shape != (batch, 1, k, num_slots):
        raise ValueError(f"mask must be [B, 1, k, S] = {[batch, 1, k, num_slots]}, got {list(mask.shape)}")
    if alibi is not None and alibi.shape[-2:] != (heads, num_slots) or alibi is not None and alibi.dim() == 3 and \
            alibi.shape[0] != batch or alibi is not None and alibi.dim() not in (2, 3):
        raise ValueError(f"alibi must be [H, S] = {[heads, num_slots]} or [B, H, S], got {list(alibi.shape)}")
    if sinks is not None and sinks.shape != (heads,):
        raise ValueError(f"sinks must be [H] = [{heads}], got {list(sinks.shape)}")
    group = heads // kv_heads
    if group > 1:  # query head h reads KV head h // group
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * (dim ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float()
    if alibi is not None:
        scores = scores + (alibi.float()[None] if alibi.dim() == 2 else alibi.float())[:, :, None, :]
    scores = scores + mask.float()
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float()[None, :, None, None].expand(batch, heads, k, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs.to(values.dtype), values)  # [B, H, k, D]
    return out.transpose(1, 2)
