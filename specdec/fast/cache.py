"""The fast model's per-row static KV cache (see `specdec.fast.model` for slots, lengths and the junk slot)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.fast.kernels.attention import TreeMask

__all__ = ["KVCache", "TreeNodes", "round_up"]


@dataclass
class KVCache:
    """keys/values: one `[B, H_kv, S, D]` tensor per layer (slot S−1 is the junk slot); lengths `[B]`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @property
    def num_slots(self) -> int:
        """Usable slots (the junk slot excluded)."""
        return self.keys[0].shape[2] - 1

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def select_rows(self, index: torch.Tensor) -> "KVCache":
        return KVCache(
            [k.index_select(0, index) for k in self.keys],
            [v.index_select(0, index) for v in self.values],
            self.lengths.index_select(0, index),
        )


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class TreeNodes:
    """k nodes of a token tree fed by one forward (`FastLlama.forward(tree=...)`). Node t of the tree lives in slot
    root + t of each row, root = cache.lengths − first, so the call writes nodes first..first + k − 1 at the row's
    usual slots lengths..lengths + k − 1; node t sits at position root + depth(t) and attends to the text below
    root and to its own path (`kernels.attention.TreeMask`).

    depths     [k] long: the fed nodes' depths (0 = the root); or `[B, k]`, each row its own tree
    ancestors  [k] int64: bit t set when node t is the fed node or one of its ancestors; or `[B, k]`
    """

    first: int
    depths: torch.Tensor
    ancestors: torch.Tensor

    def place(self, lengths: torch.Tensor, junk: int) -> tuple[torch.Tensor, torch.Tensor, TreeMask]:
        """→ positions `[B, k]` (RoPE), slots `[B, k]` (where K/V go; the attention bound), the `TreeMask`."""
        k, batch = self.depths.shape[-1], lengths.shape[0]
        root = lengths - self.first
        slots = (lengths[:, None] + torch.arange(k, device=lengths.device)[None, :]).clamp(max=junk)
        positions = root[:, None] + self.depths.expand(batch, k)
        return positions, slots, TreeMask(root, self.ancestors.expand(batch, k))
