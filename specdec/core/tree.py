"""Token trees: the tree shape, drawing children, and exact multi-draft verification, as pure tensor functions.

A draft tree `draft_tree=[k_1, ..., k_D]` gives every node at depth d−1 exactly k_d children. Node 0 is the
root (the last committed token); the others are numbered level by level (breadth first), so a parent's
index is always smaller than its children's and the children of one node are contiguous:

    level d occupies [offset_d, offset_d + size_d), size_d = k_1·…·k_d
    child c of the a-th node of level d−1 is node offset_d + a·k_d + c

The target scores all N + 1 nodes in one pass (tree attention: each node sees the committed text and its
own ancestors), giving p at every node; the drafter reports q at every internal node (the law its children
were drawn from). Verification walks down from the root with **recursive rejection sampling**:

    p ← p(node); for each child x_c (in drawing order):
        accept x_c with probability min(1, p(x_c) / q_c(x_c))   → descend into x_c, restart with p(x_c's node)
        else p ← norm(max(0, p − q_c))                          → try the next child against the residual
    no child accepted → emit a sample of p (the last residual); a leaf accepted → emit the bonus from p(leaf)

with q_c chosen to match how the children were drawn (`mode`):

  "iid"                  children i.i.d. from q; q_c = q. This is SpecInfer's multi-step speculative sampling
                         (Miao et al. 2024, "SpecInfer", Algorithm 2 / Theorem 4.2) with one draft model.
  "without_replacement"  children drawn sequentially without replacement (Gumbel/exponential race top-k);
                         q_c = q with x_1..x_{c−1} removed and renormalized. This is recursive rejection sampling
                         of Jeon et al. 2024, "Recursive Speculative Decoding" (RSD, arXiv:2402.14160), which
                         never spends two children on the same token.
  draft_probs=None       deterministic children (greedy top-k, lookup): q_c is one-hot at x_c, so the residual
                         is p with x_c removed.

Why it is exact (for each mode). Fix a node and its context; let p_c be the working distribution when child c
is tried and H_c everything decided before (x_1..x_{c−1}, their coins). By construction x_c ~ q_c given H_c and
p_c is a function of H_c. One step of speculative sampling with (p_c, q_c) emits min(p_c, q_c)(x) on
acceptance and hands (1 − β_c)·norm(max(0, p_c − q_c)) = (1 − β_c)·p_{c+1} to the next child (Leviathan et
al. 2023, Thm 3.1). Backwards from the last child, where the residual is sampled directly: if the remaining
children emit p_{c+1} exactly, then stage c emits min(p_c, q_c) + (1 − β_c)·p_{c+1} = p_c. So the token chosen
at the node follows p(node). Given it, the accepted child's own children were drawn from the drafter's q at
that child (independently of the coins so far), so the same argument applies one level down; the emitted
sequence therefore follows the target's autoregressive law token by token. A rule that tries every child
against the ORIGINAL p (no residual update) over-accepts tokens the drafter proposes twice or more and
fails: `tests/core/test_tree.py` checks both by chi-square. Greedy (`verify_tree_greedy`) descends into a child
equal to the target's argmax: the longest matching path, token for token the target's greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.core.sampling import sample

__all__ = ["TreeSpec", "TreeVerifyResult", "draw_children", "verify_tree", "verify_tree_greedy", "MODES"]

MODES = ("iid", "without_replacement")
MAX_TREE_NODES = 1024


@dataclass(frozen=True)
class TreeSpec:
    """A static tree shape from branching factors `[k_1, ..., k_D]` (k_d ≥ 1; ≤ 1024 nodes).

    num_nodes  N + 1 (root included);  num_internal  nodes with children (levels 0..D−1)
    parents    [N+1] long (−1 at the root);  depths  [N+1] long;  offsets  [D+2] start index of each level
    """

    branching: tuple[int, ...]
    offsets: tuple[int, ...] = field(init=False)
    parents: torch.Tensor = field(init=False, repr=False, compare=False)
    depths: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tree = self.branching
        if isinstance(tree, (str, bytes)) or not isinstance(tree, (list, tuple)) or not tree:
            raise ValueError(f"draft_tree must be a non-empty list of branching factors like [2, 2, 1], got {tree!r}")
        for k in tree:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ValueError(f"draft_tree entries must be integers >= 1, got {tree!r}")
        offsets, size = [0, 1], 1
        for k in tree:
            size *= k
            offsets.append(offsets[-1] + size)
            if offsets[-1] > MAX_TREE_NODES:
                raise ValueError(f"draft_tree {list(tree)} has more than {MAX_TREE_NODES} nodes")
        object.__setattr__(self, "branching", tuple(tree))
        object.__setattr__(self, "offsets", tuple(offsets))
        parents, depths = [-1], [0]
        for d, k in enumerate(tree, start=1):
            for j in range(offsets[d + 1] - offsets[d]):
                parents.append(offsets[d - 1] + j // k)
                depths.append(d)
        object.__setattr__(self, "parents", torch.tensor(parents, dtype=torch.long))
        object.__setattr__(self, "depths", torch.tensor(depths, dtype=torch.long))

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def num_nodes(self) -> int:
        return self.offsets[-1]

    @property
    def num_internal(self) -> int:
        return self.offsets[-2]

    def level(self, d: int) -> range:
        """Node indices of level d (0 = the root)."""
        return range(self.offsets[d], self.offsets[d + 1])

    def ancestors(self) -> torch.Tensor:
        """`[N+1, N+1]` bool: row i marks i and its ancestors (what node i attends to inside the tree)."""
        n = self.num_nodes
        anc = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            anc[i] |= anc[int(self.parents[i])]
        return anc


def draw_children(
    probs: torch.Tensor, k: int, mode: str, generator: torch.Generator | None = None, *, greedy_logits: bool = False
) -> torch.Tensor:
    """k children per node from `probs [..., V]` → tokens `[..., k]` (in drawing order).

    mode "iid": independent draws from probs; "without_replacement": the exponential race's top-k, i.e. the
    order of sequential sampling without replacement (Plackett–Luce). If probs has fewer than k tokens with
    mass, the extra children are zero-probability tokens that verification never accepts.
    greedy_logits=True: `probs` are logits and the children are their top-k (deterministic).
    """
    if greedy_logits:
        return probs.topk(k, dim=-1).indices
    if mode not in MODES:
        raise ValueError(f"tree mode must be one of {MODES}, got {mode!r}")
    if mode == "iid":
        expanded = probs.unsqueeze(-2).expand(*probs.shape[:-1], k, probs.shape[-1])
        return sample(expanded, generator)
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / noise).topk(k, dim=-1).indices


@dataclass(frozen=True)
class TreeVerifyResult:
    """Outcome of verifying one tree per row.

    path          [B, D]  accepted node at depth 1..D (−1 after the row stopped)
    num_accepted  [B]     accepted drafts (0..D)
    next_token    [B]     the residual sample where the row stopped, or the bonus after a leaf
    """

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor

    def tokens(self, tree_tokens: torch.Tensor) -> torch.Tensor:
        """`[B, D+1]`: the accepted drafts then `next_token`; entries after `num_accepted` are junk."""
        accepted = tree_tokens.gather(1, self.path.clamp_min(0))
        out = torch.cat([accepted, accepted.new_zeros(accepted.shape[0], 1)], 1)
        return out.scatter(1, self.num_accepted[:, None], self.next_token[:, None])


def _check_shapes(spec: TreeSpec, tokens: torch.Tensor, scores: torch.Tensor, name: str) -> None:
    n = spec.num_nodes
    if tokens.dim() != 2 or tokens.shape[1] != n:
        raise ValueError(f"tree_tokens must be [B, {n}] (root included), got {tuple(tokens.shape)}")
    if scores.shape[:2] != (tokens.shape[0], n):
        raise ValueError(f"{name} must be [B, {n}, V], got {tuple(scores.shape)}")


def verify_tree(
    spec: TreeSpec,
    tree_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    mode: str = "without_replacement",
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> TreeVerifyResult:
    """Recursive rejection sampling down a batch of draft trees (see the module docstring).

    tree_tokens   [B, N+1]        long; column 0 (the root, already committed) is ignored
    draft_probs   [B, M, V]       q at each internal node (M = spec.num_internal); None = deterministic children
    target_probs  [B, N+1, V]     p at every node, from one tree pass of the target
    uniforms      [B, N+1]        optional explicit U(0,1) coins (one per node); noise [B, V] for the last draw
    """
    _check_shapes(spec, tree_tokens, target_probs, "target_probs")
    if mode not in MODES:
        raise ValueError(f"tree mode must be one of {MODES}, got {mode!r}")
    if draft_probs is not None and draft_probs.shape[:2] != (tree_tokens.shape[0], spec.num_internal):
        raise ValueError(f"draft_probs must be [B, {spec.num_internal}, V], got {tuple(draft_probs.shape)}")
    batch, device = tree_tokens.shape[0], tree_tokens.device
    vocab = target_probs.shape[-1]
    if uniforms is None:
        uniforms = torch.rand(batch, spec.num_nodes, generator=generator, device=device)
    rows = torch.arange(batch, device=device)
    node = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, spec.depth), -1, dtype=torch.long, device=device)
    p_cur = target_probs[:, 0].float()
    for d, k in enumerate(spec.branching, start=1):
        first_child = spec.offsets[d] + (node - spec.offsets[d - 1]) * k
        q_cur = draft_probs[rows, node].float() if draft_probs is not None else None
        chosen = torch.full_like(node, -1)
        for c in range(k):
            child = first_child + c
            x = tree_tokens[rows, child]
            if q_cur is None:
                q_vec = torch.nn.functional.one_hot(x, vocab).to(p_cur.dtype)
            else:
                q_vec = q_cur
            qx = q_vec[rows, x]
            pending = alive & (chosen < 0)
            accept = pending & (qx > 0) & (uniforms[rows, child] * qx < p_cur[rows, x])
            chosen = torch.where(accept, child, chosen)
            reject = (pending & ~accept)[:, None]
            residual = (p_cur - q_vec).clamp_min(0)
            mass = residual.sum(-1, keepdim=True)
            # max(0, p − q) can vanish only through round-off (then p = q and x was certain): keep p
            p_cur = torch.where(reject & (mass > 0), residual / mass.clamp_min(1e-30), p_cur)
            if q_cur is not None and mode == "without_replacement":
                removed = q_cur.scatter(1, x[:, None], 0.0)
                left = removed.sum(-1, keepdim=True)
                q_cur = torch.where(reject, removed / left.clamp_min(1e-30) * (left > 0), q_cur)
        descend = chosen >= 0
        path[:, d - 1] = chosen
        node = torch.where(descend, chosen, node)
        p_cur = torch.where(descend[:, None], target_probs[rows, node].float(), p_cur)
        alive = descend
    next_token = sample(p_cur, generator, noise=noise)
    num_accepted = (path >= 0).long().sum(1)
    return TreeVerifyResult(path=path, num_accepted=num_accepted, next_token=next_token)


def verify_tree_greedy(spec: TreeSpec, tree_tokens: torch.Tensor, target_logits: torch.Tensor, *,
                       check_nan: bool = True) -> TreeVerifyResult:
    """The exact argmax path: descend into a child equal to the target's argmax at its parent.

    tree_tokens [B, N+1]; target_logits [B, N+1, V]. The emitted tokens are the target's own greedy tokens.
    check_nan=False skips the NaN check (a host sync) for callers inside a CUDA graph that check themselves.
    """
    _check_shapes(spec, tree_tokens, target_logits, "target_logits")
    if check_nan and torch.isnan(target_logits).any():
        raise ValueError("target logits contain NaN; the model produced invalid scores")
    best = target_logits.argmax(-1)  # [B, N+1]
    batch, device = tree_tokens.shape[0], tree_tokens.device
    rows = torch.arange(batch, device=device)
    node = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, spec.depth), -1, dtype=torch.long, device=device)
    for d, k in enumerate(spec.branching, start=1):
        first_child = spec.offsets[d] + (node - spec.offsets[d - 1]) * k
        children = first_child[:, None] + torch.arange(k, device=device)[None, :]
        match = (tree_tokens.gather(1, children) == best[rows, node][:, None]) & alive[:, None]
        found = match.any(1)
        chosen = torch.where(found, children.gather(1, match.long().argmax(1, keepdim=True)).squeeze(1), -1)
        path[:, d - 1] = chosen
        node = torch.where(found, chosen, node)
        alive = found
    return TreeVerifyResult(path=path, num_accepted=(path >= 0).long().sum(1), next_token=best[rows, node])
