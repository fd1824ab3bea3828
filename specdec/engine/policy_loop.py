"""A draft-length policy (`specdec.policy`: fixed, heuristic, optimal, threshold, guarded, or a user's
`DraftLengthPolicy`) choosing the engine's γ, with the loop's semantics (`loop.chain`) step by step.

    engine.policy.set_fixed(HeuristicPolicy())   # what `specdec.generate(..., num_draft_tokens="heuristic")` does

Before a step the policy is asked `num_draft_tokens()` once; the step's γ is that, clamped as the loop clamps it
(`request.step_num_draft_tokens`: to what the running row with the most tokens still to go can commit, and to the
engine's `max_draft_tokens`, which `engine.generate` sizes to the policy's own bound, `declared_max`). After the step
it is told `update(StepOutcome(γ, accepted [B], drafted [B], draft seconds, verify seconds))` over the rows the
step ran, slot order, a row that finished in that step included — the step record's per-row counts and the runner's
draft and verify clocks (`Runner.run`). Every chain step reports, a step shape's first run (its capture) too: the
"auto" policy's timing skips those, a draft-length policy's feedback does not (`GammaPolicy.observe`). One policy
for all the rows, as on the loop: they share one verify pass, so one γ.

Per row, where the engine is not the loop's static batch (tests/engine/test_policy_loop.py):
  - a row drafts at most what its own budget can still commit (min(γ, its remaining − 1), `engine.step_runner`);
    the loop's batch drafts the step's γ on every row. A row near its end reports its own, shorter draft (in
    `draft_lengths`) and its accepted count of it: at batch 1 the two runners tell the policy the same.
  - a row with its own cap (`SamplingParams.num_draft_tokens` an int) drafts exactly that cap; the other rows take
    the policy's γ (the step's shape is the largest of these).
  - rows join and leave with continuous batching (more requests than slots, `Engine.add_request` mid-run): the
    policy sees each step's rows.
  - `confidence_threshold()` is not honoured: the engine's drafters draft in a captured graph with no host stop,
    so a `ThresholdPolicy` drafts its `max_draft_tokens` every step, as its doc says of drafters that do not know
    their confidence (its γ sequence is the loop's; its rows' draft lengths are γ).
Timings: the runner's draft and verify halves; a cached drafter's catch-up after plain steps runs before them
(`engine.admission`), where the loop's model drafter feeds its lag inside `propose` (so inside its draft time).
With CUDA graphs the step runs at the smallest built shape at or above γ where γ's is not built (its rows keep
their caps, so nothing changes but a capture saved). Exactness never depends on γ.
"""

from __future__ import annotations

import torch

from specdec.policy import DraftLengthPolicy, StepOutcome, resolve_policy
from specdec.request import MAX_NUM_DRAFT_TOKENS, step_num_draft_tokens

__all__ = ["LoopChoice", "declared_max", "loop_choice"]

_DEFAULT_MAX = 8  # the engine's size for a policy that declares no bound (`declared_max`)


def declared_max(policy: DraftLengthPolicy) -> int:
    """The largest γ `policy` may ask: its `max_draft_tokens`, a `FixedPolicy`'s γ, a guard's inner policy's; 8 for
    one that declares none (a larger ask is clamped to the engine's size, as the loop clamps to a drafter's limit)."""
    inner = getattr(policy, "inner", None)
    if isinstance(inner, DraftLengthPolicy):
        return declared_max(inner)
    for name in ("max_draft_tokens", "gamma"):
        value = getattr(policy, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_NUM_DRAFT_TOKENS:
            return value
    return _DEFAULT_MAX


def loop_choice(spec, max_draft_tokens: int) -> "LoopChoice | None":
    """A `LoopChoice` for a `DraftLengthPolicy` or a policy name (`resolve_policy`: reset for a new call); None for
    an int or "auto" (the engine's own choice)."""
    if isinstance(spec, DraftLengthPolicy) or (isinstance(spec, str) and spec != "auto"):
        return LoopChoice(resolve_policy(spec), max_draft_tokens)
    return None


def _remaining(request) -> int:
    """The tokens a running request may still commit."""
    return request.params.max_new_tokens - request.generated_before - (request.length - len(request.prompt))


class LoopChoice:
    """One call's draft-length policy on the engine (see the module doc): `choose` before a step, `observe` after.

    policy   the `DraftLengthPolicy`
    asked    the γ of each step, as the policy was told it (the outcomes' `num_draft_tokens`), a read-out
    """

    def __init__(self, policy: DraftLengthPolicy, max_draft_tokens: int):
        if not isinstance(policy, DraftLengthPolicy):
            raise TypeError(f"num_draft_tokens: expected a DraftLengthPolicy, got {type(policy).__name__}")
        self.policy, self.max_draft_tokens = policy, max_draft_tokens
        self.asked: list[int] = []
        self._pending: tuple[int, int] | None = None  # (γ told, rows) of the step chosen and not yet observed
        self._caps: tuple[int, ...] | None = None  # the last caps handed out (the same object while unchanged)

    def choose(self, running, ready=None, caps=None) -> tuple[int, tuple[int, ...]]:
        """→ (the step's γ, the verify caps per running row) for `running` (slot order). caps: per row its fixed cap
        or None (takes the policy's γ); None = every row takes it. ready(γ): whether the step shape at γ is built."""
        most = max((_remaining(r) for r in running), default=0)
        gamma = step_num_draft_tokens(self.policy.num_draft_tokens(), most, self.max_draft_tokens)
        rows = tuple(gamma if c is None else c for c in (caps if caps is not None else [None] * len(running)))
        step = max(rows, default=0)
        if ready is not None and not ready(step):
            built = [g for g in range(step + 1, self.max_draft_tokens + 1) if ready(g)]
            step = min(built, default=step)
        if rows != self._caps:
            self._caps = rows
        self._pending = (gamma, len(running))
        return step, self._caps

    def observe(self, record) -> None:
        """The step's `StepRecord` (rows in slot order) → the policy's `update`, as the loop tells it."""
        if self._pending is None:
            return
        gamma, n = self._pending
        self._pending = None
        counts = torch.tensor([record.num_accepted[:n], record.num_drafted[:n]], dtype=torch.long).reshape(2, n)
        self.asked.append(gamma)
        self.policy.update(StepOutcome(gamma, counts[0], counts[1], record.draft_time_s, record.verify_time_s))

    def __repr__(self) -> str:
        return f"LoopChoice({self.policy!r})"
