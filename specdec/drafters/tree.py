"""A transformers model drafting token trees: k_d children per node, one drafter pass per tree level.

`propose_tree` feeds the committed tokens the drafter has not seen (one pass → q at the root), draws k_1
children, feeds them as one tree level through `TreeCausalLM.forward_tree` (→ q at each of them), draws k_2
children each, and so on; leaves are never fed. It reports q at every internal node (the law the children
were drawn from, see `specdec.core.tree`). `commit` keeps the drafter's KV of the accepted path (matched against
the committed tokens), so the next proposal feeds only what is new.
"""

from __future__ import annotations

import torch

from specdec.core import SamplingConfig, standardize_logits
from specdec.drafters.protocol import TreeProposal
from specdec.models.tree_lm import TreeCausalLM
from specdec.sequences import TokenBuffer
from specdec.core.tree import TreeSpec, draw_children


class TreeModelDrafter:
    """Drafts a `TreeSpec`-shaped tree per row with a transformers causal LM (same vocabulary as the target)."""

    drop_finished_rows = True

    def __init__(self, model: torch.nn.Module):
        self.lm = TreeCausalLM(model)
        self.vocab_size = self.lm.vocab_size

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        self.lm.reset(context.batch_size)

    @torch.inference_mode()
    def propose_tree(
        self, context: TokenBuffer, spec: TreeSpec, sampling: SamplingConfig, generator: torch.Generator | None, mode: str
    ) -> TreeProposal:
        batch = context.batch_size
        unseen = context.lengths - self.lm.lengths  # ≥ 1: at least the last committed token
        block, valid = context.tail(int(unseen.max()), unseen)
        level_logits = self.lm.forward(block, valid)[:, -1:]  # [B, 1, V]: q at the root
        tokens = torch.zeros(batch, spec.num_nodes, dtype=torch.long, device=block.device)
        tokens[:, 0] = block[:, -1]
        self._base = self.lm.lengths.clone()
        self.lm.begin_tree()
        probs, passes = [], 1
        for d, k in enumerate(spec.branching, start=1):
            if sampling.greedy:
                children = draw_children(level_logits, k, mode, greedy_logits=True)
            else:
                q = standardize_logits(level_logits, sampling)
                probs.append(q)
                children = draw_children(q, k, mode, generator)
            level = spec.level(d)
            tokens[:, level.start : level.stop] = children.reshape(batch, -1)
            if d < spec.depth:  # tree slot of node i is i − 1 (the root is committed text, not a node here)
                parents = (spec.parents[level.start : level.stop] - 1).to(tokens.device).expand(batch, -1)
                level_logits = self.lm.forward_tree(tokens[:, level.start : level.stop], parents)
                passes += 1
        return TreeProposal(tokens=tokens, probs=torch.cat(probs, 1) if probs else None, forward_passes=passes)

    def commit_tree(self, context: TokenBuffer, spec: TreeSpec, tree_tokens: torch.Tensor) -> None:
        """Keep the fed nodes that are now committed text (walking the tree along the committed tokens)."""
        batch = context.batch_size
        device = tree_tokens.device
        rows = torch.arange(batch, device=device)
        keep = torch.zeros(batch, self.lm.num_nodes, dtype=torch.bool, device=device)
        node = torch.zeros(batch, dtype=torch.long, device=device)
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        for d in range(1, spec.depth):  # levels 1..D−1 were fed
            k = spec.branching[d - 1]
            at = self._base + d - 1  # committed token at depth d
            alive &= at < context.lengths - 1  # the cache never holds the last committed token
            token = context.tokens.gather(1, at.clamp(max=context.capacity - 1)[:, None]).squeeze(1)
            first = spec.offsets[d] + (node - spec.offsets[d - 1]) * k
            children = first[:, None] + torch.arange(k, device=device)[None, :]
            match = tree_tokens.gather(1, children) == token[:, None]
            alive &= match.any(1)
            node = torch.where(alive, children.gather(1, match.long().argmax(1, keepdim=True)).squeeze(1), node)
            keep[rows, (node - 1).clamp_min(0)] |= alive
        self.lm.commit_path(keep)
        self.lm.crop(torch.minimum(self.lm.lengths, context.lengths - 1))

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)
