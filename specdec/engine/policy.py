"""How many tokens the engine drafts in its next step (0 = a plain step), from measured costs and acceptance.

A fixed integer γ means exactly that γ. "auto" picks, before each step, the γ with the highest expected
tokens per second for the rows in the batch:

    rate(γ) = Σ_rows E_row(γ) / T(b, γ),   E_row(γ) = 1 + ρ · ((1 − α^(γ+1)) / (1 − α) − 1)   (Thm 3.8's E)

where T(b, γ) is the measured time of a step of that shape (draft + verify; a linear fit in γ where a
shape has not been timed yet), α the row's measured acceptance (Σβ / verified positions, with a prior)
and ρ the share of the row's speculative steps in which its drafter proposed anything (prompt lookup
often finds nothing). So speculation turns itself off where it would be slower than plain decoding —
whatever the drafter, the batch size or the temperature — and comes back when it pays.
"""

from __future__ import annotations

__all__ = ["GammaPolicy"]

_DECAY = 0.8  # EMA weight of the old step time
_PRIOR_ALPHA, _PRIOR_WEIGHT = 0.5, 4.0
_REFRESH = 32  # steps between re-measurements of the option not taken


def expected_tokens(alpha: float, gamma: int) -> float:
    if gamma == 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


class _RowEstimate:
    __slots__ = ("beta_sum", "reached", "spec_steps", "drafting_steps")

    def __init__(self):
        self.beta_sum = self.reached = self.spec_steps = self.drafting_steps = 0.0

    def tokens(self, gamma: int) -> float:
        alpha = (self.beta_sum + _PRIOR_ALPHA * _PRIOR_WEIGHT) / (self.reached + _PRIOR_WEIGHT)
        coverage = (self.drafting_steps + 1) / (self.spec_steps + 1)
        return 1.0 + coverage * (expected_tokens(alpha, gamma) - 1.0)


class GammaPolicy:
    def __init__(self, spec, max_draft_tokens: int):
        self.fixed = None if spec == "auto" else int(spec)
        self.max_draft_tokens = max_draft_tokens
        self.candidates = [g for g in (1, 2, 4, 6) if g <= max_draft_tokens]
        self.default = min(4, max_draft_tokens) if max_draft_tokens else 0
        self.times: dict[tuple[int, int], float] = {}
        self._since_refresh = 0
        self._last = None

    def set_fixed(self, spec) -> None:
        """Switch between a fixed γ (an int, 0 = plain) and "auto" (for a new call on a kept engine)."""
        self.fixed = None if spec == "auto" else int(spec)
        if self.fixed is not None and self.fixed > self.max_draft_tokens:
            raise ValueError(f"num_draft_tokens {self.fixed} exceeds this engine's max_draft_tokens")

    def choose(self, batch: int, running) -> int:
        if self.fixed is not None or not self.candidates:
            return self.fixed or 0
        plain = self.times.get((batch, 0))
        if (batch, self.default) not in self.times and not any((batch, g) in self.times for g in self.candidates):
            return self.default  # first time at this batch size: time a speculative step
        if plain is None:
            return 0  # then a plain one
        rows = [_estimate(r) for r in running]
        best, best_rate = 0, len(rows) / plain
        slope = self._slope(batch, plain)
        for gamma in self.candidates:
            seconds = self.times.get((batch, gamma), plain + gamma * slope)
            rate = sum(r.tokens(gamma) for r in rows) / max(seconds, 1e-9)
            if rate > best_rate:
                best, best_rate = gamma, rate
        self._since_refresh += 1
        if self._since_refresh >= _REFRESH:  # re-time the option not taken, so stale numbers cannot stick
            self._since_refresh = 0
            best = self.default if best == 0 else 0
        return best

    def _slope(self, batch: int, plain: float) -> float:
        timed = [(g, t) for (b, g), t in self.times.items() if b == batch and g > 0]
        if not timed:
            return 0.1 * plain
        gamma, seconds = max(timed)
        return max(seconds - plain, 0.0) / gamma

    def record_time(self, batch: int, gamma: int, seconds: float) -> None:
        key = (batch, gamma)
        if key in self.times:
            self.times[key] = _DECAY * self.times[key] + (1 - _DECAY) * seconds
        else:
            self.times[key] = seconds

    def record_row(self, request, beta_sum: float, reached: int, drafting: int) -> None:
        """One speculative step of one request: its Σβ, verified positions, and whether it drafted anything."""
        est = _estimate(request)
        est.beta_sum += beta_sum
        est.reached += reached
        est.spec_steps += 1
        est.drafting_steps += drafting


def _estimate(request) -> _RowEstimate:
    est = getattr(request, "estimate", None)
    if est is None:
        est = request.estimate = _RowEstimate()
    return est
