"""How many tokens the engine drafts in its next step (0 = a plain step), from measured steps.

A fixed integer γ means exactly that γ. "auto" treats each γ ∈ {0} ∪ candidates as an arm and, per batch
bucket b, keeps two measurements of it: T(b, γ), the wall time of a whole step (device and host), and τ(b, γ),
the tokens each running row produced per step (accepted drafts + 1, before EOS/budget cuts). It picks the arm
with the highest measured rate τ / T — tokens per second, whatever the drafter, the batch size or the
temperature — so it runs plain decoding where speculation measures slower.

An arm not yet measured at b is tried when a model says it could win: τ from each row's measured acceptance
(Thm 3.8's E(α, γ) = (1 − α^(γ+1)) / (1 − α), α = Σβ / verified positions with a prior, times the share ρ of
the row's speculative steps in which its drafter proposed anything) over T interpolated linearly in γ. Every
`_REFRESH` steps the runner-up arm is measured again, so stale numbers cannot stick.
"""

from __future__ import annotations

__all__ = ["GammaPolicy"]

_DECAY = 0.8  # EMA weight of the old measurement
_PRIOR_ALPHA, _PRIOR_WEIGHT = 0.5, 4.0
_REFRESH = 32  # steps between re-measurements of the runner-up arm


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

    def totals(self) -> tuple[float, float, float, float]:
        return self.beta_sum, self.reached, self.spec_steps, self.drafting_steps


def _alpha_coverage(beta_sum: float, reached: float, spec_steps: float, drafting_steps: float) -> tuple[float, float]:
    """A row's α (Σβ over verified positions, with a prior) and the share of its speculative steps that drafted."""
    alpha = (beta_sum + _PRIOR_ALPHA * _PRIOR_WEIGHT) / (reached + _PRIOR_WEIGHT)
    coverage = (drafting_steps + 1) / (spec_steps + 1)
    return alpha, coverage


class GammaPolicy:
    def __init__(self, spec, max_draft_tokens: int):
        self.fixed = None if spec == "auto" else int(spec)
        self.max_draft_tokens = max_draft_tokens
        self.candidates = [g for g in (1, 2, 4, 6) if g <= max_draft_tokens]
        self.default = min(4, max_draft_tokens) if max_draft_tokens else 0
        self.arms: dict[tuple[int, int], list[float]] = {}  # (b, γ) → [T seconds, τ tokens per row] (EMAs)
        self._since_refresh = 0

    @property
    def times(self) -> dict[tuple[int, int], float]:
        return {key: arm[0] for key, arm in self.arms.items()}

    def set_fixed(self, spec) -> None:
        """Switch between a fixed γ (an int, 0 = plain) and "auto" (for a new call on a kept engine)."""
        self.fixed = None if spec == "auto" else int(spec)
        if self.fixed is not None and self.fixed > self.max_draft_tokens:
            raise ValueError(f"num_draft_tokens {self.fixed} exceeds this engine's max_draft_tokens")

    def choose(self, batch: int, running, estimates=None) -> int:
        """γ for the next step at batch bucket `batch`. Each running row's acceptance totals (Σβ, verified
        positions, speculative steps, steps that drafted) come from `record_row` (kept on the row) or, when
        given, from `estimates()` → one such tuple per row (the engine keeps them on the device and reads them
        only when an unmeasured arm needs them)."""
        if self.fixed is not None or not self.candidates:
            return self.fixed or 0
        arms = self.arms
        for first in (self.default, 0):  # a new batch bucket: time one speculative step, then a plain one
            if (batch, first) not in arms:
                return first
        measured = {g: arm[1] / max(arm[0], 1e-9) for (b, g), arm in arms.items() if b == batch}
        ranked = sorted(measured, key=measured.get, reverse=True)
        best = ranked[0]
        unmeasured = [g for g in self.candidates if g not in measured]
        if unmeasured:  # try an untimed γ when the acceptance model says it could beat the best measured rate
            totals = estimates() if estimates is not None else [_estimate(r).totals() for r in running]
            rows = [_alpha_coverage(*t) for t in totals]
            plain = arms[(batch, 0)][0]
            slope = self._slope(batch, plain)
            below_one = all(alpha < 1.0 for alpha, _ in rows)  # always, from record_row's or the engine's sums
            for gamma in unmeasured:  # the mean over rows of each row's expected tokens per step
                if below_one:  # expected_tokens(α, γ) inlined (this runs per row per step)
                    e = gamma + 1
                    tau = sum([1.0 + c * ((1 - a**e) / (1 - a) - 1.0) for a, c in rows])
                else:
                    tau = sum([1.0 + c * (expected_tokens(a, gamma) - 1.0) for a, c in rows])
                tau /= max(len(rows), 1)
                if tau / (plain + gamma * slope) > measured[best]:
                    return gamma
        self._since_refresh += 1
        if self._since_refresh >= _REFRESH and len(ranked) > 1:
            self._since_refresh = 0
            return ranked[1]
        return best

    def _slope(self, batch: int, plain: float) -> float:
        timed = [(g, arm[0]) for (b, g), arm in self.arms.items() if b == batch and g > 0]
        if not timed:
            return 0.1 * plain
        gamma, seconds = max(timed)
        return max(seconds - plain, 0.0) / gamma

    def record_step(self, batch: int, gamma: int, seconds: float, tokens_per_row: float) -> None:
        """A whole step at (b, γ) took `seconds` and each running row produced `tokens_per_row` on average."""
        arm = self.arms.get((batch, gamma))
        if arm is None:
            self.arms[(batch, gamma)] = [seconds, tokens_per_row]
        else:
            arm[0] = _DECAY * arm[0] + (1 - _DECAY) * seconds
            arm[1] = _DECAY * arm[1] + (1 - _DECAY) * tokens_per_row

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
