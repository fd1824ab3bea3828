"""The drafter protocol, written down for both runners: what the eager loop calls and what the engine calls.

A drafter proposes γ tokens per row AND the q it sampled them from (None = deterministic, one-hot q); the
verification rule (`core.verify`) then makes the output law exactly the target's. The two runners hold the
text differently, so they call a drafter through two doors; a drafter may open either or both:

  LoopDrafter   the eager transformers loop (`specdec.loop`: chains, token trees): the batch's committed
                text is a `TokenBuffer`; `begin` starts a batch, `propose(context, γ, sampling, generator,
                confidence_threshold) -> Proposal`, `commit(context)` drops state built on rejected drafts,
                `select_rows(index)` follows finished rows out. `drafters.base.Drafter` is its base class.
  SlotDrafter   the engine (`specdec.engine`): the committed text lives in the slot state; every step calls
                `propose(view, γ) -> (tokens [b, γ], q [b, γ, V] | None, lengths [b] | None)` with no host
                synchronization (the step is captured as a CUDA graph) and `forward_passes(γ)` for the
                statistics. Capabilities the engine looks for, each a protocol of its own:
    CachedSlotDrafter   keeps its own slot cache (`model`, `cache`): the engine prefills admitted rows,
                        catches up rows that ran plain steps, and moves a finished slot's row (`prefill`, `move`)
    FeatureSlotDrafter  reads the target's hidden states (EAGLE, Medusa): `needs_features`, `feature_dim`,
                        `feature_layers` (None = the final-normed state; EAGLE-3: the states entering those layers)

The protocols are `runtime_checkable`: the runners find a drafter's capabilities with `isinstance`, never by
probing attribute names. (Only methods and attributes are checked, not their signatures.) `as_drafter` is the
loop's entry: a transformers model becomes a `ModelDrafter` (`Seq2SeqModelDrafter`), vocabularies checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from specdec.core import SamplingConfig
from specdec.sequences import TokenBuffer

if TYPE_CHECKING:  # the engine's types, named for the reader; drafters never import the engine
    from specdec.drafters.base import Proposal

__all__ = ["LoopDrafter", "SlotDrafter", "CachedSlotDrafter", "FeatureSlotDrafter", "as_drafter", "check_same_vocabulary"]


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
    """What the engine calls every step (see the module doc). `view` is an `engine.drafters.StepView`."""

    def propose(self, view, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """→ (tokens `[b, γ]`, q `[b, γ, V]` or None when every row's q is one-hot, lengths `[b]` or None = all γ);
        no host synchronization (captured in a graph)."""

    def forward_passes(self, gamma: int) -> int:
        """Drafter model calls one proposal of γ tokens takes (0 for table and lookup drafters)."""


@runtime_checkable
class CachedSlotDrafter(SlotDrafter, Protocol):
    """A slot drafter with its own slot cache over a `fast.model.FastLlama`-like `model` (RoPE tables built by
    the engine before any capture). `cache` is an `engine.slots.SlotCache`; `state` an `engine.slots.SlotState`."""

    model: torch.nn.Module
    cache: object

    def prefill(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the slots in `rows` into the cache."""

    def move(self, src: int, dst: int, num_positions: int | None = None) -> None:
        """Slot `src`'s cache into slot `dst` over its first `num_positions` positions (None = all)."""


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
