"""Tree passes on the fast model: `models.tree_lm.TreeCausalLM`'s interface (begin, forward, begin_tree /
forward_tree / commit_path, select_rows) over a `FastLlama` and its per-row static cache, so the loop's speculative
beam search (`search.beam.BeamSearch`) runs on the engine's model and kernels; the engine's beam groups run it on
w slots of their slot caches (`engine/beam_slots.SlotTreeLM`, a subclass).

A tree phase appends nodes at each row's own slots from `base` (its length when the phase began): node t in slot
base + t, at position base + depth(t) (depth 0 = a child of the committed text), attending to the committed text and
its own ancestors (`TreeNodes` with per-row depths and ancestor bits; at most 64 nodes per phase). `commit_path`
keeps a path of nodes as committed text by copying their K/V entries into slots base, base + 1, … (a gather along
the slot axis of every layer), so the cache stays contiguous per row and every rollback is a length move.
"""

from __future__ import annotations

import torch

from specdec.fast.cache import KVCache, TreeNodes
from specdec.fast.kernels.attention import MAX_TREE_SLOTS
from specdec.fast.model import FastLlama
from specdec.sequences import TokenBuffer

__all__ = ["FastTreeLM", "tree_ancestry"]


class FastTreeLM:
    """`TreeCausalLM`'s interface on a `FastLlama` (see the module doc)."""

    def __init__(self, model: FastLlama):
        self.model = model
        self.vocab_size = model.shape.vocab_size
        self.device = model.device
        self.cache: KVCache | None = None
        self.begin_forward_passes = 0
        self._base: torch.Tensor | None = None  # [B] lengths when the tree phase began; None = not in one
        self._depths = self._bits = None  # [B, T] each node's depth and ancestor bits

    @property
    def lengths(self) -> torch.Tensor:
        return self.cache.lengths

    @property
    def in_tree(self) -> bool:
        return self._base is not None

    @property
    def num_nodes(self) -> int:
        """T: nodes appended in this tree phase."""
        return 0 if self._depths is None else self._depths.shape[1]

    @torch.inference_mode()
    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Start a batch: the committed text is the prompts; prefill all but each prompt's last token."""
        longest = max(len(p) for p in prompts)
        context = self.model.shape.context
        if context is not None and longest + max_new_tokens > context:
            raise ValueError(f"prompt length {longest} + max_new_tokens {max_new_tokens} exceeds the model's context "
                             f"of {context} tokens")
        buffer = TokenBuffer(prompts, capacity=longest + max_new_tokens + 1, device=self.device)
        self.cache = self.model.new_cache(len(prompts), longest + max_new_tokens + MAX_TREE_SLOTS + 1)
        self.model.rope_tables(self.cache.keys[0].shape[2])
        self._base = self._depths = self._bits = None
        self.begin_forward_passes = int(longest > 1)
        if longest > 1:
            block, valid = buffer.tail(longest, buffer.lengths)  # prompts right-aligned (left padding)
            self.model(block[:, :-1], self.cache, valid[:, :-1])
        return buffer

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append `tokens [B, k]` as committed text (False in `valid` = padding) → logits `[B, k, V]`."""
        if self.in_tree:
            raise RuntimeError("forward inside a tree phase: call commit_path first")
        return self.model(tokens, self.cache, valid)

    def begin_tree(self) -> None:
        """Start a tree phase at the current end of every row."""
        batch = self.cache.lengths.shape[0]
        self._base = self.cache.lengths.clone()
        self._depths = torch.zeros(batch, 0, dtype=torch.long, device=self.device)
        self._bits = torch.zeros(batch, 0, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Append nodes `tokens [B, k]` under `parents [B, k]` (−1 = a child of the committed text, else an earlier
        node of this phase, possibly of this call) → logits `[B, k, V]`."""
        if not self.in_tree:
            raise RuntimeError("forward_tree needs begin_tree() first")
        batch, k = tokens.shape
        first = self.num_nodes
        if first + k > MAX_TREE_SLOTS:
            raise ValueError(f"a tree phase holds at most {MAX_TREE_SLOTS} nodes per row, got {first + k}")
        depth, bits = tree_ancestry(parents, self._depths, self._bits)
        depths, bits = torch.cat([self._depths, depth], 1), torch.cat([self._bits, bits], 1)
        self._depths, self._bits = depths, bits
        return self.model(tokens, self.cache, tree=TreeNodes(first, depths[:, first:], bits[:, first:]))

    @torch.inference_mode()
    def commit_path(self, keep: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """End the tree phase keeping, per row, the nodes marked in `keep [B', T]` (a path from a child of the
        committed text downwards) as committed text; `rows [B']` first re-gathers rows (row i continues rows[i])."""
        if not self.in_tree:
            raise RuntimeError("commit_path needs begin_tree() first")
        if rows is not None:
            self.select_rows(rows)
        total = self.num_nodes
        index = torch.arange(total, device=self.device)[None, :]
        order = torch.where(keep, index, total + index).argsort(1)  # kept nodes first, in node (= path) order
        kept = keep.long().sum(1)
        src = self._base[:, None] + torch.where(index < kept[:, None], order, index)
        self._move_slots(src, self._base[:, None] + index)
        self.cache.lengths.copy_(self._base + kept)
        self._base = self._depths = self._bits = None

    def _move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per row, the K/V entries of slots `src [B, T]` into slots `dst [B, T]`, in every layer (all read first)."""
        for tensor in self.cache.keys + self.cache.values:  # [B, H_kv, S, D]
            b, heads, _, dim = tensor.shape
            shape = (b, heads, src.shape[1], dim)
            moved = tensor.gather(2, src[:, None, :, None].expand(shape))
            tensor.scatter_(2, dst[:, None, :, None].expand(shape), moved)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows `index` (in that order; a row may repeat)."""
        self.cache = self.cache.select_rows(index)
        if self.in_tree:
            self._base, self._depths, self._bits = self._base[index], self._depths[index], self._bits[index]

    def crop(self, lengths: torch.Tensor) -> None:
        """Roll back to absolute per-row lengths."""
        if self.in_tree:
            raise RuntimeError("crop inside a tree phase: call commit_path first")
        self.cache.lengths.copy_(lengths)


def tree_ancestry(parents: torch.Tensor, depths: torch.Tensor, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depths and ancestor bits `[B, k]` of k new nodes `first..first + k − 1` under `parents [B, k]` (−1 = a child
    of the committed text, < first = an earlier node whose `depths` / `bits [B, first]` are known, ≥ first = a node
    of this call). A node's value combines (OR, sum) its own with those up its chain of parents inside the call,
    whose last one hangs under an earlier node or the text: pointer jumping, ⌈log2 k⌉ rounds of gathers for all
    nodes at once rather than a step per node. Bit t of node t's own bits: bit 63 wraps to the sign bit, as the
    kernels read it."""
    batch, k = parents.shape
    first, device = depths.shape[1], parents.device
    own = torch.bitwise_left_shift(torch.ones(k, dtype=torch.long, device=device),
                                   first + torch.arange(k, device=device))[None, :].expand(batch, k)
    inside = parents >= first
    if first:
        earlier = (parents >= 0) & ~inside
        at = parents.clamp(0, first - 1)
        own = own | torch.where(earlier, bits.gather(1, at), 0)
        depth = torch.where(inside, 1, torch.where(earlier, depths.gather(1, at) + 1, 0))
    else:
        depth = inside.long()
    link = torch.where(inside, parents - first, -1)
    for _ in range((k - 1).bit_length()):
        on = link >= 0
        at = link.clamp_min(0)
        own = torch.where(on, own | own.gather(1, at), own)
        depth = torch.where(on, depth + depth.gather(1, at), depth)
        link = torch.where(on, link.gather(1, at), -1)
    return depth, own
