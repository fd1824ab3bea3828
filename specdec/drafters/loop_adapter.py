"""A loop-only drafter on the engine: `LoopOnEngine` calls a `LoopDrafter` (a duck-typed one whose `propose` needs the
loop's sampling arguments, a `HierarchicalDrafter` subclass) through the engine's protocol, `propose(context, γ)`.

    specdec.generate(target, prompts, drafter=MyLoopDrafter(...), engine="fast")   # wrapped by engine.build

What the loop's protocol needs that the engine's call does not carry, and how each is supplied, row by row:
  state      the loop drafter's state follows ONE static batch (`begin` once, `commit` after each step,
             `select_rows` as rows leave); the engine's rows join, leave and move between slots, and its `StepView`
             names no request. An all-greedy step follows the last one's batch where every row's text extends a
             distinct row of it (`select_rows` for the rows that left or moved, the committed tokens appended,
             `commit`: the loop's own sequence) and begins the batch afresh otherwise (a request joined, or the batch
             bucket's padding row took a freed slot: the view's rows are the bucket's); a step with
             sampled rows begins each row afresh over its committed text (a `TokenBuffer` of that one row) and
             keeps nothing. Exact either way (a loop drafter's state is a function of the committed text: `commit`
             drops what rejected drafts built), but sampled, a drafter holding a model pays a prefill of each row's
             whole text every step — why `engine="auto"` keeps such drafters on the loop (`holds_model`;
             `decoding.route`; a `HierarchicalDrafter` over a table, a rule, a model drafter or another such
             hierarchy runs natively instead, `engine.hierarchy`) and sends the others here.
  sampling   one `SamplingConfig` per call: the row's own temperature (0: greedy, one-hot q). Its top-k / top-p /
             min-p and processors are not applied to q: verification corrects any q (`core.verify` is exact for
             every q the drafts were really drawn from), so only acceptance depends on it.
  generator  a `torch.Generator` per row seeded by a hash of (the row's seed, its length, a draft tag): the draft
             depends only on the request's own seed and position (not on the batch), on a stream of its own —
             never the verifier's counter-based uniforms (`specdec.rng`).
  threshold  `confidence_threshold` is None (the engine's policy has no host stop).
Host reads of every row's length, seed and temperature: not capturable, so the engine runs it with
`cuda_graphs=False` (`engine.generate` sets it; `engine.build` refuses it under capture). A row's shorter draft
(its `lengths`, or fewer than γ tokens) is padded to γ with that length; q rows of greedy rows in a sampled step are
one-hot. `forward_passes` sums the rows' (their drafter calls this step).
"""

from __future__ import annotations

import torch

from specdec.core import SamplingConfig
from specdec.drafters.protocol import LoopDrafter, Proposal
from specdec.sequences import TokenBuffer

__all__ = ["LoopOnEngine", "is_loop_only", "holds_model"]

_SEED_MIX, _DRAFT_TAG = 0x9E3779B97F4A7C15, 0x6C6F6F70  # ("loop")


def is_loop_only(drafter) -> bool:
    """A `LoopDrafter` the engine cannot call as it is (its `propose` needs the loop's sampling arguments)."""
    from specdec.drafters.protocol import takes_engine_call

    return isinstance(drafter, LoopDrafter) and not takes_engine_call(drafter) and \
        callable(getattr(drafter, "begin", None))


def holds_model(drafter) -> bool:
    """Whether a drafter holds a torch module (its `model`, or an attribute that is one or wraps one: a
    `HierarchicalDrafter`'s middle model): re-begun every step, it would prefill the whole text each time."""
    import torch.nn as nn

    values = [getattr(drafter, "model", None), *vars(drafter).values()] if hasattr(drafter, "__dict__") else \
        [getattr(drafter, "model", None)]
    return any(isinstance(v, nn.Module) or isinstance(getattr(v, "model", None), nn.Module) for v in values)


class LoopOnEngine:
    """`drafter` (a `LoopDrafter`) behind the engine's `propose(context, num_draft_tokens)`; see the module doc.

    drafter      the loop drafter (its `begin` and `propose` are called every step, row by row)
    vocab_size   the target's vocabulary (q rows padded to it are refused: a loop drafter proposes over it)
    """

    capturable = False  # (host reads every step: `engine.build` refuses it under CUDA graphs)

    def __init__(self, drafter, vocab_size: int):
        if not is_loop_only(drafter):
            raise TypeError(f"drafter: LoopOnEngine wraps a loop-only drafter, got {type(drafter).__name__}")
        size = getattr(drafter, "vocab_size", None)
        if size is not None and size != vocab_size:
            raise ValueError(f"draft and target vocabularies differ: drafter has {size} tokens, target has "
                             f"{vocab_size}")
        self.drafter, self.vocab_size = drafter, vocab_size
        self._batch: tuple[TokenBuffer, list[list[int]]] | None = None  # the greedy batch followed (`_follow`)

    @torch.inference_mode()
    def propose(self, context, num_draft_tokens: int) -> Proposal:
        """`context`: the engine's `StepView` (tokens `[b, P]`, lengths `[b]`, seed `[b]`, temperature `[b]`) →
        `Proposal(tokens [b, γ], q [b, γ, V] or None when every row is greedy, lengths [b], forward_passes)`."""
        gamma, device = num_draft_tokens, context.tokens.device
        lengths = context.lengths.tolist()
        texts = [row[:n] for row, n in zip(context.tokens.tolist(), lengths)]
        if getattr(getattr(context, "flavor", None), "all_greedy", False):
            rows = self._greedy_batch(texts, gamma, device)
        else:
            self._batch = None  # (the rows' own `begin` below replaces the followed batch's state)
            seeds, temps = context.seed.tolist(), context.temperature.float().tolist()
            rows = [self._row(text, gamma, seed, t, device) for text, seed, t in zip(texts, seeds, temps)]
        batch = len(rows)
        tokens = torch.zeros(batch, gamma, dtype=torch.long, device=device)
        drafted = torch.zeros(batch, dtype=torch.long, device=device)
        sampled = any(q is not None for _, q, _, _ in rows)
        probs = torch.zeros(batch, gamma, self.vocab_size, device=device) if sampled else None
        for i, (row_tokens, q, n, _) in enumerate(rows):
            tokens[i, :n] = row_tokens[:n]
            drafted[i] = n
            if probs is not None:
                if q is not None:
                    probs[i, :n] = q[:n].to(probs.dtype)
                else:  # a greedy row of a sampled step: its q is one-hot at its drafts
                    probs[i, :n].scatter_(1, row_tokens[:n, None], 1.0)
                probs[i, n:, 0] = 1.0  # (past the row's draft: unread, a valid law for the proposal check)
        return Proposal(tokens=tokens, probs=probs, lengths=drafted, forward_passes=sum(r[3] for r in rows))

    def _greedy_batch(self, texts: list[list[int]], gamma: int, device) -> list[tuple]:
        """An all-greedy step: the whole batch in one call, its state followed from the last such step (`_follow`)."""
        buffer = self._follow(texts, gamma, device)
        proposal = self.drafter.propose(buffer, gamma, SamplingConfig(temperature=0.0), None, None)
        width = min(int(proposal.tokens.shape[1]), gamma)
        cut = [width] * len(texts) if proposal.lengths is None else proposal.lengths.clamp(max=width).tolist()
        passes = [int(proposal.forward_passes)] + [0] * (len(texts) - 1)
        return [(proposal.tokens[i].to(device), None, cut[i], passes[i]) for i in range(len(texts))]

    def _follow(self, texts: list[list[int]], gamma: int, device) -> TokenBuffer:
        """The loop's protocol over the engine's rows: where every row's text extends a distinct row of the last
        greedy step's batch, that batch is kept — `select_rows` (rows left or moved between slots), the committed
        tokens appended, `commit` — as the loop does after each step; otherwise (a row joined, a sampled step ran
        between) the batch is begun afresh. Exact either way: a loop drafter's state is a function of the text."""
        index = None if self._batch is None else _extends(texts, self._batch[1])
        if index is None:
            buffer = TokenBuffer(texts, max(map(len, texts)) + 2 * gamma + 2, device)
            self.drafter.begin(buffer, self.vocab_size)
        else:
            buffer, old = self._batch
            if index != list(range(len(old))):
                keep = torch.tensor(index, dtype=torch.long, device=device)
                buffer.select_rows(keep)
                self.drafter.select_rows(keep)
            new = [text[len(old[j]):] for text, j in zip(texts, index)]
            width = max(map(len, new), default=0)
            if width:
                rows = torch.tensor([row + [0] * (width - len(row)) for row in new], dtype=torch.long, device=device)
                buffer.append(rows, torch.tensor([len(row) for row in new], dtype=torch.long, device=device))
            self.drafter.commit(buffer)
        self._batch = (buffer, texts)
        return buffer

    def _row(self, text: list[int], gamma: int, seed: int, temperature: float, device):
        """One row's proposal → (tokens [γ'], q [γ', V] or None, its draft length ≤ γ, its drafter calls)."""
        buffer = TokenBuffer([text], len(text) + 2 * gamma + 2, device)
        self.drafter.begin(buffer, self.vocab_size)
        generator = torch.Generator(device=device)
        generator.manual_seed((seed * 1_000_003 + len(text) * _SEED_MIX + _DRAFT_TAG) % (1 << 63))
        proposal = self.drafter.propose(buffer, gamma, SamplingConfig(temperature=temperature), generator, None)
        tokens = proposal.tokens[0]
        n = min(int(tokens.shape[0]), gamma)
        if proposal.lengths is not None:
            n = min(n, int(proposal.lengths[0]))
        q = None if proposal.probs is None else proposal.probs[0]
        return tokens.to(device), q, n, int(proposal.forward_passes)

    def __repr__(self) -> str:
        return f"LoopOnEngine({type(self.drafter).__name__})"


def _extends(texts: list[list[int]], old: list[list[int]]) -> list[int] | None:
    """For each text the index of a distinct `old` text it extends (the row it continues), or None where one has
    none (a new row: the batch is begun again)."""
    if len(texts) > len(old):
        return None
    free, index = list(range(len(old))), []
    for text in texts:
        matches = [j for j in free if len(old[j]) <= len(text) and text[: len(old[j])] == old[j]]
        j = max(matches, key=lambda j: len(old[j]), default=None)  # (the longest: ties are the same state)
        if j is None:
            return None
        free.remove(j)
        index.append(j)
    return index
