"""The target protocol, written down: what the eager loop calls on a target, and the adapters' entry.

A target owns its KV cache; its text per row is a sequence of valid slots (ARCHITECTURE.md, "The target
contract"). `Target` is what every target offers (`HFCausalLM`, `HFSeq2SeqLM`, `fast.target.FastTarget`,
`fast.seq2seq.FastSeq2SeqTarget`, or a user's own object); `as_target` turns a transformers model into one,
refusing before any compute what the adapters cannot roll back (`check_supported_model`). `own_methods` names the
protocol methods a user's class defines (the engine never calls them: such a target runs on the eager loop).

Optional, with the default the loop assumes when absent (class attributes of the adapters):
  drop_finished_rows     True: finished rows leave the batch (`select_rows`); False for static shapes (the loop
                         masks finished rows instead)
  begin_forward_passes   1: target passes `begin` takes (statistics)
  max_draft_tokens       None: the largest γ the target verifies (a static cache sizes it)
  encode                 present on encoder-decoder targets, with `position_limit` (None = relative positions)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specdec.sequences import TokenBuffer

__all__ = ["Target", "as_target", "check_supported_model", "own_methods"]


@runtime_checkable
class Target(Protocol):
    """What the eager loop calls on a target (see the module doc). p is the target's law.

    vocab_size   V, the width of the logits
    device       where its tensors live
    """

    vocab_size: int

    @property
    def device(self) -> torch.device: ...

    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Prefill everything but each row's last committed token → the committed text."""

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append `tokens [B, k]` (`valid [B, k]`: slots that hold text) to every row in one pass → logits `[B, k, V]`."""

    def crop(self, lengths: torch.Tensor | int) -> None:
        """Roll back to absolute per-row lengths `[B]` (never "remove the last n")."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` `[B']`."""


#: the protocol's methods (what a target computes its law and keeps its cache by)
_METHODS = ("begin", "forward", "crop", "select_rows")


def own_methods(target) -> tuple[str, ...]:
    """The `Target` methods `target`'s class defines outside specdec (a user's target, or a user's subclass of
    `HFCausalLM` overriding them); () for specdec's own targets and for anything that is not a `Target` (a
    transformers model). The engine runs the transformers model a specdec target wraps with its own cache and
    attention, so it would not call these: such a target runs on the eager loop."""
    if isinstance(target, torch.nn.Module) or not isinstance(target, Target):
        return ()
    found = []
    for name in _METHODS:
        owner = next((k for k in type(target).__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("specdec."):
            found.append(name)
    return tuple(found)


def check_supported_model(config, what: str = "model") -> None:
    """Refuse, before any compute, a transformers config whose attention the adapters cannot roll back.

    The adapters crop a per-layer key/value cache to absolute lengths; transformers builds a sliding-window
    (or other non-plain) cache layer for sliding-window attention (Mistral with `sliding_window` set,
    Gemma 2/3, Qwen2 with `use_sliding_window`) and for linear/recurrent layers, and those cannot be cropped.
    """
    from transformers import DynamicCache  # dependency at the edge

    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < 1:
        raise ValueError(f"{what}: config.vocab_size must be >= 1, got {vocab}")
    try:
        layers = DynamicCache(config=config).layers
    except Exception as err:  # noqa: BLE001 - any failure here means a layout we do not know
        raise ValueError(f"{what}: cannot build a key/value cache for this config ({type(err).__name__}: {err})") from None
    kinds = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
    if kinds:
        window = getattr(config, "sliding_window", None)
        hint = ("; the fast engine runs sliding windows (engine='auto' or 'fast') for the families it covers"
                if isinstance(window, int) else "")
        raise ValueError(
            f"{what}: {getattr(config, 'model_type', '?')} uses attention specdec cannot roll back "
            f"({', '.join(kinds)}: sliding-window or recurrent layers){hint}"
        )


def as_target(target) -> Target:
    """A specdec target from a transformers model (or a `Target`, passed through)."""
    if isinstance(target, Target):
        return target
    config = getattr(target, "config", None)
    if config is None or not isinstance(target, torch.nn.Module):
        raise TypeError(f"target must be a transformers model or a specdec target, got {type(target).__name__}")
    check_supported_model(config, "target")
    if getattr(config, "is_encoder_decoder", False):
        from specdec.models.seq2seq import HFSeq2SeqLM

        return HFSeq2SeqLM(target)
    from specdec.models.hf import HFCausalLM

    return HFCausalLM(target)
