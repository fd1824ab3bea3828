"""The draft beams of one speculative beam search pass (`search.beam.BeamSearch`) as per-row node blocks: each level's
nodes placed in the row of the running beam they descend from (their root), with their slots in the target's tree
pass (tslot) and in the drafter's (dslot), and the look-ups the replay makes (`child`, `slots`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftLevel", "DraftTree"]


@dataclass
class DraftLevel:
    """Draft nodes of one level, [P, u] each: parent (root beam at level 0, else node index one level up),
    token, root beam, rank among the nodes of the same row, slot in the target's node block (tslot) and
    in the drafter's tree phase (dslot, −1 = not fed)."""

    parent: torch.Tensor
    token: torch.Tensor
    root: torch.Tensor
    rank: torch.Tensor
    tslot: torch.Tensor
    dslot: torch.Tensor


class DraftTree:
    """The draft beams of one pass as per-row node blocks (rows = running beams)."""

    def __init__(self, num_prompts: int, w: int):
        self.num_prompts, self.w = num_prompts, w
        self.levels: list[DraftLevel] = []
        self._tokens: list[torch.Tensor] = []
        self._parents: list[torch.Tensor] = []
        self.width = 0  # target block slots used
        self.fed_width = 0  # drafter tree slots used

    def add_level(self, parent, token, root, *, fed: bool):
        """Place the level's nodes in their rows; returns the drafter's block (tokens, parents) [P·w, m]."""
        p, w = self.num_prompts, self.w
        onehot = torch.nn.functional.one_hot(root, w)  # [P, u, w]
        rank = (onehot.cumsum(1) * onehot).sum(-1) - 1
        m = int(onehot.sum(1).max())
        prompts = torch.arange(p, device=token.device)[:, None]
        up = self.levels[-1] if self.levels else None
        tslot = self.width + rank
        dslot = self.fed_width + rank if fed else torch.full_like(rank, -1)
        block_tokens = torch.zeros(p, w, m, dtype=torch.long, device=token.device)
        block_tokens[prompts, root, rank] = token
        block_parents = torch.full_like(block_tokens, -1)
        block_parents[prompts, root, rank] = up.tslot.gather(1, parent) if up is not None else torch.full_like(rank, -1)
        self._tokens.append(block_tokens)
        self._parents.append(block_parents)
        self.levels.append(DraftLevel(parent, token, root, rank, tslot, dslot))
        self.width += m
        draft_parents = torch.full_like(block_tokens, -1)
        if up is not None:
            draft_parents[prompts, root, rank] = up.dslot.gather(1, parent)
        if fed:
            self.fed_width += m
        return block_tokens.reshape(p * w, m), draft_parents.reshape(p * w, m)

    @property
    def tokens(self) -> torch.Tensor:
        return torch.cat(self._tokens, 2).reshape(self.num_prompts * self.w, -1)

    @property
    def parents(self) -> torch.Tensor:
        return torch.cat(self._parents, 2).reshape(self.num_prompts * self.w, -1)

    def child(self, level: int, parent: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """Index of the level-`level` node with this parent and token for each beam [P, w], or −1."""
        nodes = self.levels[level]
        match = (nodes.parent[:, None, :] == parent[..., None]) & (nodes.token[:, None, :] == token[..., None])
        return torch.where(match.any(2), match.long().argmax(2), -1)

    def slots(self, path: torch.Tensor, name: str) -> torch.Tensor:
        """`name` (tslot, dslot or token) of the node on each beam's path per level: [P, w, levels] (0 where none)."""
        out = torch.zeros_like(path)
        for level, nodes in enumerate(self.levels):
            index = path[:, :, level].clamp_min(0)
            out[:, :, level] = getattr(nodes, name).gather(1, index)
        return out
