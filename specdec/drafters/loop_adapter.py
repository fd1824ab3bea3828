"""A loop-only drafter on the engine: `LoopOnEngine` calls a `LoopDrafter` (`HierarchicalDrafter`, a duck-typed one
whose `propose` needs the loop's sampling arguments) through the engine's protocol, `propose(context, γ)`.

    specdec.generate(target, prompts, drafter=HierarchicalDrafter(...), engine="fast")   # wrapped by engine.build

What the loop's protocol needs that the engine's call does not carry, and how each is supplied, row by row:
  state      the loop drafter's state follows ONE static batch (`begin` once, `commit` after each step,
             `select_rows` as rows leave); the engine's rows join, leave and move between slots, and its `StepView`
             names no request. So each step, each row is begun afresh over its committed text (a `TokenBuffer` of
             that one row) and proposes; nothing is kept. Exact for any loop drafter (its state is a function of
             the committed text: `commit` drops what rejected drafts built), but a drafter holding a model pays a
             prefill of the row's whole text every step — why `engine="auto"` keeps such drafters on the loop
             (`holds_model`; `decoding.route`) and sends the others here.
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

    @torch.inference_mode()
    def propose(self, context, num_draft_tokens: int) -> Proposal:
        """`context`: the engine's `StepView` (tokens `[b, P]`, lengths `[b]`, seed `[b]`, temperature `[b]`) →
        `Proposal(tokens [b, γ], q [b, γ, V] or None when every row is greedy, lengths [b], forward_passes)`."""
        gamma, device = num_draft_tokens, context.tokens.device
        lengths = context.lengths.tolist()
        seeds, temps = context.seed.tolist(), context.temperature.float().tolist()
        texts = context.tokens.tolist()
        rows = [self._row(texts[i][: lengths[i]], gamma, seeds[i], temps[i], device) for i in range(len(lengths))]
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
