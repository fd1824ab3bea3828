"""A smaller causal LM as drafter: ONE class for both runners, its KV cache in the runner's state holder.

The rule is written once (`chain_proposal`): feed what the draft's cache has not seen → logits of the first
draft; then γ times draw a token and feed it. The draws are the runner's, through the one proposal call
`draft_chain(γ, next_logits, forward_passes)`: the engine's `StepView` (each row its own law, processors and
counter-based seed) or the loop's `base.LoopDraws` (one law and one generator for the batch). Where the cache lives,
and how rejected drafts leave it, is the state holder's:

  LoopState    a transformers cache in lockstep with the loop's one static batch (`HFCausalLM`, `HFSeq2SeqLM`):
               feeds the unseen tail, `commit` crops to the committed text, `select_rows` drops finished rows
  engine       `engine.drafters.SlotModel`: a slot cache over the engine's body of the model, prefilled, caught
               up and moved by the engine; each proposal re-feeds a window instead of cropping, no host sync
  fast loop    `fast.target.FastLoopState`: a `FastLlama` cache behind the loop, the proposal one CUDA graph

A state holder is a `DraftState`: `model`, `vocab_size`, `feed(context) -> logits [B, V_d]`, `step(tokens [B]) ->
logits [B, V_d]`, `run` (a state that captures the proposal replays it); loop states also `begin` / `commit` /
`select_rows`, the engine's `cache` / `prefill` / `prefill_ragged`. `engine.build` binds a drafter to the engine:
`with_state(SlotModel(...))`, the same class over the engine's state.
"""

from __future__ import annotations

import copy

import torch

from specdec.core import SamplingConfig
from specdec.drafters.base import Drafter, LoopDraws, Proposal
from specdec.models.hf import HFCausalLM
from specdec.sequences import TokenBuffer

__all__ = ["ModelDrafter", "DraftState", "LoopState", "StateHeld", "chain_proposal"]


class DraftState:
    """What a `ModelDrafter`'s state holder is (see the module doc); `on_engine`: the engine's slot state."""

    on_engine = False
    model: torch.nn.Module
    vocab_size: int

    def feed(self, context) -> torch.Tensor:
        """The first draft's logits `[B, V_d]`, after feeding what the cache has not seen of `context`."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one draft per row `[B]` → the next draft's logits `[B, V_d]`."""
        raise NotImplementedError

    def run(self, context, draws, num_draft_tokens: int, chain) -> Proposal:
        """One proposal: `chain(self, context, draws, γ)` (a state that captures it replays a graph of it instead)."""
        return chain(self, context, draws, num_draft_tokens)


class LoopState(DraftState):
    """The loop's state holder: `lm` (an `HFCausalLM`-like adapter) holds committed tokens plus this step's drafts;
    `commit` crops back to the committed prefix, so the next `feed` runs only the tokens it has not seen (1 or 2)."""

    def __init__(self, lm):
        self.lm = lm
        self.model, self.vocab_size = lm.model, lm.vocab_size

    def begin(self, context: TokenBuffer) -> None:
        self.lm.reset(context.batch_size)

    def feed(self, context: TokenBuffer) -> torch.Tensor:
        unseen = context.lengths - self.lm.lengths  # ≥ 1: at least the last committed token
        block, valid = context.tail(int(unseen.max()), unseen)
        return self.lm.forward(block, valid)[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm.forward(tokens[:, None])[:, -1]

    def commit(self, context: TokenBuffer) -> None:
        # Keep what is still committed text: the old prefix and the accepted drafts (never the last token, which
        # the next step feeds).
        self.lm.crop(torch.minimum(self.lm.lengths, context.lengths - 1))

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)


def chain_proposal(state: DraftState, context, draws, num_draft_tokens: int, target_logits=None) -> Proposal:
    """The model drafter's rule, written once: feed what `state`'s cache lacks of `context`, then draw (`draws`: the
    engine's `StepView` or the loop's `LoopDraws`) and feed γ tokens, one model call each; target_logits maps the
    draft's logits `[B, V_d]` into the target's vocabulary (None: the same)."""
    first = state.feed(context)

    def next_logits(i: int, prev: torch.Tensor | None) -> torch.Tensor:
        logits = first if i == 0 else state.step(prev)
        return logits if target_logits is None else target_logits(logits)

    return draws.draft_chain(num_draft_tokens, next_logits, num_draft_tokens)


class StateHeld:
    """A drafter whose model and, on the engine, slot caches its state holder `self.state` holds: the engine's
    capabilities of a cached drafter (`drafters.protocol.CachedSlotDrafter`) passed to it (`ModelDrafter`, over a
    `SlotModel`; `engine.hierarchy.EngineHierarchy`, over its middle model's or a `engine.slot_group.SlotGroup`)."""

    state: DraftState

    @property
    def model(self) -> torch.nn.Module:
        """The draft model the state holds (a transformers model on the loop; the engine's `FastLlama`)."""
        return self.state.model

    @property
    def cache(self):
        return self.state.cache

    @cache.setter
    def cache(self, value) -> None:  # (the engine swaps in the paged pool's cache)
        self.state.cache = value

    def prefill(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the engine's slots in `rows` (`SlotModel.prefill`)."""
        self.state.prefill(state, rows, starts, ends, chunk, extent=extent, graphs=graphs)

    def prefill_ragged(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                       extent: int | None = None) -> None:
        """`prefill` with each row's columns from its own start (`SlotModel.prefill_ragged`)."""
        self.state.prefill_ragged(state, rows, starts, ends, chunk, extent=extent)


class ModelDrafter(StateHeld, Drafter):
    """Drafts autoregressively with a draft model over the target's vocabulary (see the module doc).

    `ModelDrafter(model)` (a transformers model) drafts on the loop; `engine.build` binds it to the engine
    (`with_state`). `state=`: a state holder of one's own (`fast.target.FastDrafter`, the engine's `SlotModel`).
    """

    accepts_processor = True

    def __init__(self, model: torch.nn.Module | None = None, *, state=None):
        if (model is None) == (state is None):
            raise TypeError("ModelDrafter takes a draft model or a state holder (state=), exactly one")
        self.state = LoopState(HFCausalLM(model)) if state is None else state
        self.vocab_size = self.state.vocab_size

    @property
    def on_engine(self) -> bool:
        """Whether the state is the engine's (a slot cache: the engine calls this drafter as it is)."""
        return self.state.on_engine

    def with_state(self, state) -> "ModelDrafter":
        """This drafter (its kind and its settings, a bridge included) over another state holder; this one keeps its
        own."""
        bound = copy.copy(self)
        bound.state = state
        return bound

    def engine_inputs(self) -> torch.Tensor | None:
        """The draft id the engine feeds for each target id `[V_t]` (None: the same ids; `CrossVocabDrafter`)."""
        return None

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits `[B, V_d]` over the target's vocabulary `[B, V]` (here the same)."""
        return logits

    # -- the loop's calls (`drafters.protocol.LoopDrafter`)
    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        self._claim(context)
        self.state.begin(context)

    @torch.inference_mode()
    def propose(self, context, num_draft_tokens: int, sampling: SamplingConfig | None = None,
                generator: torch.Generator | None = None, confidence_threshold: float | None = None,
                processor=None) -> Proposal:
        """Drafts `[B, γ]` and the q `[B, γ, V]` they were drawn from (None = one-hot). The engine calls
        `propose(view, γ)` (its view draws); the loop passes its law (processor: `Drafter.accepts_processor`)."""
        if sampling is None:
            draws = context
        else:
            self._check_owner(context)
            draws = LoopDraws(sampling, generator, confidence_threshold=confidence_threshold, processor=processor)
        return self.state.run(context, draws, num_draft_tokens, self._chain)

    def _chain(self, state: DraftState, context, draws, num_draft_tokens: int) -> Proposal:
        return chain_proposal(state, context, draws, num_draft_tokens, self.target_logits)

    def commit(self, context: TokenBuffer) -> None:
        self._check_owner(context)
        self.state.commit(context)

    def select_rows(self, index: torch.Tensor) -> None:
        self.state.select_rows(index)
