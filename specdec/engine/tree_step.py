"""Token trees on the engine: one step shape (batch bucket, tree, length bucket, flavor) whose draft half expands a
tree level by level from the slot state and whose verify half scores every node in one target pass, verifies with
the loop's rules (`core.tree`) and commits the accepted path. Eager, or captured once as CUDA graphs and replayed.

Layout. A row with committed length n has its tree's root (node 0, its last committed token) in slot R = n − 1 of
both caches and node t in slot R + t (nodes breadth first, `core.tree.TreeSpec`); node t sits at position
R + depth(t) and sees the text below R and its own path (`fast.cache.TreeNodes`, `kernels.attention.TreeMask`).
After verification the accepted path's K/V entries are copied into place — the node at depth d into slot R + d, a
gather along the slot axis of every layer — so the row's cache is a chain again and rollback stays a length move.

Drafting (`EngineModelDrafter` only): the drafter re-feeds its last committed tokens as for a chain (q at the
root), then feeds one tree level per pass (q at each of its nodes); leaves are never fed. Children are drawn
without replacement (the exponential race's top-k, RSD; `core.tree`), greedy rows take the top-k logits.

Randomness (`specdec.rng`, keyed by absolute positions as for chains): the children of every depth-d node race the
same noise (DRAFT at L + d − 1, L = n), and the c-th child of any depth-d node is tested with the same uniform
(ACCEPT at L + d − 1 for c = 0, SIBLING for c ≥ 1). Only one node per depth is ever tried, so sharing a draw across
the nodes of a depth keeps every tried child's draw independent of what decided that it is tried; the one-child
tree [1, …, 1] draws exactly what a chain of the same γ draws. The final token races NEXT at L, as for chains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec import rng
from specdec.core import TEMPERATURE_FLOOR, invalid_scores
from specdec.core.tree import TreeSpec, TreeVerifyResult, verify_tree, verify_tree_greedy
from specdec.drafters.protocol import TreeProposal
from specdec.engine.drafters import EngineModelDrafter, Flavor, StepView, refeed_window
from specdec.engine.kv_pool import PagedSlotCache
from specdec.fast.cache import TreeNodes
from specdec.engine.runner_parts import StepParts
from specdec.engine.step_runner import CapturedHalves
from specdec.sequences import write_tokens
from specdec.step import StepCounts, StepLayout, commit_counts, pack_step, step_counters

__all__ = ["EngineTree", "TreeStepRunner", "propose_tree", "walk_tree", "walk_all_nodes", "commit_path", "commit_rows"]


@dataclass(frozen=True)
class EngineTree:
    """A `TreeSpec` with the device tensors a step reads: per node its depth, ancestor bits and child index."""

    spec: TreeSpec
    depths: torch.Tensor  # [N+1] long
    ancestors: torch.Tensor  # [N+1] int64: bit t = node t is the node or one of its ancestors
    child_index: torch.Tensor  # [N+1] long: the node's rank among its siblings (0 at the root)
    children: torch.Tensor  # [M, K] long: internal node m's c-th child (K = the widest level; 0 past its own k)
    has_child: torch.Tensor  # [M, K] bool: whether internal node m has a c-th child

    @classmethod
    def of(cls, branching: tuple[int, ...], device: torch.device) -> "EngineTree":
        spec = TreeSpec(list(branching))
        parents = spec.parents.tolist()
        bits, rank = [], []
        for t, parent in enumerate(parents):
            bits.append((1 << t) | (bits[parent] if parent >= 0 else 0))
            rank.append(0 if parent < 0 else (t - spec.offsets[int(spec.depths[t])]) % spec.branching[int(spec.depths[t]) - 1])
        widest = max(spec.branching)
        children = [[0] * widest for _ in range(spec.num_internal)]
        has_child = [[False] * widest for _ in range(spec.num_internal)]
        for t, parent in enumerate(parents):
            if parent >= 0:
                children[parent][rank[t]], has_child[parent][rank[t]] = t, True
        return cls(spec, spec.depths.to(device), torch.tensor(bits, dtype=torch.long, device=device),
                   torch.tensor(rank, dtype=torch.long, device=device),
                   torch.tensor(children, dtype=torch.long, device=device),
                   torch.tensor(has_child, dtype=torch.bool, device=device))

    def nodes(self, first: int, last: int) -> TreeNodes:
        """Nodes first..last − 1 as one forward feeds them."""
        return TreeNodes(first, self.depths[first:last], self.ancestors[first:last])


def propose_tree(drafter: EngineModelDrafter, view: StepView, tree: EngineTree) -> TreeProposal:
    """A tree per row → `TreeProposal` (tokens `[b, N+1]`: the root then the nodes breadth first; q `[b, M, V]` at
    the M internal nodes, None when every row is greedy; `depth` forward passes: one per level but the leaves')."""
    spec, lengths = tree.spec, view.lengths
    cache = drafter.cache.view(slice(0, view.batch), view.num_positions)
    window, valid = refeed_window(view, cache)
    logits = drafter.model(window, cache, valid, last_only=True)  # [b, 1, V]: q at the root; cache.lengths = n
    levels, probs = [window[:, -1:]], []
    greedy_rows = view.temperature < TEMPERATURE_FLOOR
    for d, k in enumerate(spec.branching, start=1):
        top = logits.topk(k, dim=-1).indices  # [b, nodes of level d − 1, k]: a greedy row's children
        if view.flavor.all_greedy:
            children = top
        else:
            q = view.probs(logits)
            probs.append(q)
            noise = rng.exponentials(view.seed, (lengths + d - 1)[:, None], rng.DRAFT, q.shape[-1])  # [b, 1, V]
            raced = (q.float() / noise).topk(k, dim=-1).indices  # without replacement (Plackett–Luce order)
            children = torch.where(greedy_rows[:, None, None], top, raced)
        level = children.reshape(view.batch, -1)
        levels.append(level)
        if d < spec.depth:
            logits = drafter.model(level, cache, tree=tree.nodes(spec.offsets[d], spec.offsets[d + 1]))
    return TreeProposal(torch.cat(levels, 1), torch.cat(probs, 1) if probs else None, spec.depth)


def walk_tree(tree: EngineTree, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
              uniforms: torch.Tensor, *, mode: str = "without_replacement") -> tuple[torch.Tensor, torch.Tensor]:
    """`core.tree.verify_tree`'s recursive rejection sampling, run at every internal node at once → (path `[b, D]`,
    −1 past the accepted depth; the law of the next token `[b, V]`).

    tokens `[b, N+1]`, draft_probs `[b, M, V]` (q at the internal nodes), target_probs `[b, N+1, V]`, uniforms
    `[b, N+1]` (one coin per node). What a node does with its children depends on its own p, q, children and coins
    only, never on the path that reached it, so every node's sibling test runs in one pass per child rank (K passes
    of `[b, M, V]` operators, K the widest level) and the path is then read off (D passes of `[b]` gathers): the
    same decisions, operator for operator, as `verify_tree`'s walk, which runs a dozen `[b, V]` operators for each
    child of each depth — the launches, not the arithmetic, are what a sampled step paid for (BENCHMARKS.md)."""
    spec, m = tree.spec, tree.spec.num_internal
    p = target_probs[:, :m].float()  # [b, M, V]: each node's working law
    q = draft_probs.float()  # [b, M, V]
    chosen = torch.full(p.shape[:2], -1, dtype=torch.long, device=p.device)  # [b, M]: the accepted child
    for c in range(tree.children.shape[1]):
        child = tree.children[:, c]  # [M]
        x = tokens[:, child]  # [b, M]
        qx = q.gather(2, x[..., None])[..., 0]
        px = p.gather(2, x[..., None])[..., 0]
        pending = tree.has_child[:, c] & (chosen < 0)
        accept = pending & (qx > 0) & (uniforms[:, child] * qx < px)
        chosen = torch.where(accept, child, chosen)
        reject = (pending & ~accept)[..., None]
        residual = (p - q).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        # max(0, p − q) can vanish only through round-off (then p = q and x was certain): keep p
        p = torch.where(reject & (mass > 0), residual / mass.clamp_min(1e-30), p)
        if mode == "without_replacement" and c + 1 < tree.children.shape[1]:  # (the last rank's q is never read)
            removed = q.scatter(2, x[..., None], 0.0)
            left = removed.sum(-1, keepdim=True)
            q = torch.where(reject, removed / left.clamp_min(1e-30) * (left > 0), q)
    node = torch.zeros_like(chosen[:, 0])
    alive = torch.ones_like(node, dtype=torch.bool)
    steps = []
    for _ in range(spec.depth):
        below = chosen.gather(1, node[:, None])[:, 0]  # node < M: it sits above the leaves
        alive = alive & (below >= 0)
        steps.append(torch.where(alive, below, -1))
        node = torch.where(alive, below, node)
    leaf = target_probs.gather(1, node[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0].float()
    stopped = p.gather(1, node.clamp(max=m - 1)[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    return torch.stack(steps, 1), torch.where(alive[:, None], leaf, stopped)


#: `walk_tree` against the walk down (`verify_tree`, Σk children tested along the path): it moves K·M − Σk extra
#: [b, V] slices per operator and saves Σk − K children's worth of launches (a dozen operators each, replayed at a
#: few µs); one child's launches cost about what ~20 operators over 2^22 float32 elements (16 MB at a few TB/s) do.
#: Chain-shaped trees (K·M = Σk) always take it; a wide tree over a large batch × vocabulary walks down instead.
WALK_ELEMENTS_PER_CHILD = 1 << 22


def walk_all_nodes(tree: EngineTree, batch: int, vocab: int) -> bool:
    """Whether a sampled verify of `batch` rows over `vocab` tokens runs `walk_tree` (else `core.tree.verify_tree`)."""
    spec, widest = tree.spec, tree.children.shape[1]
    tested = sum(spec.branching)  # children the walk down tests, one [b, V] slice each
    extra = widest * spec.num_internal - tested  # [b, V] slices each of walk_tree's operators adds
    saved = tested - widest  # children whose operators it does not launch
    return batch * vocab * extra <= saved * WALK_ELEMENTS_PER_CHILD


def commit_path(keys: torch.Tensor, values: torch.Tensor, root: torch.Tensor, path: torch.Tensor) -> None:
    """Copy each row's accepted path into chain order: the node at depth d (slot root + path[:, d − 1]) into slot
    root + d, in every layer. keys/values `[L, b, H_kv, S, D]` (views of a `SlotCache`), root `[b]`, path `[b, D]`
    (−1 past the accepted depth: those slots keep what they hold, to be overwritten later)."""
    depth = torch.arange(1, path.shape[1] + 1, device=path.device)[None, :]
    src = root[:, None] + torch.where(path >= 0, path, depth)
    dst = (root[:, None] + depth)
    layers, b, heads, _, dim = keys.shape
    shape = (layers, b, heads, path.shape[1], dim)
    src, dst = (i[None, :, None, :, None].expand(shape) for i in (src, dst))
    for cache in (keys, values):
        cache.scatter_(3, dst, cache.gather(3, src))  # (gathered first: a path may read slots it also writes)


def commit_rows(slot_cache, rows: slice, positions: int, root: torch.Tensor, path: torch.Tensor) -> None:
    """`commit_path` on rows `rows` of an engine cache of either layout: a static `SlotCache`'s slot axis, or the
    paged pool's blocks through the rows' block table (`kv_pool.PagedSlotCache.copy_positions`)."""
    if isinstance(slot_cache, PagedSlotCache):
        depth = torch.arange(1, path.shape[1] + 1, device=path.device)[None, :]
        src = root[:, None] + torch.where(path >= 0, path, depth)
        slot_cache.copy_positions(rows, positions, src, root[:, None] + depth)
        return
    commit_path(slot_cache.keys[:, rows, :, :positions], slot_cache.values[:, rows, :, :positions], root, path)


class TreeStepRunner(CapturedHalves):
    """The draft and verify halves of one token-tree step shape, eager or captured (each once)."""

    def __init__(self, parts: StepParts, batch: int, tree: EngineTree, positions: int, flavor: Flavor):
        self.parts, self.batch, self.tree, self.positions, self.flavor = parts, batch, tree, positions, flavor
        self.gamma = tree.spec.depth
        self.view = StepView(parts.state, batch, positions, flavor)
        self.layout = StepLayout(tree.spec.depth, logprobs=flavor.logprobs, top_logprobs=flavor.top_logprobs)
        self.drafts = None
        self.ran = False
        self._draft_graph = self._verify_graph = None

    def draft_body(self):
        return propose_tree(self.parts.drafter, self.view, self.tree)

    def _verify(self, tokens: torch.Tensor, probs: torch.Tensor | None, logits: torch.Tensor) -> TreeVerifyResult:
        """The loop's rules on the device: recursive rejection sampling (without replacement) or the argmax path;
        greedy rows among sampled ones take the argmax path (their q is one-hot, their children the top-k)."""
        view, spec, lengths = self.view, self.tree.spec, self.view.lengths
        greedy = verify_tree_greedy(spec, tokens, logits, check_nan=False)
        if self.flavor.all_greedy:
            return greedy
        at = lengths[:, None] + torch.arange(spec.depth, device=lengths.device)[None, :]  # positions L + d − 1
        first = rng.uniforms(view.seed, at, rng.ACCEPT)  # [b, D]
        widest = max(spec.branching)
        later = torch.exp(-rng.exponentials(view.seed, at, rng.SIBLING, widest))  # [b, D, widest], U(0, 1)
        depth = (self.tree.depths - 1).clamp_min(0)
        rank = self.tree.child_index
        uniforms = torch.where(rank == 0, first[:, depth], later[:, depth, rank.clamp(max=widest - 1)])  # [b, N+1]
        if walk_all_nodes(self.tree, self.batch, logits.shape[-1]):
            path, law = walk_tree(self.tree, tokens, probs, view.probs(logits), uniforms)
            sampled = TreeVerifyResult(path, (path >= 0).long().sum(1), rng.sample(law, view.seed, lengths, rng.NEXT))
        else:
            noise = rng.exponentials(view.seed, lengths[:, None], rng.NEXT, logits.shape[-1])[:, 0]
            sampled = verify_tree(spec, tokens, probs, view.probs(logits), mode="without_replacement",
                                  uniforms=uniforms, noise=noise)
        rows = view.temperature < TEMPERATURE_FLOOR
        pick = lambda a, b: torch.where(rows.view(-1, *[1] * (a.dim() - 1)), a, b)  # noqa: E731
        return TreeVerifyResult(pick(greedy.path, sampled.path), pick(greedy.num_accepted, sampled.num_accepted),
                                pick(greedy.next_token, sampled.next_token))

    def verify_body(self) -> torch.Tensor:
        """Score, verify, commit and count on the device → `pack_step`'s table for `self.layout`."""
        e, view, spec, flavor = self.parts, self.view, self.tree.spec, self.flavor
        rows, state = slice(0, self.batch), e.state
        tokens, probs = self.drafts.tokens, self.drafts.probs
        lengths = view.lengths
        root = lengths - 1
        cache = e.cache.view(rows, self.positions)
        cache.lengths.copy_(root)
        logits = e.model(tokens, cache, tree=self.tree.nodes(0, spec.num_nodes))  # [b, N+1, V]
        has_nan = invalid_scores(logits)
        result = self._verify(tokens, probs, logits)
        for slot_cache in (e.cache, e.drafter.cache):
            commit_rows(slot_cache, rows, self.positions, root, result.path)
        new_tokens = result.tokens(tokens)  # [b, D+1]
        active, generated = state.active[rows], state.generated[rows]
        counts, hit_eos = commit_counts(new_tokens, result.num_accepted, state.max_new[rows] - generated,
                                        state.eos[rows], active)
        write_tokens(state.tokens[rows], lengths, new_tokens, counts)
        lengths.add_(counts)
        generated.add_(counts)
        finished = active & (hit_eos | (generated >= state.max_new[rows]))
        nodes = torch.full_like(counts, spec.num_nodes - 1)  # a tree step drafts N nodes; no single-draft β
        no_beta = torch.zeros(self.batch, spec.depth, dtype=torch.float64, device=e.device)
        counters = step_counters(result.num_accepted, no_beta, nodes, active, spec.depth)
        wide = StepCounts.widen(counters, spec.depth, e.max_draft_tokens)
        state.counters[rows].add_(wide)
        e.tree_counter_sums.add_(wide.sum(0))
        logprobs = top = None
        if flavor.logprobs:  # token d was predicted at the path's node of depth d (the root for d = 0)
            at = torch.cat([torch.zeros_like(root)[:, None], result.path.clamp_min(0)], 1)  # [b, D+1]
            scored = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1])).float().log_softmax(-1)
            logprobs = scored.gather(-1, new_tokens[..., None])[..., 0]
            if flavor.top_logprobs:
                values, ids = scored.topk(flavor.top_logprobs, dim=-1)
                top = (ids, values)
        return pack_step(self.layout, new_tokens, counts, result.num_accepted, nodes, finished, hit_eos, active,
                         has_nan, logprobs=logprobs, top=top)

    @property
    def eager(self) -> bool:
        return not self.parts.cuda_graphs

    def _draft_restore(self) -> list:
        return [self.parts.drafter.cache.lengths]

    def _verify_restore(self) -> list:
        e, s = self.parts, self.parts.state
        return [s.tokens, s.lengths, s.generated, e.cache.lengths, s.counters, e.tree_counter_sums]
