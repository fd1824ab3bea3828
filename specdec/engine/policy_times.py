"""Step-time tables of the γ policy (`specdec.engine.policy`): medians, borrowing across buckets, interpolation in γ,
length buckets."""

from __future__ import annotations

import math
import time

__all__ = ["bucket_report", "borrow", "median", "interpolate", "length_bucket", "Gaps", "batch_times", "catch_up_cost", "capture_cost"]

_MIN_LENGTH_BUCKET = 64


def length_bucket(length: int) -> int:
    """The power-of-two bucket (at least 64) a running batch whose longest row has `length` tokens falls in."""
    return max(_MIN_LENGTH_BUCKET, 1 << max(int(length) - 1, 0).bit_length())


def borrow(cells: dict[int, dict[int, float]], key: int) -> dict[int, float]:
    """cells: bucket → γ → seconds. → γ → seconds at `key`: its own, then each γ missing there from the nearest
    bucket that has it (in log distance), scaled by the mean ratio of the γ's both have (1 when none)."""
    here = dict(cells.get(key, {}))
    own = cells.get(key, {})
    for other in sorted((k for k in cells if k != key), key=lambda k: (abs(math.log2(k / key)), k)):
        there = cells[other]
        shared = [g for g in there if g in own]
        scale = sum(own[g] / there[g] for g in shared) / len(shared) if shared else 1.0
        for g, seconds in there.items():
            here.setdefault(g, seconds * scale)
    return here


def keep_last(values: list[float], value: float, window: int) -> list[float]:
    """`values` with `value` appended, the oldest dropped past `window` (a policy's sample windows)."""
    values.append(value)
    del values[:-window]
    return values


def pooled_medians(samples: dict[tuple[int, int, int], list[float]]) -> dict[tuple[int, int], float]:
    """(b, γ, ℓ) → step times ⇒ (b, γ) → the median of them all, over every length bucket (a report)."""
    pooled: dict[tuple[int, int], list[float]] = {}
    for (b, g, _), values in samples.items():
        pooled.setdefault((b, g), []).extend(values)
    return {key: median(values) for key, values in pooled.items() if values}


def bucket_report(samples: dict, counts: dict, chosen: dict, gaps: dict) -> dict:
    """The policy's table, JSON-ready (`GammaPolicy.report`): batch bucket → γ → {ms: the median over every length
    bucket, timed: steps timed (`counts`), chosen: decisions (`chosen`), by_length_ms: per length bucket (runs
    compare at one shape), the gaps after its steps (`gaps`: `Gaps.report`)}."""
    buckets: dict = {}
    for (b, g), seconds in sorted(pooled_medians(samples).items()):
        buckets.setdefault(str(b), {})[str(g)] = {"ms": round(seconds * 1e3, 3), "timed": counts.get((b, g), 0)}
    for (b, g), n in sorted(chosen.items()):
        buckets.setdefault(str(b), {}).setdefault(str(g), {})["chosen"] = n
    for (b, g, ell), values in sorted(samples.items()):
        if values:
            cell = buckets.setdefault(str(b), {}).setdefault(str(g), {})
            cell.setdefault("by_length_ms", {})[str(ell)] = round(median(values) * 1e3, 3)
    for (b, g), gap in sorted(gaps.items()):
        buckets.setdefault(str(b), {}).setdefault(str(g), {}).update(gap)
    return buckets


def median(values: list[float]) -> float:
    """The lower median: noise in step times is one-sided (a straggler is only ever slower), so of two middle
    values the lower one is the typical step."""
    return sorted(values)[(len(values) - 1) // 2]


def interpolate(times: dict[int, float], gamma: int) -> float:
    """T(γ) from the timed γ's: measured, else linear between the nearest timed neighbours, else extended
    along the line from the smallest timed γ (γ = 0 when timed) to the largest (slope >= 0); below every timed
    γ, along the line through the two smallest, at least half the smallest's."""
    if gamma in times:
        return times[gamma]
    timed = sorted(times)
    below = [g for g in timed if g < gamma]
    above = [g for g in timed if g > gamma]
    if below and above:
        lo, hi = below[-1], above[0]
        return times[lo] + (times[hi] - times[lo]) * (gamma - lo) / (hi - lo)
    if below:
        lo, hi = timed[0], below[-1]
        slope = max(times[hi] - times[lo], 0.0) / (hi - lo) if hi > lo else 0.0
        return times[hi] + slope * (gamma - hi)
    a = above[0]
    slope = max(times[above[1]] - times[a], 0.0) / (above[1] - a) if len(above) > 1 else 0.0
    return max(times[a] - slope * (a - gamma), 0.5 * times[a])


class Gaps:
    """Host seconds from one step's record to the next step's choice — what runs between two steps: admissions and
    their prefill, aborts, the caller's own work — per (batch bucket, γ of the step before). A read-out (`report`),
    not part of the choice: what the step times leave out, per arm, to compare arms by."""

    def __init__(self):
        self._last: tuple | None = None  # (b, γ, when it was recorded)
        self._sums: dict[tuple[int, int], list[float]] = {}  # (b, γ) → [Σ seconds, gaps, longest]

    def stepped(self, batch: int, gamma: int) -> None:
        self._last = (batch, gamma, time.perf_counter())

    def choosing(self) -> None:
        if self._last is not None:
            batch, gamma, then = self._last
            gap = time.perf_counter() - then
            sums = self._sums.setdefault((batch, gamma), [0.0, 0, 0.0])
            sums[0], sums[1], sums[2] = sums[0] + gap, sums[1] + 1, max(sums[2], gap)
            self._last = None

    def report(self) -> dict[tuple[int, int], dict]:
        """(b, γ) → {after_ms: the mean gap after a step at (b, γ), after_max_ms: the longest, gaps: how many}."""
        return {key: {"after_ms": round(total / n * 1e3, 3), "after_max_ms": round(longest * 1e3, 3), "gaps": n}
                for key, (total, n, longest) in self._sums.items()}


def catch_up_cost(events: dict[int, list[float]], batch: int, times: dict[int, float], prior: float) -> float:
    """One catch-up's seconds at bucket b: measured (`events`: b → whole catch-ups' seconds; at b, else at any
    bucket), else `prior` plain steps."""
    found = events.get(batch) or [v for values in events.values() for v in values]
    return median(found) if found else prior * interpolate(times, 0)


def capture_cost(events: list[float], times: dict[int, float], prior: float) -> float:
    """One graph capture's seconds: measured (`events`), else `prior` plain steps (times: γ → T at b)."""
    if events:
        return median(events)
    return prior * interpolate(times, 0) if times else 0.0


def batch_times(grid: dict, batch: int, ell: int) -> dict[int, float]:
    """γ → T(b, γ, ℓ) for every γ timed at b (grid: b → ℓ → γ → T; `borrow` across length buckets at b); when b
    timed fewer than two arms, also those timed at other batch buckets (the nearest first), scaled by the arms
    timed at both. (Two arms timed at b — plain and one speculative γ — interpolate the rest better than another
    bucket's ratios do: speculation costs relatively more in a big batch than in a small one.)"""
    if batch not in grid:
        return {}
    own = borrow(grid[batch], ell)
    if len(own) >= 2:
        return own
    return borrow({b: borrow(cells, ell) for b, cells in grid.items()}, batch)
