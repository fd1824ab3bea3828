"""Mixed steps in the γ policy's step-time table (`EngineConfig.mixed_step`): a step that fed prompt chunks beside its
verify rows is timed whole, and the table (`specdec.engine.policy`: T(b, γ, ℓ)) must hold only its decode's share.

The chunks are work the traffic brings whatever γ is chosen (every prompt is fed once, within K steps of its
admission), so the choice weighs the decode steps alone. A split of the step's seconds fitted over every mixed
step together (`prefill.ChunkBudget.mixed_share`: one a + b·tokens, before a fit the excess over the median decode
step) leaks chunk time into the decode samples wherever the chunks' cost departs from that one line — a fixed cost
per mixed step, chunks dearer beside more verify tokens — and chunks ride mostly in speculative steps, so the leak
lands on γ > 0: on one H200 (zoo pair, feature head, 64 slots closed loop) the mixed step's table read γ 4 5.42 ms
and γ 8 7.93 ms at batch 64 against 4.22 / 5.05 ms on the engine without mixed steps (γ 0 2.47 / 2.56), and "auto"
chose a mean γ of 1.68 against 4.17. So, per key (b, γ, ℓ):

- a key timed by a pure decode step (no chunk in it) keeps its pure steps' times only (the lower median of the last
  `window`); a mixed step there adds nothing to the table, but its excess over that median is a measurement of what
  its chunks cost beside γ: (tokens n, seconds r);
- a key only mixed steps timed: each sample is the step's seconds less `ChunkCost.cost(γ, n)`, fitted from the
  excesses measured at γ (at least `MIN_FIT`): r ≈ a + c·n by Theil–Sen (c the median of the pairwise slopes, a the
  median of r − c·n: a straggler moves neither) where the recent sizes spread, else with the slope of the nearest γ
  whose sizes spread (or of every γ's excesses), a the median of r − c·n, or, with no slope anywhere, through the
  origin (c the median of r / n: a fixed cost folds in at the usual size); a γ without its own fit takes the cost interpolated in γ from
  those with one (linear, as T is: `policy_times.interpolate`; below the smallest of them, its cost), else the fit over every γ's excesses; with no excess
  measured yet (no pure step at any key) the engine's split (`mixed_share`) stands in; the key's samples are
  corrected by the fits of the moment each time the key records and every `REFRESH` excesses;
- a key's first pure step drops its corrected samples.

The fit is per γ because chunk tokens do not cost the same beside every γ (one forward of b·(γ + 1) + n tokens), so
a per-γ excess beyond the γ-independent chunk work is attributed to the chunks too, not to γ: the table is the
decode steps' cost, which pure steps measure exactly. Pure Python, deterministic; a fit is computed only when a
corrected sample needs it, over at most `FIT_WINDOW` excesses. Tests: `tests/engine/test_policy_mixed.py`.
"""

from __future__ import annotations

from specdec.engine.policy_times import interpolate

__all__ = ["ChunkCost", "MixedTimes", "FIT_WINDOW", "MIN_FIT", "REFRESH"]

FIT_WINDOW = 16  # excesses kept per γ (and pooled): the fit's pairs, ≤ 120
MIN_FIT = 4  # excesses at a γ before its own fit is used (else the pooled one)
REFRESH = 4  # excesses between two corrections of the keys only mixed steps timed
_SPREAD = 0.25  # the sizes' spread, (max − min) / max, past which a fit separates a fixed cost from a per-token one


def _lower_median(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]


def _spread(points: list[tuple[int, float]]) -> bool:
    """Whether the sizes of `points` [(n, r)] spread enough to fit a slope."""
    sizes = [n for n, _ in points]
    return max(sizes) > 0 and (max(sizes) - min(sizes)) / max(sizes) >= _SPREAD


def _fit(points: list[tuple[int, float]], slope: float | None = None) -> tuple[float, float]:
    """(a, c) of r ≈ a + c·n over `points` [(n, r)]: Theil–Sen where the sizes spread; else with c = `slope` (one
    fitted where they did), a the median of r − c·n; else (0, the median r / n)."""
    if _spread(points):
        slopes = [(r1 - r0) / (n1 - n0) for i, (n0, r0) in enumerate(points) for n1, r1 in points[i + 1:] if n1 != n0]
        slope = max(_lower_median(slopes), 0.0)
    if slope is not None:
        return _lower_median([r - slope * n for n, r in points]), slope
    return 0.0, max(_lower_median([r / n for n, r in points if n > 0]), 0.0)


class ChunkCost:
    """What a mixed step's chunks cost, per γ: fitted from mixed steps' excesses over the pure decode step at their
    key (`measured`)."""

    def __init__(self, window: int = FIT_WINDOW):
        self.window = window
        self._points: dict[int | None, list[tuple[int, float]]] = {}  # γ → (tokens, excess); None: every γ
        self._fits: dict[int | None, tuple[float, float]] = {}  # the fits, until a new point arrives

    def measured(self, gamma: int, tokens: int, excess: float) -> None:
        """A mixed step at γ fed `tokens` chunk tokens and took `excess` seconds more than its key's pure step."""
        for key in (gamma, None):
            points = self._points.setdefault(key, [])
            points.append((int(tokens), float(excess)))
            del points[:-self.window]
            self._fits.pop(key, None)

    def fit(self, gamma: int | None) -> tuple[float, float] | None:
        """(a, c): the chunks of a mixed step at γ cost a + c·tokens seconds, from γ's own excesses (None: fewer
        than `MIN_FIT` of them; γ None: every γ's, None where none was measured)."""
        points = self._points.get(gamma, ())
        if len(points) < (MIN_FIT if gamma is not None else 1):
            return None
        if gamma not in self._fits:
            self._fits[gamma] = _fit(points, None if _spread(points) else self._slope(gamma))
        return self._fits[gamma]

    def _slope(self, gamma: int | None) -> float | None:
        """Sizes too alike at γ to fit a slope: that of the nearest γ whose sizes spread (in γ, the smaller first),
        else of every γ's excesses where they spread (None: no slope anywhere)."""
        spread = [g for g, p in self._points.items() if g is not None and g != gamma and len(p) >= MIN_FIT
                  and _spread(p)]
        if gamma is not None and spread:
            return self.fit(min(spread, key=lambda g: (abs(g - gamma), g)))[1]
        pooled = self._points.get(None, ())
        return self.fit(None)[1] if gamma is not None and pooled and _spread(pooled) else None

    def cost(self, gamma: int, tokens: int) -> float | None:
        """Seconds the chunks of a mixed step at γ that fed `tokens` cost: γ's own fit; else interpolated in γ
        between (or along) the γ's that have one (`policy_times.interpolate`: chunks beside more verify tokens
        cost more); else the fit over every γ (None: no excess measured yet)."""
        own = {g: self.fit(g) for g in self._points if g is not None}
        costs = {g: a + c * tokens for g, fit in own.items() if fit is not None for a, c in (fit,)}
        if costs:  # (below the smallest fitted γ, its cost: no line extended down from noisy fits)
            return costs[min(costs)] if gamma < min(costs) else interpolate(costs, gamma)
        pooled = self.fit(None)
        return None if pooled is None else pooled[0] + pooled[1] * tokens

    def seconds(self, gamma: int, tokens: int, seconds: float, fallback: float) -> float:
        """The chunks' share of a mixed step at γ that fed `tokens` in `seconds` (at most all of it); `fallback`:
        the engine's split, where nothing is measured yet."""
        share = self.cost(gamma, tokens)
        return min(max(fallback if share is None else share, 0.0), seconds)

    def report(self) -> dict:
        """JSON-ready: γ → {fixed_ms, us_per_token, excesses} of the fits in use ("all": pooled over every γ)."""
        out = {}
        for key, points in sorted(self._points.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            a, c = self.fit(key) or _fit(points)  # (a γ short of `MIN_FIT`: its points' own line, for the record)
            out["all" if key is None else str(key)] = {
                "fixed_ms": round(a * 1e3, 3), "us_per_token": round(c * 1e6, 3), "excesses": len(points)}
        return out


class MixedTimes:
    """The table's samples per key (b, γ, ℓ) under mixed steps: pure steps' where any, else mixed steps' corrected
    by `ChunkCost` (see the module doc)."""

    def __init__(self, window: int):
        self.window = window
        self.chunks = ChunkCost()
        self.pure: set[tuple[int, int, int]] = set()  # the keys a pure decode step timed
        self._mixed: dict[tuple[int, int, int], list[tuple[float, int, float]]] = {}  # (seconds, tokens, fallback)
        self._excesses = 0  # excesses measured (every `REFRESH`: the mixed-only keys corrected again)

    def decode_seconds(self, gamma: int, seconds: float, tokens: int, fallback: float) -> float:
        """A step's decode share: all of it without chunks, else less its chunks' `ChunkCost.seconds`."""
        return seconds - self.chunks.seconds(gamma, tokens, seconds, fallback) if tokens else seconds

    def sample(self, key: tuple[int, int, int], seconds: float, tokens: int, fallback: float,
               values: list[float]) -> dict[tuple[int, int, int], list[float]]:
        """A step at `key` (batch bucket, γ, length bucket) took `seconds`, `tokens` of them chunk tokens (0: a
        pure decode step; fallback: the engine's chunk share); `values`: the key's samples now → the keys whose
        samples change, with their new ones: this key's, and every `REFRESH` excesses those of the keys only mixed
        steps timed (corrected again by the fits of the moment)."""
        if not tokens:
            if key not in self.pure:  # its first pure step: the corrected mixed samples give way
                self.pure.add(key)
                self._mixed.pop(key, None)
                values = []
            values.append(float(seconds))
            del values[:-self.window]
            return {key: values}
        if key in self.pure:  # a pure time here: the step measures its chunks' cost, not the table's
            self.chunks.measured(key[1], tokens, seconds - _lower_median(values))
            self._excesses += 1
            if self._excesses % REFRESH:
                return {}
            return {k: self._corrected(k) for k in self._mixed}
        raw = self._mixed.setdefault(key, [])
        raw.append((float(seconds), int(tokens), float(fallback)))
        del raw[:-self.window]
        return {key: self._corrected(key)}

    def _corrected(self, key: tuple[int, int, int]) -> list[float]:
        return [self.decode_seconds(key[1], s, n, f) for s, n, f in self._mixed[key]]
