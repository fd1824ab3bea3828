"""How many tokens the engine drafts in its next step (0 = a plain step): the paper's rule with measured costs.

A fixed integer γ means exactly that γ. "auto" picks, per batch bucket b,

    γ* = argmax over γ ∈ {0} ∪ candidates of  mean over running rows of τ_row(γ)  /  T(b, γ)

T(b, γ): the measured wall time of a whole step (device and host), the median of its last `_WINDOW` timed
steps; a γ not yet timed at b is interpolated linearly in γ between timed ones (extended along the line
from γ = 0 to the largest). Step times are stable, so each arm needs timing only a few times per bucket: a
new bucket times γ = default and γ = 0 (`_FIRST_SAMPLES` steps each), then the model decides; an untimed γ
that the model ranks first runs and so gets timed.

τ_row(γ) = 1 + ρ · (E(α, γ) − 1): the tokens a row is expected to produce per step, not a measured average
of past steps (which is noisy, 1..γ+1 per row, and was measured on whichever rows ran then). E is Thm 3.8's
expected tokens (`specdec.analysis.expected_tokens`); α = the row's Σβ over its verified positions with a
prior (the pooled α of the rows seen so far); ρ = the share of the row's speculative steps in which its
drafter proposed anything.

A plain step with a drafter that keeps a cache (a model drafter, a feature head) has a deferred cost: the
next speculative step first feeds the drafter what the plain steps committed (the engine's catch-up, an
eager prefill). The engine reports that cost (`record_catch_up`: the catch-up step's time beyond the usual
step at its (b, γ), spread over the plain steps that caused it), and T(b, 0) includes it (the median of the
last `_WINDOW` reports), so the policy does not choose plain steps whose real cost it never saw. Such a
policy (`plain_catches_up=True`) also never explores γ = 0 by itself (no plain steps at a new bucket, none in
the refresh turns): on an H200 one catch-up after a few exploring plain steps cost 55–78 ms at 8–32 rows, more
than the exploration could win in a short run. It then chooses between the speculative γ's only (the worst case,
a drafter that is never right, runs γ = 1); `num_draft_tokens=0` asks for plain decoding.

Reading the rows' totals from the device costs a host sync, so a decision is kept for `_HOLD` steps (or
until the batch bucket changes, or the number of running rows changes, after at least `_MIN_GAP` steps).
Every `_REFRESH` decisions another arm runs once (`_MIN_GAP` steps; the runner-up, then the next ones in
turn), so no arm keeps a time from a few unlucky steps, and the rows' acceptance does not go stale while the
policy sits at γ = 0.
"""

from __future__ import annotations

from specdec.analysis import expected_tokens

__all__ = ["GammaPolicy"]

_WINDOW = 8  # timed steps kept per (bucket, γ); T is their median (robust to a stray slow step)
_FIRST_SAMPLES = 3  # timed steps of γ = default, then γ = 0, at a new bucket before the model decides
_HOLD = 8  # steps a decision is kept
_MIN_GAP = 2  # the fewest steps a decision is kept (a change in the running rows re-decides after these)
_REFRESH = 32  # decisions between runs of the runner-up arm
_PRIOR_ALPHA, _PRIOR_WEIGHT = 0.5, 4.0  # α before any row was verified; weight (positions) of a row's prior


class _RowEstimate:
    __slots__ = ("beta_sum", "reached", "spec_steps", "drafting_steps")

    def __init__(self):
        self.beta_sum = self.reached = self.spec_steps = self.drafting_steps = 0.0

    def totals(self) -> tuple[float, float, float, float]:
        return self.beta_sum, self.reached, self.spec_steps, self.drafting_steps


class GammaPolicy:
    def __init__(self, spec, max_draft_tokens: int, plain_catches_up: bool = False):
        self.fixed = None if spec == "auto" else int(spec)
        self.plain_catches_up = plain_catches_up  # a plain step costs the drafter a catch-up later (see the doc)
        self.max_draft_tokens = max_draft_tokens
        self.candidates = [g for g in (1, 2, 4, 6) if g <= max_draft_tokens]
        self.default = min(4, max_draft_tokens) if max_draft_tokens else 0
        self.samples: dict[tuple[int, int], list[float]] = {}  # (b, γ) → its last step times (seconds)
        self.catch_up: dict[int, list[float]] = {}  # b → the last catch-up costs per plain step (seconds)
        self.tokens: dict[tuple[int, int], float] = {}  # (b, γ) → EMA of tokens per row per step (reported)
        self.prior_alpha = _PRIOR_ALPHA  # the pooled α of the rows seen at the last decision
        self.last_rates: dict[int, float] = {}  # γ → predicted tokens per row per second at the last decision
        self._choice = None  # the kept decision: γ, (bucket, rows) it was made for, steps since, steps to keep
        self._key, self._age, self._keep = None, 0, 0
        self._decisions = 0

    @property
    def times(self) -> dict[tuple[int, int], float]:
        """(b, γ) → the step time the policy uses (median of the last timed steps)."""
        return {key: _median(values) for key, values in self.samples.items() if values}

    def set_fixed(self, spec) -> None:
        """Switch between a fixed γ (an int, 0 = plain) and "auto" (for a new call on a kept engine)."""
        self.fixed = None if spec == "auto" else int(spec)
        if self.fixed is not None and self.fixed > self.max_draft_tokens:
            raise ValueError(f"num_draft_tokens {self.fixed} exceeds this engine's max_draft_tokens")
        self._choice = None

    def choose(self, batch: int, running, estimates=None) -> int:
        """γ for the next step at batch bucket `batch`. Each running row's acceptance totals (Σβ, verified
        positions, speculative steps, steps that drafted) come from `record_row` (kept on the row) or, when
        given, from `estimates()` → one such tuple per row (the engine keeps them on the device: a host read,
        made only when the policy re-decides)."""
        if self.fixed is not None or not self.candidates:
            return self.fixed or 0
        key = (batch, len(running))
        if self._choice is not None and self._key[0] == batch and self._age < self._keep and (
                key == self._key or self._age < _MIN_GAP):
            self._age += 1
            return self._choice
        gamma, keep = self._decide(batch, running, estimates)
        self._choice, self._key, self._age, self._keep = gamma, key, 1, keep
        return gamma

    def _decide(self, batch: int, running, estimates) -> tuple[int, int]:
        """→ (γ, steps to keep it)."""
        firsts = (self.default,) if self.plain_catches_up else (self.default, 0)
        for first in firsts:  # a new batch bucket: time a speculative step, then (maybe) a plain one
            if len(self.samples.get((batch, first), ())) < _FIRST_SAMPLES:
                return first, 1
        totals = estimates() if estimates is not None else [_estimate(r).totals() for r in running]
        rows = self._rows(totals)
        times = {g: _median(v) for (b, g), v in self.samples.items() if b == batch and v}
        if self.catch_up.get(batch):  # a plain step also costs the drafter's catch-up it makes necessary
            times[0] += _median(self.catch_up[batch])
        rates = {}
        arms = self.candidates if self.plain_catches_up and 0 not in times else [0, *self.candidates]
        for gamma in arms:
            tau = sum([1.0 + c * (expected_tokens(a, gamma) - 1.0) for a, c in rows]) / len(rows) if rows else 1.0
            rates[gamma] = tau / max(_interpolate(times, gamma), 1e-12)
        self.last_rates = rates
        ranked = sorted(rates, key=rates.get, reverse=True)
        self._decisions += 1
        if self._decisions % _REFRESH == 0 and len(ranked) > 1:  # the others in turn, runner-up first
            turn = self._decisions // _REFRESH - 1
            return ranked[1 + turn % (len(ranked) - 1)], _MIN_GAP
        return ranked[0], _HOLD

    def _rows(self, totals) -> list[tuple[float, float]]:
        """Each row's (α, ρ): α = (Σβ + α₀·w) / (verified + w), α₀ the pooled α of the rows (or of those
        seen at the last decision with verified positions); ρ = (steps that drafted + 1) / (spec. steps + 1)."""
        beta = sum([t[0] for t in totals])
        reached = sum([t[1] for t in totals])
        if reached > 0:
            self.prior_alpha = (beta + self.prior_alpha * _PRIOR_WEIGHT) / (reached + _PRIOR_WEIGHT)
        prior = self.prior_alpha * _PRIOR_WEIGHT
        return [(min((b + prior) / (r + _PRIOR_WEIGHT), 1.0), (d + 1) / (s + 1)) for b, r, s, d in totals]

    def record_step(self, batch: int, gamma: int, seconds: float, tokens_per_row: float) -> None:
        """A whole step at (b, γ) took `seconds` and each running row produced `tokens_per_row` on average
        (the time decides; the tokens are kept for reports)."""
        key = (batch, gamma)
        values = self.samples.setdefault(key, [])
        values.append(seconds)
        if len(values) > _WINDOW:
            del values[0]
        old = self.tokens.get(key)
        self.tokens[key] = tokens_per_row if old is None else 0.8 * old + 0.2 * tokens_per_row

    def record_catch_up(self, batch: int, seconds: float, plain_steps: int) -> None:
        """A speculative step at bucket b that first fed the drafter what `plain_steps` plain steps committed
        took `seconds` longer than that step usually takes: each of those plain steps cost that much more."""
        values = self.catch_up.setdefault(batch, [])
        values.append(max(seconds, 0.0) / max(plain_steps, 1))
        if len(values) > _WINDOW:
            del values[0]

    def record_row(self, request, beta_sum: float, reached: int, drafting: int) -> None:
        """One speculative step of one request: its Σβ, verified positions, and whether it drafted anything."""
        est = _estimate(request)
        est.beta_sum += beta_sum
        est.reached += reached
        est.spec_steps += 1
        est.drafting_steps += drafting


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _interpolate(times: dict[int, float], gamma: int) -> float:
    """T(γ) from the timed γ's: measured, else linear between the nearest timed neighbours, else extended
    along the line from the smallest timed γ (γ = 0 when timed) to the largest (slope >= 0); below every timed
    γ (a policy that never timed γ = 0), along the line through the two smallest, at least half the smallest's."""
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


def _estimate(request) -> _RowEstimate:
    est = getattr(request, "estimate", None)
    if est is None:
        est = request.estimate = _RowEstimate()
    return est
