"""Dense float32 matrices given 8-bit block copies for `q8_cpu.cpp`: the feature head's products on the quantized
CPU path (its fc and one layer's linears, dense oneDNN products otherwise: most of a speculative step's CPU time
besides the target's forwards, docs/benchmarks/quantized_cpu.md).

    q8_blocks(w)   w `[N, K]` → `QuantWeight` bits 8, group 32, no offset: per group of 32 along K,
                   scale = max|w| / 127, q = round(w / scale) ∈ −127..127 (Q8_0's rounding; a zero group: scale 0)
    attach / detach   put / remove those copies as the `ATTRIBUTE` of the parameters themselves: the dense tensors
                   stay (saving, copying and a dense target still read them); `FastLlama`'s GEMM helpers take the
                   quantized kernel wherever the attribute is set.

The copies change the head's outputs by the rounding of its weights (≤ scale / 2 a weight) and its activations to 8
bits — the drafts, never the verified tokens: the target's verify decides every token, so greedy speculative text
stays the target's plain text.
"""

from __future__ import annotations

import torch

from specdec.fast.quant.weight import ATTRIBUTE, QuantWeight, quantized

__all__ = ["q8_blocks", "attach", "detach", "SOURCE"]

SOURCE = "Q8_0 (from float32)"


def q8_blocks(weight: torch.Tensor) -> QuantWeight:
    """A float `[N, K]` matrix (K a multiple of 32) → its 8-bit block copy (the module doc)."""
    if weight.dim() != 2 or weight.shape[1] % 32:
        raise ValueError(f"q8_blocks: a [N, K] matrix with K a multiple of 32, got {tuple(weight.shape)}")
    n, k = weight.shape
    w = weight.detach().float().cpu().reshape(n, k // 32, 32)
    scale = w.abs().amax(-1) / 127.0
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(w * inv[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return QuantWeight(q.contiguous(), scale.contiguous(), None, 8, 32, (n, k), SOURCE)


def attach(params) -> int:
    """Give each float32 CPU matrix of `params` (K a multiple of 32, not already quantized) its 8-bit copy; returns
    how many were given one."""
    count = 0
    for p in params:
        if p.dim() == 2 and p.shape[1] % 32 == 0 and p.dtype == torch.float32 and p.device.type == "cpu" and \
                not p.is_meta and quantized(p) is None:
            setattr(p, ATTRIBUTE, q8_blocks(p))
            count += 1
    return count


def detach(params) -> None:
    """Remove the copies `attach` gave (other quantized weights — a GGUF's — are left as they are)."""
    for p in params:
        q = quantized(p)
        if isinstance(q, QuantWeight) and q.source == SOURCE:
            delattr(p, ATTRIBUTE)
