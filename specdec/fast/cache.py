"""The fast model's per-row static KV cache (see `specdec.fast.model` for slots, lengths and the junk slot)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache", "round_up"]


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
