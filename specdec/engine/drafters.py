"""Drafters as the engine runs them: they read the slot state and draw per-row randomness by counter.

Every drafter the engine runs is a `drafters.protocol.SlotDrafter`: `propose(context, num_draft_tokens) -> Proposal` —
`tokens [b, γ]`, the q they were drawn from (`[b, γ, V]`, None when every row's q is one-hot), per-row draft
lengths (None = all γ) and its model calls — with no host synchronization, so a whole step can be captured;
`context` is a `StepView`, which carries each row's sampling law and seed (`draw`, `draft_chain`: how a drafter
samples on the engine). Every drafter kind is ONE class for both runners (`drafters`); what is here is the view
and the engine's state holder of a draft model:

  SlotModel   a `drafters.model.ModelDrafter`'s (and `CrossVocabDrafter`'s) state on the engine: a small fast model
              with its own slot cache; each proposal re-feeds the last `WINDOW` committed tokens, so rejected drafts
              never need to be rolled back (`engine.build` binds a drafter to it: `ModelDrafter.with_state`)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec import rng
from specdec.core import FILTERS, standardize_rows
from specdec.core.processors import (
    ProcessorRows,
    TokenHistory,
    advance,
    constraint_masks,
    process_draft,
    text_bans,
)
from specdec.drafters.model import DraftState, ModelDrafter
from specdec.drafters.protocol import Proposal
from specdec.engine.slots import SlotCache, SlotState, prefill_ragged, prefill_rows
from specdec.fast.quant.weight import embedding
from specdec.fast.kernels.argmax import argmax
from specdec.fast.model import FastLlama

__all__ = ["Flavor", "StepView", "SlotModel", "EngineModelDrafter", "WINDOW", "refeed_window"]

WINDOW = 4  # committed tokens a model drafter re-feeds per proposal


@dataclass(frozen=True)
class Flavor:
    """What the rows of one step need (known on the host from their parameters); part of a graph's key."""

    all_greedy: bool
    filters: tuple[str, ...] = ()  # the sampling filters (`core.FILTERS` names) some row turns on, in order
    logprobs: bool = False
    lenient: bool = False  # some row verifies with leniency l < 1 (per-row l; exact rows keep the exact rule)
    processed: bool = False  # some row has logits processors (`core.processors`): p and q are processed
    constrained: bool = False  # some row has a host `TokenConstraint`: the step runs eagerly (host calls)
    top_logprobs: int = 0  # the most alternatives per token some row asks for (`SamplingParams.top_logprobs`)
    ngram_sizes: tuple[int, ...] = ()  # the rows' distinct no_repeat_ngram_size values (> 0), sorted
    bad_words: bool = False  # some row has bad_words_ids

    @classmethod
    def of(cls, params) -> "Flavor":
        """What one request (its `SamplingParams`) needs of a step."""
        return cls(params.greedy, params.sampling.filters, params.logprobs, params.leniency != 1.0,
                   bool(params.processors), params.constraint is not None, params.top_logprobs,
                   (params.no_repeat_ngram_size,) if params.no_repeat_ngram_size else (), bool(params.bad_words_ids))

    @classmethod
    def union(cls, flavors) -> "Flavor":
        """What a step running requests of these flavors needs."""
        flavors = list(flavors)
        used = {name for f in flavors for name in f.filters}
        return cls(all(f.all_greedy for f in flavors), tuple(f.name for f in FILTERS if f.name in used),
                   any(f.logprobs for f in flavors), any(f.lenient for f in flavors), any(f.processed for f in flavors),
                   any(f.constrained for f in flavors), max((f.top_logprobs for f in flavors), default=0),
                   tuple(sorted({n for f in flavors for n in f.ngram_sizes})), any(f.bad_words for f in flavors))


class StepView:
    """The first b slots of the state over the first `num_positions` positions, and per-row sampling."""

    source = None  # no encoder input (prompt lookup reads `tokens` / `lengths` like a TokenBuffer)
    coupled = False  # bitwise mode: drafts race q with the noise the target races (`core.verify_coupled`)

    def __init__(self, state: SlotState, batch: int, num_positions: int, flavor: Flavor):
        rows = slice(0, batch)
        self.batch, self.num_positions, self.flavor = batch, num_positions, flavor
        self.tokens = state.tokens[rows, :num_positions]
        self.lengths = state.lengths[rows]
        self.seed = state.seed[rows]
        self.temperature = state.temperature[rows]
        self.leniency = state.leniency[rows] if flavor.lenient else None  # [b] l per row, read only when some row is lenient
        self.filters = {name: getattr(state, name)[rows] for name in flavor.filters}  # what some row turns on
        self.processors = self.history = None
        if flavor.processed:  # views of the slots' processor state (`SlotState.enable_processors`)
            p, h = state.processors, state.history
            self.processors = ProcessorRows(p.repetition[rows], p.frequency[rows], p.presence[rows],
                                            p.min_tokens[rows], p.stop_ids[rows], p.bias[rows], p.ngram[rows],
                                            p.words[rows] if flavor.bad_words else None)
            self.history = TokenHistory(h.prompt_seen[rows], h.counts[rows], h.generated[rows])
        self.constraints: list | None = None  # per row (None = none); the engine sets them before each step

    def process(self, logits: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """The verify pass's logits `[b, γ+1, V]` processed along the draft `[b, γ]` (unchanged without
        processors): p̃ at every position (`core.processors.process_draft`)."""
        if self.processors is None:
            return logits
        vocab = logits.shape[-1]
        allowed = None if self.constraints is None else constraint_masks(self.constraints, draft, vocab, logits.device)
        banned = text_bans(self.processors, self.flavor.ngram_sizes, self.tokens, self.lengths, draft, vocab)
        return process_draft(logits, draft, self.processors, self.history, allowed, banned)

    def _process_one(self, logits: torch.Tensor, drafted: list[torch.Tensor]) -> torch.Tensor:
        """A drafter's logits `[b, V]` at the position after `drafted` (tokens [b] each) → q̃'s logits."""
        if self.processors is None or logits.shape[-1] != self.history.counts.shape[1]:
            return logits
        prefix = torch.stack(drafted, 1) if drafted else self.lengths.new_zeros(self.lengths.shape[0], 0)
        allowed = None if self.constraints is None else \
            constraint_masks(self.constraints, prefix, logits.shape[-1], logits.device)[:, -1:]
        history = advance(self.history, prefix) if drafted else self.history
        banned = text_bans(self.processors, self.flavor.ngram_sizes, self.tokens, self.lengths, prefix, logits.shape[-1])
        return process_draft(logits[:, None], prefix[:, :0], self.processors, history, allowed,
                             None if banned is None else banned[:, -1:])[:, 0]

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's standardized law: logits `[b, k, V]` → probabilities `[b, k, V]`."""
        return standardize_rows(logits, self.temperature, self.filters)

    def draw(self, logits: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft token per row from logits `[b, V]` at absolute `position [b]` → (token [b], q [b, V] or None)."""
        if self.flavor.all_greedy:  # (torch.argmax's tokens; its one-block reduction is slow on large vocabularies)
            return argmax(logits), None
        q = self.probs(logits[:, None])[:, 0]
        stream = rng.NEXT if self.coupled else rng.DRAFT  # (bitwise: the noise the target races at that position)
        return rng.sample(q, self.seed, position, stream), q  # on CUDA one fused kernel, no [b, V] noise

    def draft_chain(self, gamma: int, next_logits, forward_passes: int) -> Proposal:
        """γ tokens drawn one after another (`draw`, at positions lengths + i): next_logits(i, previous token
        [b] or None) → the logits `[b, V]` of token i → `Proposal(tokens [b, γ], q [b, γ, V] or None, lengths
        None: every row drafts all γ, forward_passes: the drafter's model calls, as the caller counts them)`."""
        tokens, probs, token = [], [], None
        for i in range(gamma):
            token, q = self.draw(self._process_one(next_logits(i, token), tokens), self.lengths + i)
            tokens.append(token)
            if q is not None:
                probs.append(q)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None, None, forward_passes)


def refeed_window(view: "StepView", cache, width: int = WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """A model drafter's re-feed: its cache view rolled back to each row's length − `width` (`WINDOW`), and the last
    `width` tokens of each row `[b, width]` with their validity (False before a row's first token) to feed again."""
    lengths = view.lengths
    pos = lengths[:, None] - width + torch.arange(width, device=lengths.device)[None, :]
    valid = pos >= 0
    cache.lengths.copy_((lengths - width).clamp_min(0))
    return view.tokens.gather(1, pos.clamp_min(0)) * valid, valid


class SlotModel(DraftState):
    """The engine's state holder of a `drafters.model.ModelDrafter` (the one model drafter class; the cross-vocabulary
    one too): a small `FastLlama` and its own slot cache, which the engine prefills, catches up, moves and captures.

    inputs: `[V_t]` the draft id fed for each target id (`ModelDrafter.engine_inputs`: a cross-vocabulary draft's
    one-token spelling, so the draft's text keeps the target's positions), None = the same ids; state: the engine's
    `SlotState`, whose tokens a spelled prefill reads (static tensors: a prefill graph replays them)."""

    on_engine = True

    def __init__(self, model: FastLlama, max_batch: int, num_positions: int, *, inputs: torch.Tensor | None = None,
                 state: SlotState | None = None):
        if inputs is not None and state is None:
            raise ValueError("SlotModel: spelled inputs need the engine's state (state=)")
        self.model, self.state = model, state
        self.cache = SlotCache(model, max_batch, num_positions)
        self.vocab_size = model.shape.vocab_size
        self.inputs = None if inputs is None else inputs.to(model.device)
        self._view = None  # this proposal's cache view (`feed` rolls it back, `step` appends)

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.inputs is None else self.inputs[tokens]

    def _entries(self, rows: slice, first: int, width: int) -> torch.Tensor:
        """The draft's input vectors at positions [first, first + width) of `rows`: `[b, width, dim]`."""
        tokens = self.state.tokens[rows]
        cols = (first + torch.arange(width, device=tokens.device)).clamp(max=tokens.shape[1] - 1)
        return self._embed(tokens[:, cols])

    def _entries_at(self, rows: slice, cols: torch.Tensor) -> torch.Tensor:
        """`_entries` at per-row positions `cols [b, width]`."""
        tokens = self.state.tokens[rows]
        return self._embed(tokens.gather(1, cols.clamp(max=tokens.shape[1] - 1)))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target tokens `[b, k]` → the draft's input vectors `[b, k, dim]` (its own embedding scale applied)."""
        x = embedding(self._ids(tokens), self.model.embed)  # (a GGUF table kept quantized: its rows gathered)
        scale = self.model.shape.arch.embed_scale
        return x if scale is None else x * torch.tensor(scale, dtype=x.dtype)

    def prefill(self, state: SlotState, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the slots in `rows` (eager; the cache then holds them).
        extent, graphs: as `prefill_rows` (extent: no row holds an entry at or past it that must survive, None =
        unknown; graphs: a `PrefillGraphs` replaying chunk shapes seen before, None = eager)."""
        prefill_rows(self.model, self.cache, state, rows, starts, ends, chunk, extent=extent, graphs=graphs,
                     embeds=None if self.inputs is None else self._entries)

    def prefill_ragged(self, state: SlotState, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                       extent: int | None = None) -> None:
        """`prefill` with each row's columns from its own start (`slots.prefill_ragged`: rows at different offsets,
        a catch-up's, share a forward without computing the columns between them)."""
        prefill_ragged(self.model, self.cache, state, rows, starts, ends, chunk, extent=extent,
                       embeds=None if self.inputs is None else self._entries_at)

    def feed(self, context: StepView, width: int = WINDOW) -> torch.Tensor:
        """Re-feed each row's last `width` (`WINDOW`) committed tokens (rejected drafts are overwritten, never rolled
        back) → the first draft's logits `[b, V_d]`."""
        self._view = self.cache.view(slice(0, context.batch), context.num_positions)
        window, valid = refeed_window(context, self._view, width)
        return self.model(self._ids(window), self._view, valid, last_only=True)[:, 0]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(self._ids(tokens)[:, None], self._view, last_only=True)[:, 0]


# The name the engine's runner, beams and token trees read (`type(drafter) is EngineModelDrafter`: a plain model
# drafter on the engine's state — the cross-vocabulary subclass grows no trees): the one model drafter class.
EngineModelDrafter = ModelDrafter
