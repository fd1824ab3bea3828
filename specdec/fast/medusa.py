"""Medusa heads (FasterDecoding/Medusa `medusa_model.py`; vLLM `medusa.py`) as an engine drafter.

K independent heads read the target's final-normed state f_t. Head k is `num_layers` residual blocks
x ← x + SiLU(W x + b) and its own LM head; it predicts the token k + 2 positions ahead (the target's LM head
predicts the next one). With a row of length L, the engine knows f at positions [0, L − 1) and x_{L−1} is
committed, so head k drafts x_{L+k} from f_{L−2}: a chain of up to K drafts from one feature, each drawn
from its own head's standardized law (independent of the earlier drafts — any q that depends only on the
text so far keeps speculative sampling exact). A vLLM checkpoint may carry a `token_map` (a reduced draft
vocabulary): logits are -inf outside it, so q is 0 there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["MedusaConfig", "MedusaHeads"]


@dataclass(frozen=True)
class MedusaConfig:
    """num_heads K, residual blocks per head, the target width and vocabulary it was trained for, and the rows of
    each head's LM head (draft_vocab_size, None = the target's)."""

    num_heads: int
    num_layers: int
    dim: int
    vocab_size: int
    draft_vocab_size: int | None = None


class MedusaHeads(torch.nn.Module):
    """`forward(features [B, dim]) -> logits [B, K, V]` (float32, over the target's vocabulary)."""

    def __init__(self, config: MedusaConfig, *, device="cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        c = self.config = config
        rows = c.draft_vocab_size or c.vocab_size

        def param(*size):
            return torch.nn.Parameter(torch.zeros(*size, device=device, dtype=dtype), requires_grad=False)

        self.weight = param(c.num_heads, c.num_layers, c.dim, c.dim)
        self.bias = param(c.num_heads, c.num_layers, c.dim)
        self.lm_head = param(c.num_heads, rows, c.dim)
        self.register_buffer("token_map", torch.arange(rows, device=device), persistent=False)
        self.mapped = rows != c.vocab_size

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def check_target(self, shape, name: str = "target") -> None:
        c = self.config
        if c.dim != shape.dim or c.vocab_size != shape.vocab_size:
            raise ValueError(f"{name}: the Medusa heads were trained for a target of hidden size {c.dim} and vocabulary "
                             f"{c.vocab_size}; this one has hidden size {shape.dim} and vocabulary {shape.vocab_size}")

    def set_token_map(self, token_map: torch.Tensor) -> None:
        """Target id of each draft id `[D]` (distinct, in [0, V); checked by the loader)."""
        self.token_map.copy_(token_map.to(self.token_map.device))
        self.mapped = True

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """`[B, dim]` → float32 `[B, K, V]`: every head on the same feature."""
        x = features.to(self.dtype)[:, None, :].expand(-1, self.config.num_heads, -1)  # [B, K, dim]
        for j in range(self.config.num_layers):
            x = x + F.silu(torch.einsum("bkd,ked->bke", x, self.weight[:, j]) + self.bias[:, j])
        logits = torch.einsum("bkd,kvd->bkv", x, self.lm_head).float()
        if not self.mapped:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.token_map, logits)

    def copy_to(self, device, dtype: torch.dtype) -> "MedusaHeads":
        heads = MedusaHeads(self.config, device=device, dtype=dtype)
        with torch.no_grad():
            for (_, mine), (_, theirs) in zip(self.named_parameters(), heads.named_parameters()):
                theirs.copy_(mine)
        if self.mapped:
            heads.set_token_map(self.token_map)
        return heads.eval()
