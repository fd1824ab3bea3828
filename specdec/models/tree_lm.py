"""Tree passes on a transformers causal LM: score many candidate continuations of each row in one forward.

`TreeCausalLM` is `HFCausalLM` plus a *tree phase*. In a tree phase, new slots are appended as nodes: each
node names its parent (an earlier node of the phase, or −1 = the row's committed text) and attends only to
the committed text and its own ancestors, through a custom 4D attention mask (transformers passes an
already-built `[B, 1, q, kv]` mask through unchanged); its position id is `length + depth`. Nodes are NOT
committed text: their slots are masked out of later passes until `commit_path` says which ones to keep.

Rollback keeps only the accepted path, without copying KV: the path's slots become valid slots of the row's
text (their keys were computed at the right positions and with the right ancestors, i.e. exactly as if the
path had been fed as a chain), every other node slot becomes a hole, as `HFCausalLM` already uses for rows
that accept fewer drafts than others; `crop` trims trailing holes and `compact()` removes the rest once more
than `compact_after_holes` slots are holes. Rows can be re-gathered first (`rows=`), which beam search uses
to let one row's tree seed several new rows.
"""

from __future__ import annotations

import torch

from specdec.models.hf import HFCausalLM


class TreeCausalLM(HFCausalLM):
    """`HFCausalLM` with `begin_tree` / `forward_tree` / `commit_path` (see the module docstring)."""

    def reset(self, batch_size: int) -> None:
        super().reset(batch_size)
        self._tree_start: int | None = None

    @property
    def in_tree(self) -> bool:
        return self._tree_start is not None

    def begin_tree(self) -> None:
        """Start a tree phase at the current end of the cache."""
        batch = self.lengths.shape[0]
        self._tree_start = self.num_slots
        self._ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=self.device)  # [B, T, T]
        self._depths = torch.zeros(batch, 0, dtype=torch.long, device=self.device)  # [B, T]

    @property
    def num_nodes(self) -> int:
        """T: nodes appended in this tree phase."""
        return self._depths.shape[1]

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Append nodes `tokens [B, k]` under `parents [B, k]` → logits `[B, k, V]`.

        parents[b, i] is −1 (a child of the committed text) or the index of an earlier node of this phase
        (< T + i, so a node may hang under one appended in the same call).
        """
        if not self.in_tree:
            raise RuntimeError("forward_tree needs begin_tree() first")
        batch, k = tokens.shape
        total = self.num_nodes + k
        anc = torch.zeros(batch, total, total, dtype=torch.bool, device=self.device)
        anc[:, : self.num_nodes, : self.num_nodes] = self._ancestors
        depths = torch.cat([self._depths, torch.zeros_like(tokens)], 1)
        rows = torch.arange(batch, device=self.device)
        for i in range(k):
            node, parent = self.num_nodes + i, parents[:, i]
            has_parent = parent >= 0
            anc[:, node] = anc[rows, parent.clamp_min(0)] & has_parent[:, None]
            anc[:, node, node] = True
            depths[:, node] = torch.where(has_parent, depths[rows, parent.clamp_min(0)] + 1, 0)
        new = slice(self.num_nodes, total)
        positions = self.lengths[:, None] + depths[:, new]
        if self.position_limit is not None:
            positions = positions.clamp(max=self.position_limit - 1)  # such nodes can never be committed
        committed = self.mask[:, : self._tree_start].bool()
        allowed = torch.cat([committed[:, None, :].expand(-1, k, -1), anc[:, new, :]], 2)  # [B, k, S + k]
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(~allowed, torch.finfo(dtype).min)
        self.mask = torch.cat([self.mask, torch.zeros_like(tokens)], 1)
        out = self.model(
            input_ids=tokens,
            attention_mask=mask[:, None],
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self._ancestors, self._depths = anc, depths
        return out.logits

    def commit_path(self, keep: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """End the tree phase keeping, per row, the nodes marked in `keep [B', T]` as committed text.

        The kept nodes of a row must be a path from a child of the committed text downwards (depths 0, 1, …),
        which is what verification accepts. `rows [B']` first re-gathers rows (row i continues row rows[i]).
        """
        if not self.in_tree:
            raise RuntimeError("commit_path needs begin_tree() first")
        if rows is not None:
            self.select_rows(rows)
        start = self._tree_start
        self.mask = self.mask.clone()
        self.mask[:, start : start + self.num_nodes] = keep.long()
        self.lengths = self.lengths + keep.long().sum(1)
        self._tree_start = None

    def select_rows(self, index: torch.Tensor) -> None:
        super().select_rows(index)
        if self.in_tree:
            self._ancestors = self._ancestors[index]
            self._depths = self._depths[index]

    def crop(self, lengths) -> None:
        if self.in_tree:
            raise RuntimeError("crop inside a tree phase: call commit_path first")
        super().crop(lengths)
