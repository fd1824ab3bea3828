"""What passes between the engine's scheduler and its runner: one decode/verify step, as a frozen record.

The scheduler decides who runs; the engine turns that into a `StepInput` and the runner (`engine/runner.py`) runs it,
returning the step's `step.StepRecord` (row i = slot i), which `engine.commit` folds back into the scheduler's books.
vLLM's `SchedulerOutput` → `ModelRunnerOutput` has the same place. The running rows are slots 0..num_rows−1 (the
scheduler's invariant), so the record names them by count; their tokens, lengths and parameters are already in the
runner's slot state (written at admission), and rollback is the lengths the verify pass leaves behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.engine.drafters import Flavor

__all__ = ["PrefillChunks", "StepInput"]


@dataclass(frozen=True)
class PrefillChunks:
    """The filling rows' prompt chunks a mixed step feeds in its one target forward (`EngineConfig.mixed_step`,
    `engine/mixed_step.py`): slot `slots[i]` is fed prompt positions [starts[i], ends[i]); `lengths` are the running
    rows' committed lengths (host: their verify rows start at length − 1, as `state.lengths` holds on the device)."""

    slots: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))


@dataclass(frozen=True)
class StepInput:
    """One step over the running rows (slots 0..num_rows−1) at one step shape.

    batch: the batch bucket (rows past num_rows are idle or filling slots: padding); positions: the length bucket
    the step attends over; gamma: the step's γ (each row drafts at most min(γ, its cap)), a tree's depth for a
    token-tree step; tree: the `SamplingParams.draft_tree` branching of a tree step (None: a chain); draft_caps: each
    slot's cap as the verify pass reads it, `[max_batch]` ("auto" rows: max_draft_tokens, idle slots 0) — the same
    tuple object while the rows keep their caps; constraints: the rows' host `TokenConstraint`s in slot order, padded
    with None to the batch (a constrained flavor only); prefill: the filling rows' chunks riding in the same target
    forward (a mixed step: at a bounded shape, `engine/mixed_shapes.py`; None: a decode/verify step alone)."""

    num_rows: int
    batch: int
    gamma: int
    positions: int
    flavor: Flavor
    draft_caps: tuple[int, ...]
    tree: tuple[int, ...] | None = None
    constraints: tuple | None = None
    prefill: PrefillChunks | None = None

