"""Acceptance watched online: a request whose drafts stop being accepted falls back to plain decoding for a while.

Exactness does not depend on any of this: a row verifies at most its own draft cap, and every cap (0 included)
gives the target's law (the verify rule is exact at every draft length); the watch only decides how many drafts a
row's verify pass looks at, never how they are verified.

The test is a Bernoulli CUSUM on each verified position, per request and pooled over the drafter. Under Thm 3.8's
model each verified position of a row is accepted with probability α, independently; a step of a row that drafted
d and accepted a verified min(a + 1, d) positions, a of them accepted. Against the row's running estimate α₀ (the
γ policy's, as of its last decision) the alternative is a collapse to α₁ = `ratio` · α₀; each verified position
adds its log-likelihood ratio

    accepted:  ln(α₁ / α₀)  < 0          rejected:  ln((1 − α₁) / (1 − α₀))  > 0

to S = max(0, S + Σ llr), and S ≥ h = ln(1 / `false_alarm`) is a collapse. The bound: while a row's acceptance is
at least its estimate (α ≥ α₀), the likelihood ratio started at any position is a non-negative supermartingale
(which positions are verified depends only on the past), so by Ville's inequality it ever reaches e^h with
probability ≤ e^(−h); a CUSUM alarm within N positions needs one of the N starts to reach it, so

    P(a false alarm within N verified positions) ≤ N · false_alarm      (α ≥ α₀)

(default 1e-6: ≤ 1% over a 10,000-position request). Below α₀ the drift stays negative down to the break-even
α* = ln((1 − α₁)/(1 − α₀)) / (ln((1 − α₁)/(1 − α₀)) − ln(α₁/α₀)) (0.35 at α₀ = 0.6, ratio 1/4), so an estimate
somewhat above the truth does not alarm either. A fall from 0.8 to 0.05 adds ≈ 1.25 nats per step: detected in
≈ 11 steps at the default h ≈ 13.8.

After an alarm the row falls back (cap 0: it drafts nothing in the same verify pass) for a cool-down of
`cooldown` of its steps, doubled after each alarm that follows a probe, at most `max_cooldown`; then it probes
(drafts again) with S restarted at h / 2 (a fast initial response: a still-collapsed row alarms again in half the
time); `recovered` probe steps without an alarm reset its cool-down. The drafter has the same test on the positions
of all rows together against their pooled α₀: its alarm turns speculation off for every "auto" row (the drafter's
cool-down, the same rules). `threshold=None` disables the test (the negative control: it never falls back).
"""

from __future__ import annotations

import math

__all__ = ["AcceptanceWatch", "Cusum", "check_row_cost", "held_caps", "marginal_cap", "pass_caps",
           "step_threshold"]


def marginal_cap(alpha: float, gamma: int, threshold: float, coverage: float = 1.0, shape=None) -> int:
    """The draft length k ≤ γ whose every drafted position pays: the depths j = 1..k whose expected extra token
    ρ · Π_{i<j} min(α s_i, 1) (Thm 3.8's α^j with a depth profile s, `policy_depth`) is at least `threshold`, the
    tokens per drafted position the step earns at its rate (`GammaPolicy.row_caps`). The marginal tokens fall with
    depth, so k is the count of paying depths; E(α, k) = 1 + Σ_{j≤k} α^j = (1 − α^(k+1)) / (1 − α)."""
    reach, cap = 1.0, 0
    for depth in range(gamma):
        factor = shape[min(depth, len(shape) - 1)] if shape else 1.0
        reach *= min(alpha * factor, 1.0)
        if coverage * reach < threshold:
            break
        cap = depth + 1
    return cap


def held_caps(watch, running, caps, fixed):
    """→ (the rows' caps with the "auto" ones `watch` holds back at 0, whether any row is "auto"). caps: per row
    its fixed cap or None ("auto"); None = every row takes `fixed` (None: "auto")."""
    watching = (fixed is None) if caps is None else (None in caps)
    if not watching or not watch.enabled:
        return caps, watching
    held = watch.caps(running)
    if 0 not in held:
        return caps, watching
    base = [fixed] * len(running) if caps is None else caps
    return [0 if c is None and h == 0 else c for c, h in zip(base, held)], watching


def check_row_cost(row_cost: str) -> str:
    if row_cost not in ("shape", "tokens"):
        raise ValueError(f"row_cost must be 'shape' or 'tokens', got {row_cost!r}")
    return row_cost


def step_threshold(times: dict[int, float], gamma: int, tau: float) -> float | None:
    """The tokens a drafted position must earn at a step of γ predicted at τ̄ tokens per row (times: γ → T at this
    cell, `policy_times`): τ̄ (T(γ) − T(0)) / (γ T(γ)), the step's rate times one position's share of the
    speculation's time (T(γ) = T(0)(1 + γc): τ̄ c / (1 + γc)); None without times or γ."""
    if not times or not gamma:
        return None
    from specdec.engine.policy_times import interpolate

    step, plain = interpolate(times, gamma), interpolate(times, 0)
    return tau * max(step - plain, 0.0) / (gamma * max(step, 1e-12))


def pass_caps(given, caps, fixed, top: int, was_capped: bool, gamma: int = 0, running=(), depth=None,
              times=None, tau: float = 1.0) -> tuple[tuple[int, ...] | None, bool]:
    """→ (the verify pass's caps per row, slot order — "auto" rows at `top` unless capped — or None, whether any
    "auto" row is capped). given: the engine's caps (`held_caps`' argument), caps: after `held_caps`; times (a
    ragged step's, `row_cost="tokens"`): each still-"auto" row drafts its `marginal_cap` at γ against
    `step_threshold`, its α and the depth profile from `depth` (`DepthProfile`). While no row is capped: None,
    except once after the last cap lifts (the engine then writes its static caps back)."""
    n = len(running) if given is None else len(given)
    base = [fixed] * n if given is None else list(given)
    final = base if caps is None else list(caps)
    theta = step_threshold(times, gamma, tau)
    if theta is not None:
        shape = depth.shape()
        final = [marginal_cap(depth.alpha_of(r), gamma, theta, 1.0, shape) if c is None else c
                 for r, c in zip(running, final)]
    capped = any(b is None and f is not None for b, f in zip(base, final))
    if not (capped or was_capped):
        return None, False
    return tuple(top if f is None else f for f in (final if capped else base)), capped


class Cusum:
    """The drafter's sequential test and fall-back state (a request's are lists in `AcceptanceWatch`)."""

    __slots__ = ("score", "cooldown", "left", "probing", "alarms")

    def __init__(self, cooldown: int):
        self.score, self.cooldown, self.left, self.probing, self.alarms = 0.0, cooldown, 0, 0, 0


class AcceptanceWatch:
    """Per request and per drafter: whether a row drafts this step (`caps`), updated from each step's accepted
    and drafted counts (`observe`). A request's state is keyed by its id while the watch holds a reference to it
    (the rows of the last decision, and those falling back), so no id is reused meanwhile."""

    def __init__(self, false_alarm: float | None = 1e-6, ratio: float = 0.25, cooldown: int = 32,
                 max_cooldown: int = 512, recovered: int = 16, min_positions: int = 32):
        if false_alarm is not None and not 0.0 < false_alarm < 1.0:
            raise ValueError(f"false_alarm must be in (0, 1) or None, got {false_alarm!r}")
        if not 0.0 < ratio < 1.0:
            raise ValueError(f"ratio must be in (0, 1), got {ratio!r}")
        if cooldown < 1 or max_cooldown < cooldown or recovered < 1:
            raise ValueError("cooldown, max_cooldown and recovered must satisfy 1 <= cooldown <= max_cooldown, "
                             f"recovered >= 1 (got {cooldown}, {max_cooldown}, {recovered})")
        self.threshold = None if false_alarm is None else math.log(1.0 / false_alarm)
        self.ratio, self.base_cooldown, self.max_cooldown, self.recovered = ratio, cooldown, max_cooldown, recovered
        self.min_positions = min_positions
        self.drafter = Cusum(cooldown)
        self._rows: tuple = ()  # the last decision's rows (referenced: their ids stay theirs)
        self._tested: dict[int, list] = {}  # id(row) → [score, llr accepted, llr rejected] (rows with evidence)
        self._back: dict[int, list] = {}  # id(row) → [steps left, next cool-down, probe steps, the row] (alarmed)
        self._pooled: tuple | None = None  # the pooled α₀'s llr terms (None: not tested yet)
        self.collapses = 0  # requests' alarms
        self.fallback_steps = 0  # row-steps a request spent falling back
        self.drafter_steps = 0  # steps speculation was off drafter-wide

    @property
    def enabled(self) -> bool:
        return self.threshold is not None

    def decided(self, running, alphas, pooled: float, reached) -> None:
        """The γ policy's last decision: each running row's α₀ (`alphas`, in `running` order), the pooled α, and
        each row's verified positions (`reached`): a row is tested against its α₀ only once that rests on
        `min_positions` of its own (before, α₀ is mostly the prior: a row below the pool's α is no collapse), the
        drafter once the rows together have that many."""
        least, old = self.min_positions, self._tested
        self._rows = tuple(running)
        self._tested = {id(r): [old[id(r)][0] if id(r) in old else 0.0, *self._terms(a)]
                        for r, a, n in zip(running, alphas, reached) if n >= least}
        self._pooled = self._terms(pooled) if sum(reached) >= least else None
        alive = {id(r) for r in running}
        self._back = {key: entry for key, entry in self._back.items() if key in alive}

    def drafter_off(self) -> bool:
        return self.drafter.left > 0

    def caps(self, running) -> list[int | None]:
        """Per running row: 0 (falling back: plain this step) or None (drafts as the policy decides)."""
        if not self.enabled or not (self._back or self.drafter.left):
            return [None] * len(running)
        if self.drafter.left:
            return [0] * len(running)
        back = self._back
        return [0 if id(r) in back and back[id(r)][0] > 0 else None for r in running]

    def observe(self, running, accepted, drafted) -> None:
        """One step of `running` rows (slot order): row i accepted `accepted[i]` of its `drafted[i]` drafts."""
        if not self.enabled:
            return
        h, pooled, any_drafted = self.threshold, 0.0, False
        tested, back, terms = self._tested, self._back, self._pooled
        for row, a, d in zip(running, accepted, drafted):
            key = id(row)
            entry = back.get(key) if back else None
            if entry is not None and entry[0] > 0:  # falling back: the cool-down runs
                entry[0] -= 1
                self.fallback_steps += 1
                if entry[0] == 0:  # probe, the test restarted at h / 2
                    entry[2] = 1
                    if key in tested:
                        tested[key][0] = h / 2
                continue
            if d <= 0:
                continue
            any_drafted = True
            if terms is not None:
                pooled += a * terms[0] + (terms[1] if a < d else 0.0)
            test = tested.get(key)
            if test is None:
                continue
            score = test[0] + a * test[1] + (test[2] if a < d else 0.0)
            test[0] = score if score > 0.0 else 0.0
            if score >= h:
                test[0] = 0.0
                self.collapses += 1
                if entry is None:
                    entry = back[key] = [0, self.base_cooldown, 0, row]
                if entry[2]:  # (an alarm in a probe: the collapse persists, so wait longer)
                    entry[1] = min(entry[1] * 2, self.max_cooldown)
                entry[0], entry[2] = entry[1], 0
            elif entry is not None and entry[2]:
                entry[2] += 1
                if entry[2] > self.recovered:  # recovered: forgotten
                    del back[key]
        self._drafter_step(pooled, any_drafted and terms is not None, h)

    def _drafter_step(self, llr: float, drafted: bool, h: float) -> None:
        state = self.drafter
        if state.left > 0:
            state.left -= 1
            self.drafter_steps += 1
            if state.left == 0:
                state.score, state.probing = h / 2, 1
            return
        if not drafted:
            return
        state.score = max(0.0, state.score + llr)
        if state.score >= h:
            state.alarms += 1
            if state.probing:
                state.cooldown = min(state.cooldown * 2, self.max_cooldown)
            state.left, state.score, state.probing = state.cooldown, 0.0, 0
        elif state.probing:
            state.probing += 1
            if state.probing > self.recovered:
                state.probing, state.cooldown = 0, self.base_cooldown

    def _terms(self, alpha0: float) -> tuple[float, float]:
        """ln(L₁ / L₀) of an accepted and of a rejected position (α₁ = ratio · α₀; α₀ clipped inside (0, 1)): a
        step that accepted a of d drafts adds a · the first, plus the second when a < d."""
        a0 = min(max(alpha0, 1e-3), 1.0 - 1e-3)
        a1 = self.ratio * a0
        return math.log(a1 / a0), math.log((1.0 - a1) / (1.0 - a0))

    def report(self) -> dict:
        """JSON-ready counts: request collapses, their fall-back row-steps, drafter-wide collapses and their steps."""
        return {"collapses": self.collapses, "fallback_steps": self.fallback_steps,
                "drafter_collapses": self.drafter.alarms, "drafter_off_steps": self.drafter_steps}
