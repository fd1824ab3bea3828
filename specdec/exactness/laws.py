"""Exact laws of the first K generated tokens, from plain forward passes, as chi-square cells.

The law of tokens 1..K after prompt i is the chain P(t_1..t_K) = Π_j p(t_j | prompt_i, t_<j). It cannot be
tabled over V^K sequences, so it is tabled over a tree of *frequent prefixes*: a prefix s of length j−1 gets
its own conditional law p(· | prompt_i, s) (one forward pass) when its expected count n_i·P(s) reaches
`MIN_PREFIX_EXPECTED`; the cells of position j are then (s, t) for each frequent s and each token t with
expected count ≥ CELL_MIN_EXPECTED, (s, other possible token), (s, impossible token) and one cell for every prefix
that is not frequent. The tree is built from the target law alone, never from the samples, so the test is exact
for any trial outcome.

Besides the target law p, every node carries three deliberately wrong laws, the negative controls:
`drafter`          q itself — what a verifier that accepts every draft would output;
`resample_from_p`  min(p, q) + (1 − β)·p — a verifier that resamples from p instead of norm(max(0, p − q))
                   after a rejection (a real, common bug), applied at every position;
`cooler`           p^1.25, renormalized: the target law at 0.8× the temperature (a sampler that applies the
                   temperature wrong). It needs no q, so it is the power check where q is unknown (feature heads).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.core import SamplingConfig, standardize_logits
from specdec.request import vocab_size
from specdec.exactness.stats import MIN_EXPECTED

__all__ = ["LAWS", "LawTree", "Node", "build_tree", "position_cells", "model_laws", "drafter_laws", "bug_law",
           "cooler_law", "MIN_PREFIX_EXPECTED", "CELL_MIN_EXPECTED", "COOLER_EXPONENT"]

#: the law under test, then the negative controls
LAWS = ("target", "drafter", "resample_from_p", "cooler")
#: the `cooler` control: p^COOLER_EXPONENT renormalized = the law at 1 / COOLER_EXPONENT of the temperature
COOLER_EXPONENT = 1.25
#: a cell of the check stands alone from this expected count: at 5 (the textbook rule) and peaked laws, simulated
#: false alarms at level 1e-4 ran at 4e-4; at 10, 2.5e-4 (tests/test_check_stats.py keeps the calibration honest)
CELL_MIN_EXPECTED = 2 * MIN_EXPECTED
#: a prefix gets its own conditional law when its expected count reaches this
MIN_PREFIX_EXPECTED = CELL_MIN_EXPECTED
#: most nodes of one depth (the most probable are kept); bounds the forward passes and memory
MAX_NODES_PER_DEPTH = 4096
#: logits elements per forward chunk (rows × positions × V), bounds memory
_CHUNK_ELEMENTS = 1 << 23


@dataclass(frozen=True)
class Node:
    """One context prompt_i + prefix and its next-token cells.

    path        [L] probability of `prefix` after the prompt under each law of LAWS
    tokens      [B] tokens with their own cell (expected count ≥ CELL_MIN_EXPECTED under the target)
    cells       [L, B + 2] each law's probability of: each of `tokens`, any other token the target allows,
                any token the target forbids (probability 0: top-k / top-p cut)
    forbidden   tokens the target gives probability 0, as a set (empty at temperature > 0 without filters)
    children    token → [L] conditional probabilities, for the tokens whose prefix is frequent
    """

    prompt: int
    prefix: tuple[int, ...]
    path: np.ndarray
    tokens: np.ndarray
    cells: np.ndarray
    forbidden: frozenset
    children: dict = field(default_factory=dict)

    def cell_of(self, token: int) -> int:
        """The index of `token`'s cell in `cells[:, ...]`."""
        hits = np.flatnonzero(self.tokens == token)
        if len(hits):
            return int(hits[0])
        return len(self.tokens) + (1 if token in self.forbidden else 0)


@dataclass(frozen=True)
class LawTree:
    """Frequent-prefix nodes per prompt and depth: `nodes[(prompt, prefix)]`, `depth_nodes[j]` = depth-j keys."""

    nodes: dict
    depth_nodes: tuple
    controls: bool  # False when the drafter's q could not be computed (the q-based controls then equal p)


def bug_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """min(p, q) + (1 − β)·p: the output law when a rejection resamples from p instead of the residual."""
    overlap = torch.minimum(p, q)
    return overlap + (1 - overlap.sum(-1, keepdim=True)) * p


def cooler_law(p: torch.Tensor) -> torch.Tensor:
    """p^1.25 renormalized (the same support): the target law at 0.8× its temperature."""
    cooled = p.pow(COOLER_EXPONENT)
    return cooled / cooled.sum(-1, keepdim=True)


def _accepts_logits_to_keep(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@torch.inference_mode()
def model_laws(model, contexts: list[list[int]], sampling: SamplingConfig) -> torch.Tensor:
    """The standardized next-token law after each context, from plain forward passes of a transformers LM.

    contexts  N token lists (any lengths ≥ 1)
    returns   [N, V] float64 on the CPU, rows in the order of `contexts`
    """
    device = next(model.parameters()).device
    keep = _accepts_logits_to_keep(model)
    vocab = vocab_size(model)
    out: list[torch.Tensor | None] = [None] * len(contexts)
    by_length: dict[int, list[int]] = {}
    for i, ctx in enumerate(contexts):
        by_length.setdefault(len(ctx), []).append(i)
    for length, rows in by_length.items():
        per_chunk = max(1, _CHUNK_ELEMENTS // (vocab * (1 if keep else length)))
        for start in range(0, len(rows), per_chunk):
            chunk = rows[start:start + per_chunk]
            ids = torch.tensor([contexts[i] for i in chunk], dtype=torch.long, device=device)
            kwargs = {"logits_to_keep": 1} if keep else {}
            logits = model(input_ids=ids, **kwargs).logits[:, -1]
            probs = standardize_logits(logits, sampling).double().cpu()
            for i, row in zip(chunk, probs):
                out[i] = row / row.sum()
    return torch.stack(out) if out else torch.zeros(0, vocab, dtype=torch.float64)


@torch.inference_mode()
def drafter_laws(drafter, target_vocab: int, contexts: list[list[int]], sampling: SamplingConfig, seed: int = 0):
    """The drafter's first-draft law q after each context: `[N, V]` float64 with NaN rows where the drafter
    proposes nothing (that position is sampled from p), or None when q cannot be computed for this drafter.

    transformers models (and plain `ModelDrafter`s) run forward passes; any other `Drafter` is asked to
    propose one token and its reported q is taken (None probs = a deterministic, one-hot q).
    """
    from specdec.drafters.base import Drafter
    from specdec.drafters.model import LoopState, ModelDrafter
    from specdec.sequences import TokenBuffer

    from specdec.drafters.formats import is_drafter

    if is_drafter(drafter):
        return None  # a head (specdec's, EAGLE, EAGLE-3, Medusa) or its folder: q needs the target's features
    if type(drafter) is ModelDrafter and type(drafter.state) is LoopState:  # (over a transformers model)
        drafter = drafter.model
    if isinstance(drafter, torch.nn.Module) and getattr(drafter, "config", None) is not None:
        return model_laws(drafter, contexts, sampling)
    if not isinstance(drafter, Drafter):
        return None  # e.g. a feature-head folder: its q needs the target's features inside the engine
    out = torch.full((len(contexts), target_vocab), float("nan"), dtype=torch.float64)
    per_chunk = max(1, _CHUNK_ELEMENTS // target_vocab)
    generator = torch.Generator().manual_seed(seed)
    for start in range(0, len(contexts), per_chunk):
        rows = contexts[start:start + per_chunk]
        buffer = TokenBuffer(rows, max(len(r) for r in rows) + 1, _drafter_device(drafter))
        drafter.begin(buffer, target_vocab)
        proposal = drafter.propose(buffer, 1, sampling, generator if buffer.tokens.device.type == "cpu" else None)
        lengths = proposal.lengths if proposal.lengths is not None else torch.ones(len(rows), dtype=torch.long)
        if proposal.probs is not None:
            q = proposal.probs[:, 0].double().cpu()
        else:
            q = torch.nn.functional.one_hot(proposal.tokens[:, 0].cpu(), target_vocab).double()
        for r in range(len(rows)):
            if int(lengths[r]) > 0:
                out[start + r] = q[r] / q[r].sum()
    return out


def _drafter_device(drafter) -> torch.device:
    model = getattr(drafter, "model", None)
    if isinstance(model, torch.nn.Module):
        return next(model.parameters()).device
    return torch.device("cpu")


def _node(prompt: int, prefix: tuple, path: np.ndarray, laws: np.ndarray, trials: int, expand: bool,
          strict_support: bool = True) -> Node:
    """A node from its laws `[L, V]` (row 0 the target): cells and the children worth a node of their own.
    Without `strict_support`, tokens the target forbids share the "other" cell instead of failing outright."""
    target = laws[0]
    weight = trials * path[0]  # the prefix's expected count under the target
    own = np.flatnonzero(weight * target >= CELL_MIN_EXPECTED)
    possible = target > 0 if strict_support else np.ones_like(target, dtype=bool)
    rest = possible.copy()
    rest[own] = False
    cells = np.concatenate([laws[:, own], (laws * rest).sum(1, keepdims=True),
                            (laws * ~possible).sum(1, keepdims=True)], axis=1)
    children = {}
    if expand:
        for token in np.flatnonzero(weight * target >= MIN_PREFIX_EXPECTED):
            children[int(token)] = laws[:, token].copy()
    return Node(prompt, prefix, path, own, cells, frozenset(np.flatnonzero(~possible).tolist()), children)


def build_tree(target, drafter, prompts: list[list[int]], trials: list[int], positions: int,
               sampling: SamplingConfig, seed: int = 0) -> LawTree:
    """The frequent-prefix tree of every prompt down to depth `positions − 1` (see the module docstring).

    prompts  M prompts (token ids); trials[i] samples will be drawn after prompt i
    A token outside the target's top-k / top-p support fails the test outright only for fp32/fp64 targets: in
    bf16/fp16 the runner's logits and these forward passes round differently, and a token at the cut may be in
    one support and not the other (such tokens then count in the "other" cell, like any rare token).
    """
    strict = next(target.parameters()).dtype in (torch.float32, torch.float64)
    vocab = vocab_size(target)
    nodes: dict = {}
    depth_nodes = []
    frontier = [(i, (), np.ones(len(LAWS))) for i in range(len(prompts))]
    controls = True
    for depth in range(positions):
        if len(frontier) > MAX_NODES_PER_DEPTH:  # keep the most probable prefixes (decided by the law, not data)
            frontier = sorted(frontier, key=lambda f: -trials[f[0]] * f[2][0])[:MAX_NODES_PER_DEPTH]
        keys = []
        next_frontier = []
        per_chunk = max(1, _CHUNK_ELEMENTS // (len(LAWS) * vocab))
        for start in range(0, len(frontier), per_chunk):
            chunk = frontier[start:start + per_chunk]
            contexts = [list(prompts[i]) + list(prefix) for i, prefix, _ in chunk]
            p = model_laws(target, contexts, sampling)
            q = drafter_laws(drafter, vocab, contexts, sampling, seed)
            if q is None:
                controls = False
                q = torch.full_like(p, float("nan"))
            q = torch.where(torch.isnan(q).any(-1, keepdim=True), p, q)  # no draft there: sampled from p
            laws = torch.stack([p, q, bug_law(p, q), cooler_law(p)], 1).numpy()  # [N, L, V]
            for (i, prefix, path), node_laws in zip(chunk, laws):
                node = _node(i, prefix, path, node_laws, trials[i], depth + 1 < positions, strict)
                nodes[(i, prefix)] = node
                keys.append((i, prefix))
                next_frontier += [(i, prefix + (t,), path * conditional) for t, conditional in node.children.items()]
        depth_nodes.append(tuple(keys))
        frontier = next_frontier
    return LawTree(nodes, tuple(depth_nodes), controls)


def position_cells(tree: LawTree, depth: int, samples: list[list[list[int]]], trials: list[int]):
    """Observed and expected counts of position `depth + 1`, one group per prompt.

    samples[i]  the generated tokens of prompt i's trials (each at least depth + 1 long)
    returns     (observed [C], expected [L, C], groups [C])
    """
    observed, expected, groups = [], [], []
    index: dict = {}
    for key in tree.depth_nodes[depth]:
        node = tree.nodes[key]
        index[key] = len(observed)
        observed += [0] * node.cells.shape[1]
        expected.append(trials[node.prompt] * node.path[:, None] * node.cells)
        groups += [node.prompt] * node.cells.shape[1]
    rare = {}
    if depth > 0:
        for i in range(len(trials)):
            covered = sum((tree.nodes[k].path for k in tree.depth_nodes[depth] if k[0] == i), np.zeros(len(LAWS)))
            mass = np.clip(1.0 - covered, 0.0, 1.0)
            mass[mass < 1e-12] = 0.0
            rare[i] = len(observed)
            observed.append(0)
            expected.append(trials[i] * mass[:, None])
            groups.append(i)
    for i, rows in enumerate(samples):
        for tokens in rows:
            key = (i, tuple(tokens[:depth]))
            if key in index:
                observed[index[key] + tree.nodes[key].cell_of(tokens[depth])] += 1
            else:
                observed[rare[i]] += 1
    return np.asarray(observed, dtype=np.float64), np.concatenate(expected, axis=1), np.asarray(groups)
