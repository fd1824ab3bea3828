"""Acceptance by draft depth, measured against each row's α: the γ policy's (`specdec.engine.policy`) expected tokens.

Thm 3.8 takes a row's drafts as accepted i.i.d. with probability α at every depth, so the extra tokens of a step
at γ are E(α, γ) − 1 = α + α² + … + α^γ. Drafts on real traffic are accepted less the deeper they sit: on the zoo
`gpu` pair at batch 1 (held-in, one H200, T = 0) the rows' α 0.874 predicts τ 3.88 at γ = 4 and 5.56 at γ = 8; the
steps measured 3.89 and 5.24. The i.i.d. rule then over-rates long drafts where γ = 4 and γ = 8 come close: the
traffic table's 8-slot cells ran mean γ 6–7 where a fixed γ = 4 read 4–7% more tokens/s, and at batch 1, T = 1,
"auto" (mean γ 5.2) read 5% below a fixed γ = 4.

So the policy measures a depth profile s_k (s_0 = 1): at every speculative step, per depth k, the rows whose draft
reached k (each row's accepted count tells: depths 0..min(accepted, drafted − 1)) and those that accepted there
(depths below accepted), against the α the last decision gave each of those rows:

    d_k = (accepted at depth k + w) / (Σ over the rows that reached k of their α + w),   s_k = d_k / d_0

sums decayed by `_DECAY` per step (the last ~200 steps), w = `_PRIOR` positions at d = 1. A row's drafts are then
accepted at depth k with probability min(α s_k, 1), and its extra tokens at γ are Σ_{j=1..γ} Π_{k<j} min(α s_k, 1).
The ratio to depth 0 keeps the profile's shape only: d_0 itself is biased by the choice (the policy runs a long γ
on rows whose α looks high, and a row's α looks high partly by luck), the shape much less (the same rows make up
every depth of a step, and each depth is weighed against those rows' own α); under the i.i.d. law s_k ≈ 1 and the
rule is Thm 3.8's. Depths no step drafted keep s = the deepest measured one's.
"""

from __future__ import annotations

__all__ = ["DepthProfile", "extra_tokens", "RowEstimate", "row_estimate", "row_rates"]

_DECAY = 0.995  # per speculative step: the profile over its last ~200 steps
_PRIOR = 8.0  # positions at d = 1 (a few steps' worth at batch 1; nothing at 64 rows)
_FLAT = 1e-9


class RowEstimate:
    """A request's acceptance totals kept on the request (`GammaPolicy.record_row`, when the engine keeps none)."""

    __slots__ = ("beta_sum", "reached", "spec_steps", "drafting_steps")

    def __init__(self):
        self.beta_sum = self.reached = self.spec_steps = self.drafting_steps = 0.0

    def totals(self) -> tuple[float, float, float, float]:
        return self.beta_sum, self.reached, self.spec_steps, self.drafting_steps


def row_estimate(request) -> RowEstimate:
    """The request's `RowEstimate` (made on first use)."""
    est = getattr(request, "estimate", None)
    if est is None:
        est = request.estimate = RowEstimate()
    return est


def row_rates(totals, prior_alpha: float, weight: float) -> tuple[float, list[tuple[float, float]]]:
    """(the pooled α, each row's (α, ρ)) from the rows' totals (Σβ, verified, spec. steps, steps that drafted):
    α = (Σβ + α₀·w) / (verified + w), α₀ the pooled α of these rows (`prior_alpha` when none was verified: the α of
    the rows seen at the last decision with verified positions); ρ = (steps that drafted + 1) / (spec. steps + 1)."""
    beta, reached = sum([t[0] for t in totals]), sum([t[1] for t in totals])
    if reached > 0:
        prior_alpha = (beta + prior_alpha * weight) / (reached + weight)
    prior = prior_alpha * weight
    return prior_alpha, [(min((b + prior) / (r + weight), 1.0), (d + 1) / (s + 1)) for b, r, s, d in totals]


def extra_tokens(rows: list[tuple[float, float]], gammas, shape: list[float] | None = None,
                 caps=None) -> dict[int, float]:
    """γ → Σ over rows (α, ρ) of ρ · Σ_{j=1..γ} Π_{k<j} min(α s_k, 1) (s = `shape`, s_0 = 1; None or flat: Thm 3.8's
    ρ · α (1 − α^γ) / (1 − α), γ when α = 1): one pass over the rows (the policy's cost at 64 rows is this loop).
    caps: per row a fixed draft cap (that row counts at min(γ, cap)) or None (no cap); None = no row is capped."""
    sums = dict.fromkeys(gammas, 0.0)
    if not gammas:
        return sums
    if caps is not None and any(c is not None for c in caps):  # rows by cap: each group at its own depths
        groups: dict = {}
        for row, cap in zip(rows, caps):
            groups.setdefault(cap, []).append(row)
        for cap, members in groups.items():
            depths = {g: g if cap is None else min(g, cap) for g in gammas}
            part = extra_tokens(members, sorted({d for d in depths.values() if d}), shape)
            for g in gammas:
                sums[g] += part.get(depths[g], 0.0)
        return sums
    if shape is None or all(abs(s - 1.0) < _FLAT for s in shape[: max(gammas)]):
        for alpha, coverage in rows:
            if alpha >= 1.0:
                for g in gammas:
                    sums[g] += coverage * g
                continue
            scale = coverage * alpha / (1.0 - alpha)
            for g in gammas:
                sums[g] += scale * (1.0 - alpha ** g)
        return sums
    deepest = max(gammas)
    factors = [shape[min(k, len(shape) - 1)] if shape else 1.0 for k in range(deepest)]
    wanted = set(gammas)
    for alpha, coverage in rows:
        reach, total = 1.0, 0.0
        for depth, factor in enumerate(factors, 1):
            reach *= min(alpha * factor, 1.0)
            total += reach
            if depth in wanted:
                sums[depth] += coverage * total
    return sums


class DepthProfile:
    """s_k: acceptance at draft depth k against the rows' α, relative to depth 0 (see the module doc)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self._accepted = [0.0] * max_depth  # decayed: rows that accepted their draft at depth k
        self._expected = [0.0] * max_depth  # decayed: Σ over the rows that reached depth k of their α
        self._alpha_of: dict[int, float] = {}  # id(row) → its α at the last decision
        self._default = 0.5  # the α of a row the last decision did not see (the pooled α then)
        self._deepest = 0  # the deepest depth measured + 1

    def decided(self, running, rows: list[tuple[float, float]], pooled: float) -> None:
        """The last decision's rows (in `running` order) and their (α, ρ); `pooled`: the α of a row it did not see."""
        self._alpha_of = {id(r): alpha for r, (alpha, _) in zip(running, rows)}
        self._default = pooled

    def alpha_of(self, row) -> float:
        """A row's α at the last decision (the pooled α for a row it did not see)."""
        return self._alpha_of.get(id(row), self._default)

    def observe(self, running, accepted, drafted) -> None:
        """A speculative step of `running` rows (slot order) accepted `accepted[i]` of its `drafted[i]` drafts."""
        depth = self.max_depth
        alpha_at = [0.0] * depth  # Σ α of the rows whose deepest reached depth is m
        accepted_at = [0] * (depth + 1)  # rows that accepted exactly a drafts
        alpha_of, default = self._alpha_of, self._default
        for row, a, d in zip(running, accepted, drafted):  # (accepted <= drafted <= max_depth: the engine's step)
            if d > 0:
                alpha_at[a if a < d else d - 1] += alpha_of.get(id(row), default)
                accepted_at[a] += 1
        deepest = min(max(drafted[: len(running)], default=0), depth)
        if deepest <= 0:
            return
        self._deepest = max(self._deepest, deepest)
        alpha = accept = 0.0
        acc, exp = self._accepted, self._expected
        for k in range(depth - 1, -1, -1):  # suffix sums: rows reaching k are those whose deepest is >= k
            alpha += alpha_at[k]
            accept += accepted_at[k + 1]  # rows accepting at k: accepted > k
            acc[k] = acc[k] * _DECAY + accept
            exp[k] = exp[k] * _DECAY + alpha

    def shape(self) -> list[float]:
        """s_k for k < max_depth (1.0 before anything was measured; past the deepest measured depth, its s)."""
        acc, exp = self._accepted, self._expected
        if not self._deepest:
            return [1.0] * self.max_depth
        base = (acc[0] + _PRIOR) / (exp[0] + _PRIOR)
        out = [1.0] + [min(((acc[k] + _PRIOR) / (exp[k] + _PRIOR)) / base, 1.0) for k in range(1, self._deepest)]
        return out + [out[-1]] * (self.max_depth - len(out))

    def report(self) -> list[float]:
        return [round(s, 4) for s in self.shape()[: self._deepest]]
