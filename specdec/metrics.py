"""SpecStats: what a generation run measured, with the paper's formulas next to each field.

Counted over (row, step) pairs: a "row-step" is one active row in one target verification pass.
Returned by `specdec.generate`, never printed by the library.

The fields are written only by the fold below (`add_step`, `add_steps`, `add_counts`, `add_prefill`,
`set_wall_time`, `merge`): a step body emits a `specdec.step.StepRecord` and folds it, nothing else writes.
`Clock` is the step bodies' one timer (the draft and verify times the record carries).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `values`, linear between order statistics; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class SpecStats:
    # --- counts -----------------------------------------------------------------------------------
    num_generated_tokens: int = 0  # tokens returned to the caller (after EOS / max_new_tokens cuts)
    num_steps: int = 0  # target verification passes (batch-level)
    target_calls: int = 0  # all target forward passes, prefill included
    drafter_calls: int = 0  # drafter forward passes (model drafters); table/lookup drafters: 0
    row_steps: int = 0  # Σ_steps active rows
    speculative_row_steps: int = 0  # row-steps in which the row had at least one draft
    drafted_tokens: int = 0  # Σ draft lengths
    accepted_tokens: int = 0  # Σ accepted drafts
    algorithm_tokens: int = 0  # Σ (accepted + 1): tokens the algorithm produced, before any cut
    max_num_draft_tokens: int = 0  # largest γ used
    # β = Σ_x min(p(x), q(x)) at each verified position whose prefix is committed text (positions
    # 1..min(n+1, γ) of a step); α = E[β] (Cor 3.6).
    beta_sum: float = 0.0
    beta_count: int = 0
    accepted_by_position: list[int] = field(default_factory=list)  # [γ] drafts accepted at position i
    reached_by_position: list[int] = field(default_factory=list)  # [γ] drafts verified at position i
    # --- timings (seconds) ------------------------------------------------------------------------
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    wall_time_s: float = 0.0
    # A plain-decoding timing of the same work, when the caller measured one (e.g. the benchmark).
    baseline_wall_time_s: float | None = None
    # ĉ: arithmetic per token of the drafter / of the target (from parameter counts; 0 for tables/lookup)
    op_cost_ratio: float | None = None

    @property
    def alpha(self) -> float | None:
        """α = mean β over verified positions (exact, from p and q; Cor 3.6). None without drafts."""
        return self.beta_sum / self.beta_count if self.beta_count else None

    @property
    def mean_accepted_length(self) -> float:
        """τ = tokens per target call per row, bonus/correction included (plain decoding: 1.0)."""
        return self.algorithm_tokens / self.row_steps if self.row_steps else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafts / drafted tokens (depends on γ; α does not)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def acceptance_per_position(self) -> list[float]:
        """P(draft i accepted | draft i verified), i = 1..γ."""
        return [a / r if r else float("nan") for a, r in zip(self.accepted_by_position, self.reached_by_position)]

    @property
    def mean_num_draft_tokens(self) -> float:
        """Mean drafts per speculative row-step (γ, or its average under an adaptive policy)."""
        return self.drafted_tokens / self.speculative_row_steps if self.speculative_row_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def cost_ratio(self) -> float | None:
        """c = time of one drafter forward / time of one target forward, measured in this run."""
        verify_calls = self.num_steps
        if not self.drafter_calls or not verify_calls or self.verify_time_s <= 0:
            return None
        return (self.draft_time_s / self.drafter_calls) / (self.verify_time_s / verify_calls)

    @property
    def predicted_speedup(self) -> float | None:
        """Thm 3.8 from the measured α, c and the mean γ: (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
        from specdec.analysis import walltime_improvement

        alpha, c, gamma = self.alpha, self.cost_ratio, self.mean_num_draft_tokens
        if alpha is None or gamma <= 0:
            return None
        return _interpolate_gamma(lambda g: walltime_improvement(alpha, g, c if c is not None else 0.0), gamma)

    @property
    def operations_increase(self) -> float | None:
        """Thm 3.11: (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1)), from the measured α, ĉ and the mean γ."""
        from specdec.analysis import operations_increase

        alpha, gamma = self.alpha, self.mean_num_draft_tokens
        if alpha is None or gamma <= 0 or self.op_cost_ratio is None:
            return None
        return _interpolate_gamma(lambda g: operations_increase(alpha, g, self.op_cost_ratio), gamma)

    @property
    def measured_speedup(self) -> float | None:
        """Plain-decoding wall time of the same work / this run's wall time, when measured."""
        if self.baseline_wall_time_s is None or self.wall_time_s <= 0:
            return None
        return self.baseline_wall_time_s / self.wall_time_s

    # --- the fold: the only writers of the fields above ---------------------------------------------
    def add_step(self, record) -> None:
        """Fold one step's `specdec.step.StepRecord` (one target verification pass)."""
        self.add_steps(1, drafter_calls=record.drafter_calls, num_generated_tokens=record.num_committed,
                       max_gamma=record.gamma, counts=record.counts, draft_time_s=record.draft_time_s,
                       verify_time_s=record.verify_time_s)

    def add_steps(self, num_steps: int, *, drafter_calls: int = 0, num_generated_tokens: int = 0, max_gamma: int = 0,
                  counts=None, draft_time_s: float = 0.0, verify_time_s: float = 0.0) -> None:
        """Fold `num_steps` target verification passes at once (a request's share of the engine's steps):
        the drafter passes, tokens returned, largest γ, acceptance counters (`StepCounts`, or None) and times."""
        self.num_steps += num_steps
        self.target_calls += num_steps
        self.drafter_calls += drafter_calls
        self.num_generated_tokens += num_generated_tokens
        self.max_num_draft_tokens = max(self.max_num_draft_tokens, max_gamma)
        self.draft_time_s += draft_time_s
        self.verify_time_s += verify_time_s
        if counts is not None:
            self.add_counts(counts)

    def add_prefill(self, seconds: float, target_calls: int) -> None:
        """Fold a prefill: its time and its target forward passes (encoder passes included)."""
        self.prefill_time_s += seconds
        self.target_calls += target_calls

    def set_wall_time(self, seconds: float) -> None:
        self.wall_time_s = seconds

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Fold another run's statistics into these (runs one after another): counts and times add up,
        per-position lists add element-wise, γ takes the larger, optional facts (a baseline timing, ĉ) stay
        only where both runs agree. Returns self."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "max_num_draft_tokens":
                setattr(self, f.name, max(mine, theirs))
            elif f.default is None:
                setattr(self, f.name, mine if mine == theirs else None)
            elif isinstance(mine, list):
                mine += [0] * (len(theirs) - len(mine))
                for i, v in enumerate(theirs):
                    mine[i] += v
            else:
                setattr(self, f.name, mine + theirs)
        return self

    @classmethod
    def pooled(cls, runs: Iterable["SpecStats"]) -> "SpecStats":
        """One SpecStats for several runs (`merge` of each into a copy of the first; empty → zeros)."""
        runs = list(runs)
        if not runs:
            return cls()
        total = copy.deepcopy(runs[0])
        for run in runs[1:]:
            total.merge(run)
        return total

    def add_counts(self, counts) -> int:
        """Fold a `specdec.step.StepCounts` (one or more steps at one draft length); returns the row-steps added."""
        gamma = counts.gamma
        self.max_num_draft_tokens = max(self.max_num_draft_tokens, gamma)
        if len(self.reached_by_position) < gamma:
            extra = gamma - len(self.reached_by_position)
            self.reached_by_position += [0] * extra
            self.accepted_by_position += [0] * extra
        for i in range(gamma):
            self.reached_by_position[i] += counts.reached[i]
            self.accepted_by_position[i] += counts.accepted[i]
        if counts.has_beta:
            self.beta_sum += counts.beta_sum
            self.beta_count += sum(counts.reached)
        self.accepted_tokens += counts.num_accepted
        self.drafted_tokens += counts.num_drafted
        self.speculative_row_steps += counts.drafting_rows
        self.row_steps += counts.active_rows
        self.algorithm_tokens += counts.num_accepted + counts.active_rows
        return counts.active_rows

    def to_dict(self) -> dict:
        """Fields plus the derived quantities, JSON-ready."""
        out = asdict(self)
        for name in (
            "alpha", "mean_accepted_length", "acceptance_rate", "acceptance_per_position", "mean_num_draft_tokens",
            "tokens_per_second", "cost_ratio", "predicted_speedup", "operations_increase", "measured_speedup",
        ):
            out[name] = getattr(self, name)
        return out


def _interpolate_gamma(fn, gamma: float) -> float:
    # γ may be a mean over steps under an adaptive policy; interpolate the integer formula linearly.
    low = int(gamma)
    if low == gamma:
        return fn(low)
    frac = gamma - low
    return (1 - frac) * fn(max(low, 0)) + frac * fn(low + 1)


class Clock:
    """Step timings: perf_counter on CPU; CUDA events on GPU (read after the step's one host sync). `device` is a
    `torch.device`; marks 0..marks-1 are recorded with `mark(i)`, read with `elapsed(i, j)` in seconds."""

    def __init__(self, device, marks: int = 3):
        self.cuda = device.type == "cuda"
        if self.cuda:
            import torch  # (metrics imports no torch until a CUDA clock is made)

            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)]
        else:
            self.times = [0.0] * marks

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def elapsed(self, i: int, j: int) -> float:
        if self.cuda:
            self.events[j].synchronize()
            return self.events[i].elapsed_time(self.events[j]) / 1000.0
        return self.times[j] - self.times[i]
