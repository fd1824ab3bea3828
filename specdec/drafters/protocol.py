"""The drafter protocol, written down once for both runners: one family, one proposal record.

A drafter proposes γ tokens per row AND the q it sampled them from (None = deterministic, one-hot q); the
verification rule (`core.verify`) then makes the output law exactly the target's. Whichever runner calls it,
`propose` starts with the same two arguments and returns the same record:

    propose(context, num_draft_tokens, ...) -> Proposal(tokens [B, γ], probs [B, γ, V] | None, lengths [B] | None,
                                                       forward_passes)

`context` is the batch's committed text: `tokens [B, ≥ L]` right-padded and `lengths [B]` (so a text rule runs
unchanged under both runners: `PromptLookupDrafter` and `NGramDrafter` are ONE class each, called by the loop with
its sampling arguments and by the engine without). The members of the family differ only in what else a call
carries:

  LoopDrafter   the eager transformers loop (`specdec.loop.chain`): `context` is a `TokenBuffer`;
                `propose(context, num_draft_tokens, sampling, generator, confidence_threshold=None)`, plus
                `begin` (a batch starts), `commit(context)` (drop state built on rejected drafts) and
                `select_rows(index)` (finished rows leave). `drafters.base.Drafter` is its base class.
  SlotDrafter   the engine (`specdec.engine`): `context` is an `engine.drafters.StepView` over the slot state;
                `propose(context, num_draft_tokens)`, no host synchronization (captured as a CUDA graph).
                Capabilities the engine looks for, each a protocol of its own:
    CachedSlotDrafter   keeps its own slot cache (`model`, `cache`): the engine prefills admitted rows,
                        catches up rows that ran plain steps, and moves a finished slot's row (`prefill`, `move`)
    FeatureSlotDrafter  reads the target's hidden states (EAGLE, Medusa): `needs_features`, `feature_dim`,
                        `feature_layers` (None = the final-normed state; EAGLE-3: the states entering those layers)
  TreeLoopDrafter  token trees on the eager loop (`specdec.loop.tree_decoding`): `propose_tree(context, spec,
                sampling, generator, mode) -> TreeProposal` (tokens `[B, N+1]`, q at the internal nodes
                `[B, M, V]`, forward_passes), plus `begin`, `commit_tree`, `select_rows`. The engine's token trees
                (`engine.tree_step.propose_tree`, from the model drafter's slot state) return the same record.

Why the engine's call has two arguments where the loop's has five: the loop runs ONE sampling law for the
whole batch (`sampling: SamplingConfig`), draws from ONE `torch.Generator` and may stop a draft on the host
(`confidence_threshold`); the engine's rows each have their own temperature, filters, processors and seed, kept
on the device, and its draws are counter-based (`specdec.rng`: a hash of (seed, position, stream)) so that a
request's tokens do not depend on its batch and a captured graph can replay them. Those live on the engine's
`context` (the `StepView`: `temperature`, `filters`, `seed`, `processors`, `draw`, `draft_chain`), where a
graph reads them as static tensors; passing a `SamplingConfig` and a generator too would give two sources for
one law, one of them ignored. The loop's `processor=` keyword (for drafters with `accepts_processor`) is the
engine's `StepView.processors` for the same reason.

The protocols are `runtime_checkable`: the runners find a drafter's capabilities with `isinstance`, never by
probing attribute names. (Only methods and attributes are checked, not their signatures: `SlotDrafter` alone is
"has `propose`", which every member shares — so `is_slot_drafter`, the engine's door (`engine.build.build_drafter`),
adds the one thing `isinstance` cannot see: that `propose` takes the engine's two-argument call. A drafter that does
— prompt lookup, the n-gram tables, or one written against this protocol in the user's own file — runs on the
engine as it is; a loop-only drafter, whose `propose` needs `sampling` and `generator`, is refused by name. The
shared `(context, num_draft_tokens)` head of every shipped drafter's `propose` is checked by
`tests/drafters/test_protocol.py`; a plugin drafter on the engine by `tests/engine/test_plugin_drafter.py`.)
`as_drafter` is the loop's entry: a transformers model becomes a `ModelDrafter` (`Seq2SeqModelDrafter`),
vocabularies checked. A `ModelDrafter` (its cross-vocabulary kind and `fast.FastDrafter` included) is one class for
both runners too, its cache in a state holder: the engine binds it to a state of its own first (`engine.build`:
`with_state`), so `is_slot_drafter` is False for one over the loop's cache.

Writing a drafter for the engine: `propose(context, num_draft_tokens) -> Proposal` over the `StepView`; draw with
`context.draft_chain(γ, next_logits, forward_passes)` (each row's own law, processors and counter-based seed; q is
what was drawn from) or return one-hot tokens with `probs=None`; no host synchronization if it is to be captured
in a CUDA graph (`EngineConfig(cuda_graphs=False)` otherwise). q is checked every step (`core.proposals`).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

import torch

from specdec.core import SamplingConfig
from specdec.sequences import TokenBuffer

__all__ = ["Proposal", "TreeProposal", "LoopDrafter", "SlotDrafter", "CachedSlotDrafter", "FeatureSlotDrafter", "TreeLoopDrafter",
           "AnyDrafter", "is_slot_drafter", "takes_engine_call", "as_drafter", "check_same_vocabulary", "check_drafter_argument"]


@dataclass(frozen=True)
class Proposal:
    """One step's drafts, what every drafter returns to either runner.

    tokens   [B, γ]      long
    probs    [B, γ, V]   the q each token was sampled from; None = deterministic (one-hot q) — on the engine, also
                         when every row of the step is greedy
    lengths  [B]         drafts actually proposed per row (≤ γ): the position after a row's last draft samples
                         from p; None = all γ
    forward_passes       drafter model calls this proposal took (0 for table and lookup drafters); the engine's is
                         fixed per γ, so a captured draft graph's record stays true on every replay
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    forward_passes: int = 0


@dataclass(frozen=True)
class TreeProposal:
    """One step's draft trees (a `core.tree.TreeSpec` shape per row), what a tree drafter returns on either runner.

    tokens   [B, N+1]     long: column 0 is the root (each row's last committed token), then nodes breadth first
    probs    [B, M, V]    q at the M internal nodes (the law their children were drawn from); None = deterministic
                          (on the engine: every row greedy, children the top-k)
    forward_passes        drafter model calls this proposal took (one per level but the leaves')
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    forward_passes: int


@runtime_checkable
class LoopDrafter(Protocol):
    """What the eager loop calls (see the module doc; `drafters.base.Drafter` implements the optional parts).

    vocab_size          the vocabulary it proposes over (None = takes the target's)
    deterministic       proposals do not depend on the generator (q is one-hot)
    accepts_processor   `propose` takes `processor=` (logits processors applied to q along the draft)
    """

    vocab_size: int | None
    deterministic: bool
    accepts_processor: bool

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        """A new batch starts with `context` (prompts or decoder start tokens)."""

    def propose(self, context: TokenBuffer, num_draft_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None, confidence_threshold: float | None = None) -> Proposal:
        """Drafts `[B, γ]`, the q `[B, γ, V]` they were drawn from (None = one-hot), optional lengths `[B]`."""

    def commit(self, context: TokenBuffer) -> None:
        """Verification appended tokens to `context`; drop any state built on rejected drafts."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` `[B']` (finished rows leave the batch)."""


@runtime_checkable
class SlotDrafter(Protocol):
    """What the engine calls every step (see the module doc)."""

    def propose(self, context, num_draft_tokens: int) -> Proposal:
        """`context`: an `engine.drafters.StepView` (b rows of the slot state, their sampling and seeds) →
        `Proposal(tokens [b, γ], probs [b, γ, V] or None when every row's q is one-hot, lengths [b] or None = all
        γ, forward_passes)`; no host synchronization (captured in a graph)."""


@runtime_checkable
class CachedSlotDrafter(SlotDrafter, Protocol):
    """A slot drafter with its own slot cache over a `fast.model.FastLlama`-like `model` (RoPE tables built by
    the engine before any capture). `cache` is an `engine.slots.SlotCache` (the engine moves and swaps its slots
    with the target's: `Runner.move_slot`); `state` an `engine.slots.SlotState`.

    Optional (not part of the protocol, so a drafter written against it keeps working): `prefill_ragged(state,
    rows, starts, ends, chunk, *, extent=None)`, the same feed with each row's columns taken from its own start
    (`engine.slots.prefill_ragged`). Where a drafter has it, the engine feeds its catch-ups and chunked prefill
    through it (rows lagging at different offsets cost rows × the longest lag instead of rows × the span of all
    their offsets); where not, through `prefill`. The engine's model drafter and feature heads have it."""

    model: torch.nn.Module
    cache: object

    def prefill(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the slots in `rows` into the cache."""


@runtime_checkable
class FeatureSlotDrafter(SlotDrafter, Protocol):
    """A slot drafter that reads the target's hidden states, which the engine keeps per committed position.

    needs_features   True
    feature_dim      the width of one position's features
    feature_layers   None = the final-normed state; a tuple = the states entering those target layers (EAGLE-3)
    """

    needs_features: bool
    feature_dim: int
    feature_layers: tuple[int, ...] | None


@runtime_checkable
class TreeLoopDrafter(Protocol):
    """What the eager loop's token trees call (`loop.tree_decoding`; `drafters.tree.TreeModelDrafter`)."""

    vocab_size: int | None

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        """A new batch starts with `context`."""

    def propose_tree(self, context: TokenBuffer, spec, sampling: SamplingConfig, generator: torch.Generator | None,
                     mode: str) -> TreeProposal:
        """`spec` (a `core.tree.TreeSpec`)-shaped trees: tokens `[B, N+1]` (column 0 the root), q at the M internal
        nodes `[B, M, V]` (None = deterministic), the drafter calls taken."""

    def commit_tree(self, context: TokenBuffer, spec, tree_tokens: torch.Tensor) -> None:
        """Verification appended tokens to `context`; keep only the fed nodes of the trees `[B, N+1]` that are
        now committed text."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` `[B']`."""


AnyDrafter = Union[LoopDrafter, SlotDrafter, TreeLoopDrafter]  # the family: what a runner may be handed


def is_slot_drafter(drafter) -> bool:
    """True when the engine can call `drafter` as it is: a `SlotDrafter` whose `propose` binds the engine's call
    `(context, num_draft_tokens)` — the loop's sampling arguments, where it takes them, optional — and, for a
    `ModelDrafter`, holding the engine's state (`engine.build` binds one over the loop's: `with_state`)."""
    from specdec.drafters.model import ModelDrafter

    if isinstance(drafter, ModelDrafter) and not drafter.on_engine:
        return False  # a model drafter over the loop's cache: the engine binds it to its own state first
    return takes_engine_call(drafter)


def takes_engine_call(drafter) -> bool:
    """True when `drafter` is a `SlotDrafter` whose `propose` binds `(context, num_draft_tokens)`."""
    if drafter is None or isinstance(drafter, type) or not isinstance(drafter, SlotDrafter):
        return False
    try:
        inspect.signature(drafter.propose).bind(None, 0)
    except (TypeError, ValueError):  # (ValueError: a builtin without a signature)
        return False
    return True


def as_drafter(drafter, target):
    """A loop drafter from a transformers model (or a `LoopDrafter`, passed through), after checking it proposes
    over `target`'s vocabulary; None stays None (plain decoding)."""
    from specdec.drafters.base import Drafter

    if drafter is None:
        return None
    if not isinstance(drafter, (Drafter, LoopDrafter)):
        config = getattr(drafter, "config", None)
        if config is None or not isinstance(drafter, torch.nn.Module):
            raise TypeError(
                f"drafter must be None, a transformers model or a specdec Drafter, got {type(drafter).__name__}"
            )
        from specdec.models.protocol import check_supported_model

        check_supported_model(config, "drafter")
        target_is_seq2seq = bool(getattr(getattr(target, "config", None), "is_encoder_decoder", False))
        if bool(getattr(config, "is_encoder_decoder", False)) != target_is_seq2seq:
            raise ValueError(
                "drafter and target must both be decoder-only or both encoder-decoder models "
                f"(target is_encoder_decoder={target_is_seq2seq}, drafter is_encoder_decoder={not target_is_seq2seq})"
            )
        if target_is_seq2seq:
            from specdec.drafters.seq2seq import Seq2SeqModelDrafter

            drafter = Seq2SeqModelDrafter(drafter)
        else:
            from specdec.drafters.model import ModelDrafter

            drafter = ModelDrafter(drafter)
    return check_same_vocabulary(drafter, target)


def check_same_vocabulary(drafter, target):
    """`drafter`, after checking it proposes over the target's vocabulary (None = takes the target's)."""
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ: drafter has {drafter.vocab_size} tokens, "
            f"target has {target.vocab_size}; speculative decoding needs the same vocabulary"
        )
    return drafter


#: what `draft=` (`specdec.load`) and `drafter=` (`specdec.generate` / `stream`) accept, for the error
DRAFTER_KINDS = ("None, a checkpoint folder / .gguf file / hub id, 'prompt-lookup' or 'ngram' (draft= of "
                 "specdec.load), a head folder, a transformers model, or a specdec drafter (an object with "
                 "propose or propose_tree)")


def check_drafter_argument(value, name: str = "drafter"):
    """`value` unchanged when it is of a kind some runner takes (see `DRAFTER_KINDS`); TypeError naming `name`
    and what is accepted otherwise — at the call, before anything loads."""
    if value is None or isinstance(value, (str, os.PathLike, torch.nn.Module)):
        return value
    if callable(getattr(value, "propose", None)) or callable(getattr(value, "propose_tree", None)):
        return value
    from specdec.drafters.formats import is_drafter  # a head object or a DrafterFolder

    if is_drafter(value):
        return value
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise TypeError(f"{name} must be {DRAFTER_KINDS}; got {type(value).__name__} ({shown})")
