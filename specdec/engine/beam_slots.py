"""A beam group's rows in the engine's slot caches: `fast.tree_lm.FastTreeLM`'s interface (begin, forward,
begin_tree / forward_tree / commit_path, select_rows) over w consecutive slots of a `SlotCache`, written in place.

The loop's speculative beam search (`search.beam.BeamSearch`) drives it unchanged: row j = running beam j = slot
start + j. `begin` prefills the prompt into the first slot and forks it (copies that slot's K/V prefix into the other
w − 1, as `SlotCache.move` does); `select_rows` re-gathers beams from their roots in place (a beam forked from
beam i takes a copy of slot start + i); `commit_path` (inherited; one gather for every layer) copies the accepted
path's K/V into chain order, so every row stays a contiguous text and a rollback stays a length move. Over the paged
pool (`blocks`: `beam_blocks.BeamBlocks`) the fork shares the prompt's blocks, `select_rows` is a table edit (the
target's LM makes it for every model) and each write first makes the row's blocks its own (copy-on-write).
"""

from __future__ import annotations

import torch

from specdec.engine.beam_blocks import BeamBlocks
from specdec.engine.config import positions_bucket
from specdec.engine.slots import SlotCache
from specdec.fast.cache import KVCache
from specdec.fast.model import FastLlama
from specdec.fast.tree_lm import FastTreeLM
from specdec.sequences import TokenBuffer

__all__ = ["SlotTreeLM"]


class SlotTreeLM(FastTreeLM):
    """`FastTreeLM` over slots `start .. start + width − 1` of `slots` (see the module doc).

    need: the positions the group's longest row may reach (prompt + max_new_tokens + the largest tree + the junk
    slot); the view covers that positions bucket of the cache (its last position is the junk slot)."""

    def __init__(self, model: FastLlama, slots: SlotCache, start: int, width: int, need: int, chunk: int,
                 blocks: BeamBlocks | None = None, owner: bool = True):
        super().__init__(model)
        if need > slots.num_positions:
            raise ValueError(f"a beam group needs {need} positions per slot; the engine's cache has {slots.num_positions}")
        self.slots, self.start, self.width, self.chunk = slots, start, width, chunk
        self.positions = positions = positions_bucket(need, slots.num_positions)
        self.cache = slots.view(slice(start, start + width), positions)
        # paged: the group's rows of the pool (`beam_blocks.BeamBlocks`); the owner (the target's) edits the table
        self.blocks, self.owner = blocks, owner
        if blocks is None:  # the same slots as two [L, w, H_kv, S, D] views: one operator for all layers
            self._keys = slots.keys[:, start : start + width, :, :positions]
            self._values = slots.values[:, start : start + width, :, :positions]

    def _writes(self, k: int) -> None:
        """Paged: every row may write its next k positions (held, unshared) before a forward."""
        if self.blocks is not None:
            lengths = self.cache.lengths.tolist()
            self.blocks.ensure(lengths, [n + k for n in lengths])

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        self._writes(tokens.shape[1])
        return super().forward(tokens, valid)

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        self._writes(tokens.shape[1])
        return super().forward_tree(tokens, parents)

    @torch.inference_mode()
    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Prefill all but the last token of the (one) prompt into the first slot in chunks, then fork it into the
        others: `prompts` are the w copies `BeamSearch.start` passes."""
        prompt = prompts[0]
        if len(prompts) != self.width or any(p != prompt for p in prompts):
            raise ValueError("a beam group holds w copies of one prompt")
        buffer = TokenBuffer(prompts, capacity=len(prompt) + max_new_tokens + 1, device=self.device)
        self._base = self._depths = self._bits = None
        cache, n = self.cache, len(prompt) - 1
        cache.lengths.zero_()
        if self.blocks is None:
            first = KVCache([k[:1] for k in cache.keys], [v[:1] for v in cache.values], cache.lengths[:1])
        else:  # (the first row's own blocks; the other rows share them from the first write on: the fork)
            self.blocks.prefill_row(n)
            first = self.slots.view(slice(self.start, self.start + 1), self.positions)
        ids = torch.tensor([prompt[:-1]], dtype=torch.long, device=self.device)
        for at in range(0, n, self.chunk):
            self.model(ids[:, at : at + self.chunk], first)
        self.begin_forward_passes = -(-n // self.chunk)
        if self.blocks is None:
            for tensor in cache.keys + cache.values:  # [w, H_kv, S, D]: the fork
                tensor[1:, :, :n].copy_(tensor[:1, :, :n].expand(self.width - 1, -1, -1, -1))
        cache.lengths.fill_(n)
        return buffer

    def select_rows(self, index: torch.Tensor) -> None:
        """Row i continues row index[i] (a row may repeat): its K/V are copied into slot start + i, in place."""
        if index.shape[0] != self.width:
            raise ValueError(f"a beam group keeps its {self.width} rows, got {index.shape[0]}")
        if self.blocks is None:
            for tensor in (self._keys, self._values):
                tensor.copy_(tensor.index_select(1, index))
        elif self.owner:  # paged: a table edit, once for every model (a draft model's K/V moved with its blocks)
            self.blocks.reorder(index.tolist())
        self.cache.lengths.copy_(self.cache.lengths.index_select(0, index))
        if self.in_tree:
            self._base, self._depths, self._bits = self._base[index], self._depths[index], self._bits[index]

    def _move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`FastTreeLM.commit_path`'s copy of slots `src [w, T]` into `dst [w, T]`, every layer in one gather
        (paged: through the table, after the rows' written blocks are their own)."""
        if self.blocks is not None:
            if dst.shape[1] == 0:
                return
            self.blocks.ensure(dst[:, 0].tolist(), (dst[:, -1] + 1).tolist())
            self.slots.copy_positions(slice(self.start, self.start + self.width), self.positions, src, dst)
            return
        layers, _, heads, _, dim = self._keys.shape
        shape = (layers, self.width, heads, src.shape[1], dim)
        src, dst = (i[None, :, None, :, None].expand(shape) for i in (src, dst))
        for tensor in (self._keys, self._values):
            tensor.scatter_(3, dst, tensor.gather(3, src))
