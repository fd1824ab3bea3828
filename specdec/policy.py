"""Draft-length policies: how many tokens to draft next (γ), chosen before every step.

The decoding loop asks `num_draft_tokens()` before a step (0 = plain decoding for that step) and
reports the step's outcome through `update()`. `confidence_threshold()` lets a model drafter stop
drafting a row early once it is unsure of its own draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepOutcome:
    """What one speculative step reports to the policy.

    num_accepted   [B] long   drafted tokens accepted per active row
    draft_lengths  [B] long   drafts actually proposed per row (≤ num_draft_tokens)
    """

    num_draft_tokens: int
    num_accepted: torch.Tensor
    draft_lengths: torch.Tensor
    draft_time_s: float
    verify_time_s: float


class DraftLengthPolicy:
    """Base class: a fixed γ unless a subclass adapts it."""

    def num_draft_tokens(self) -> int:
        raise NotImplementedError

    def confidence_threshold(self) -> float | None:
        return None

    def update(self, outcome: StepOutcome) -> None:
        pass


class FixedPolicy(DraftLengthPolicy):
    """Always draft γ tokens (the paper's setting)."""

    def __init__(self, num_draft_tokens: int):
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
        self.gamma = num_draft_tokens

    def num_draft_tokens(self) -> int:
        return self.gamma

    def __repr__(self) -> str:
        return f"FixedPolicy({self.gamma})"


def resolve_policy(spec: "int | str | DraftLengthPolicy") -> DraftLengthPolicy:
    """An int → FixedPolicy; a policy object passes through."""
    if isinstance(spec, DraftLengthPolicy):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        return FixedPolicy(spec)
    raise ValueError(f"num_draft_tokens must be an int >= 1 or a DraftLengthPolicy, got {spec!r}")
