"""How many tokens the engine drafts in its next step (0 = a plain step): the paper's rule with measured costs.

γ belongs to the request (`SamplingParams.num_draft_tokens`, None = the engine's default): a row capped at 0 drafts
nothing and one capped at an int k exactly k (fewer where its budget ends) in the same verify pass (per-row draft
lengths, `engine.step_runner`), so a step's γ is at least its rows' largest fixed cap, the floor. Without a row at
"auto" the step runs the floor (or the smallest built shape above it: the rows keep their own k, no capture). "auto"
rows draft the step's whole γ, which is picked per batch bucket b and length bucket ℓ (the longest running row's
length, rounded up to a power of two, at least 64) as

    γ* = argmax over γ ≥ floor in {0} ∪ candidates of  mean over running rows of τ_row(min(γ, cap))  /  T(b, γ, ℓ)

T(b, γ, ℓ): the measured wall time of a whole step (device and host), the lower median of its last `_WINDOW`
timed steps (noise in step times is one-sided: a straggler is only ever slower); under mixed steps a decode step's
alone (pure decode steps' where any, else mixed ones less their chunks' fitted cost: `policy_mixed`). An arm
not timed at (b, ℓ) borrows its time from the nearest length bucket at b that timed it, scaled by the arms timed at both
(`borrow`); γ's not timed at b are interpolated linearly in γ between the timed ones. Only while b has timed
fewer than two arms are times borrowed from other batch buckets (their ratios do not carry over well:
speculation costs relatively more in a big batch than in a small one).

τ_row(γ) = 1 + ρ · (E(α, γ) − 1): the tokens a row is expected to produce per step. E is Thm 3.8's expected
tokens (`specdec.analysis.expected_tokens`); α = the row's Σβ over its verified positions with a prior (the
pooled α of the rows seen so far); ρ = the share of the row's speculative steps in which its drafter proposed
anything. Greedy and sampled rows, new and old ones, each weigh in with their own α.

Plain steps and a drafter that keeps a cache (model, feature head): the first speculative step after more than
`_FREE_PLAIN` plain steps in a row feeds the drafter what they committed (the engine's catch-up, an eager
prefill: 30–40 plain steps' worth on an H200), reported with that step (`record_step(..., catch_up_of=plain
steps)`): the time beyond the usual step at its cell is spread over the plain steps that caused it, added to T(b, 0). A switch into a run of plain steps, or out of one, commits to
one catch-up: the arm switched to carries it spread over `_REGIME` steps (hysteresis: no flip-flopping that pays
a catch-up each time; before any catch-up was measured it is taken as `_CATCH_UP_PRIOR` plain steps). The
engine's drafters re-feed their last 4 committed tokens, so up to `_FREE_PLAIN` = 2 plain steps need no
catch-up: a plain probe runs `_PROBE` = 2 steps, and plain probes are separated by a speculative step.

Admission. A drafter that keeps a cache is fed every admitted prompt (at admission while speculating, else by the
next catch-up), a cost no step time shows: speculative steps carry it per token they produce, and leaving a plain
run carries the prompts that run admitted (`specdec.engine.policy_admission`, measured whatever the regime; no
charge under the mixed step, which feeds the drafter in every regime).

Exploration. The very first bucket times γ = `_FIRST_GAMMA` (or the built γ nearest it; cheap even where
speculation is compute-bound) and plain steps, `_FIRST_SAMPLES` steps each; a later new bucket times the arm the
engine is running and, when that speculates, plain steps (free); a run of plain steps borrows the speculative
arms' times. The runner-up, when its time is borrowed from another batch bucket, runs one probe to be timed here
(unless that would interrupt a plain run and pay a catch-up). Otherwise, at most every `_EXPLORE_MIN` decisions
another arm (the runner-up, then the others in turn) runs for `_PROBE` steps, and only while the probes' expected
loss (their steps at the arm's predicted rate instead of the winner's, plus the catch-up a probe out of a plain
run causes) stays under `_EXPLORE_BUDGET` of the time run so far: close arms are re-timed often, far-off ones rarely.

Shapes and captures. Every (batch bucket, γ, length bucket, flavor) is one step shape whose CUDA graphs are
captured once (every running row waits). The engine passes `ready(γ)`: whether this step's shape at γ is built. After the engine's warm-up (which builds every γ of the
menu, 0 and `candidates`, for every batch and length bucket and the common flavors) `only_ready` is set and only
built arms are chosen, so traffic never captures mid-run (a shape the warm-up left out — a top-k flavor, a
length past its bound — has no arm built and captures whatever runs). Without a warm-up an arm not built yet
carries its capture (measured by `record_capture`, else `_CAPTURE_PRIOR` plain steps) spread over `_REGIME`
steps, and a probe of it counts the whole capture in its expected loss.

Cadence: reading the rows' totals costs a host sync, so a decision is kept `_HOLD` steps, until the batch bucket
changes, or until fewer than `_SAME_ROWS` of its rows still run (batch 1: a new request; a few rows coming and
going, as under continuous admission, keep it), or until a row's fixed cap needs more. "auto" rows share the step's
γ: its time is set by its shape (every row computes γ + 1 positions), so one drafting less saves nothing there.
Per-row caps (`row_caps`): a request whose acceptance collapses, or every "auto" row on a drafter-wide collapse,
falls back to plain (cap 0, counted so in the choice) for a cool-down; with `row_cost="tokens"` (a ragged step) an
"auto" row drafts only the depths that pay (`specdec.engine.acceptance`). Exactness holds at every cap. `report()`:
what was measured and chosen (stored per row by the traffic bench), and the collapse counts. A draft-length
policy of the loop (`set_fixed(policy)`) chooses instead of all this: `specdec.engine.policy_loop`.
"""

from __future__ import annotations

from specdec.engine.acceptance import AcceptanceWatch, check_row_cost, held_caps, pass_caps
from specdec.engine.policy_admission import AdmissionCost
from specdec.engine.policy_loop import loop_choice
from specdec.engine.policy_mixed import MixedTimes
from specdec.engine.policy_depth import DepthProfile, extra_tokens as _extra_tokens, row_estimate as _estimate, row_rates
from specdec.engine.policy_times import (Gaps, batch_times, bucket_report, capture_cost, catch_up_cost, interpolate as _interpolate,
                                         keep_last, length_bucket, median as _median, pooled_medians)

__all__ = ["GammaPolicy", "CANDIDATES"]

#: the γ's "auto" may choose besides 0 (those up to max_draft_tokens, and max_draft_tokens itself)
CANDIDATES = (1, 2, 4, 8)  # (6 added nothing in the simulator over 4 and 8, and cost a fifth of the warm-up)
_WINDOW = 8  # timed steps kept per (b, γ, ℓ); T is their median (robust to a stray slow step)
_FIRST_GAMMA = 2  # the first speculative arm timed (cheap where speculation is compute-bound; the line through
# T(0) and T(2) extrapolates the larger γ's, and one the model ranks first runs and so gets timed)
_FIRST_SAMPLES = 3  # timed steps of each first arm at a new batch bucket (a median of 3 drops a straggler)
_PROBE = 2  # steps a probe (a first timing, an exploration) runs
_FREE_PLAIN = 2  # plain steps in a row that need no drafter catch-up (the model drafters' re-fed window)
_HOLD = 8  # steps a decision is kept
_SAME_ROWS = 0.5  # ... while at least this share of its rows still run (batch 1: a new request re-decides)
_REGIME = 256  # steps a run of plain steps, or of speculative ones after it, is expected to last (hysteresis)
_CATCH_UP_PRIOR = 32  # plain steps one catch-up is taken to cost before one was measured (H200: 30-40)
_CAPTURE_PRIOR = 16  # plain steps one graph capture is taken to cost before one was measured (H200: ~0.1 s)
_EXPLORE_MIN = 4  # the fewest decisions between two probes of another arm
_EXPLORE_BUDGET = 0.01  # the share of the run's time probes are expected to lose
_PRIOR_ALPHA, _PRIOR_WEIGHT = 0.5, 8.0  # α before any row was verified; weight (positions) of a row's prior (4
# let a lookup row's first failed all-or-nothing drafts pin it to plain steps, which add no evidence: BENCHMARKS)


class GammaPolicy:
    def __init__(self, spec, max_draft_tokens: int, plain_catches_up: bool = False, watch=None, row_cost="shape"):
        self.fixed, self.loop = None if spec == "auto" else int(spec), None  # loop: a draft-length policy's choice
        self.watch, self.row_cost = AcceptanceWatch() if watch is None else watch, check_row_cost(row_cost)
        self._row_caps, self._capped, self._watching, self._carried = None, False, False, None  # (`row_caps`, `carry`)
        self.plain_catches_up, self.max_draft_tokens = plain_catches_up, max_draft_tokens  # (see the doc)
        self.candidates = sorted({g for g in CANDIDATES if g <= max_draft_tokens} | ({max_draft_tokens} if max_draft_tokens else set()))
        self.default = min(_FIRST_GAMMA, max_draft_tokens) if max_draft_tokens else 0  # the first speculative probe
        self.samples: dict[tuple[int, int, int], list[float]] = {}  # (b, γ, ℓ) → its last step times (seconds)
        self.mixed = MixedTimes(_WINDOW)  # which steps those are under mixed steps (`policy_mixed`)
        self._grid: dict[int, dict[int, dict[int, float]]] = {}  # b → ℓ → γ → T (the samples' lower median)
        self._counts: dict[tuple[int, int], int] = {}  # (b, γ) → timed steps
        self.catch_up: dict[int, list[float]] = {}  # b → the last catch-up costs per plain step (seconds)
        self.catch_up_events: dict[int, list[float]] = {}  # b → the last whole catch-up costs (seconds)
        self.tokens: dict[tuple[int, int], float] = {}  # (b, γ) → EMA of tokens per row per step (measured)
        self.prior_alpha = _PRIOR_ALPHA  # the pooled α of the rows seen at the last decision
        self.last_rates: dict[int, float] = {}  # γ → predicted tokens per row per second at the last decision
        self.predicted: dict[int, float] = {}  # γ → predicted tokens per row per step at the last decision
        self._choice, self._bucket, self._age, self._keep = None, None, 0, 0  # the kept decision
        self._winner = None  # the last decision that was not a probe: the arm the engine is running
        self._members: set[int] = set()  # ids of the rows the kept decision was made for
        self._held: tuple = ()  # those rows (referenced while the decision is kept, so their ids stay theirs)
        self._decisions: dict[int, int] = {}  # b → decisions made
        self._explore: dict[int, list] = {}  # b → [decisions between probes, next probe at, winner before it, turn]
        self._plain_run = 0  # plain steps chosen in a row (past _FREE_PLAIN: a catch-up is pending)
        self._clock = 0.0  # seconds of the steps recorded so far (the exploration budget's clock)
        self.admission = AdmissionCost()  # the drafter's prompt feeding, charged to speculative steps
        self.depth = DepthProfile(max(max_draft_tokens, 1))  # acceptance by draft depth (`policy_depth`)
        self._step_rows = ()  # the rows of the step being chosen (what `record_step`'s accepted counts are of)
        self._auto_step = self.fixed is None  # whether "auto" chose the last step (its rows' α: `record_step`)
        self.gaps = Gaps()  # what runs between steps, per arm (a read-out)
        self.capture_events: list[float] = []  # the last captures' seconds (`record_capture`)
        self.only_ready = False  # choose only arms whose step shape is built (set by the engine's warm-up)
        self.chosen: dict[tuple[int, int], int] = {}  # (b, γ) → decisions that chose it (`report`)

    # ------------------------------------------------------------------------------------- read-outs
    @property
    def times(self) -> dict[tuple[int, int], float]:
        """(b, γ) → the median of the last timed steps over every length bucket (a report)."""
        return pooled_medians(self.samples)

    def report(self) -> dict:
        """JSON-ready, over the policy's life: batch bucket → γ → {median step ms, timed steps, decisions that
        chose it, its median per length bucket, the gaps after its steps (`Gaps`)}; the last catch-ups' ms; `clock_s`, the seconds of the steps
        recorded; `admit_ms_per_token`, the drafter's prompt feeding charged per token of speculative steps, and its
        factors (`policy_admission`); the depth profile (`policy_depth`); the mixed steps' chunk cost fits
        (`policy_mixed`)."""
        buckets = bucket_report(self.samples, self._counts, self.chosen, self.gaps.report())
        return {"buckets": buckets, "clock_s": self._clock, **self.admission.report(), **self.watch.report(),
                "mixed_chunk_cost": self.mixed.chunks.report(),
                "depth_shape": self.depth.report(), "catch_up_ms": {
            str(b): [round(v * 1e3, 2) for v in values] for b, values in self.catch_up_events.items()}}

    def step_time(self, batch: int, gamma: int, length: int | None = None) -> float | None:
        """T(b, γ, ℓ) as the policy estimates it (measured, borrowed from another length bucket, or
        interpolated in γ); None when nothing was timed at this batch bucket."""
        times = self._times(batch, length_bucket(length or 1))
        return _interpolate(times, gamma) if times else None

    # ---------------------------------------------------------------------------------- the choice
    def set_fixed(self, spec) -> None:
        """Switch between a fixed γ (an int, 0 = plain), "auto" and a draft-length policy (a `DraftLengthPolicy` or
        its name: asked every step, told every step's outcome, `policy_loop`), for a new call on a kept engine."""
        self.loop = loop_choice(spec, self.max_draft_tokens)
        self.fixed = None if spec == "auto" or self.loop is not None else int(spec)
        if self.fixed is not None and self.fixed > self.max_draft_tokens:
            raise ValueError(f"num_draft_tokens {self.fixed} exceeds this engine's max_draft_tokens")
        self._choice, self._auto_step, self._carried = None, self.fixed is None, None

    def carry(self, running, gamma: int) -> None:
        """The last `choose` (γ, for `running`) could not run its step: the next over those rows (any order) takes it."""
        self._carried = (gamma, dict(zip(map(id, running), self._row_caps or [None] * len(running))), tuple(running))

    def choose(self, batch: int, running, estimates=None, length: int | None = None, ready=None, caps=None) -> int:
        """γ for the next step at batch bucket `batch`, the longest running row holding `length` tokens (None: one
        length bucket). Each row's acceptance totals (Σβ, verified positions, speculative steps, steps that
        drafted) come from `record_row` or, when given, `estimates()` (one tuple per row: a host read, made only
        when the policy re-decides). ready(γ) → whether this step's shape at γ is built (None: all are); see the
        module doc for `only_ready` and captures. caps: per running row its fixed draft cap (an int, 0 = plain) or
        None (the row is "auto"); None = every row takes the engine's default (`fixed`, or "auto")."""
        carried, self._carried = self._carried, None
        if carried is not None and carried[1].keys() == {id(r) for r in running}:  # (`carry`: its step's rows)
            caps = [carried[1][id(r)] for r in running]
            self._step_rows, self._row_caps = tuple(running), None if None in caps else tuple(caps)
            return carried[0]
        self.gaps.choosing()
        self._step_rows = tuple(running)  # (a snapshot: the engine releases finished rows before `record_step`)
        if self.loop is not None:  # a draft-length policy chooses; "auto"'s models learn nothing from its steps
            gamma, self._row_caps = self.loop.choose(running, ready, caps)
            self._auto_step = self._watching = False
            self._plain_run = self._plain_run + 1 if gamma == 0 else 0
            return gamma
        given, (caps, self._watching) = caps, held_caps(self.watch, running, caps, self.fixed)  # (held rows: cap 0)
        floor, auto = ((self.fixed or 0), self.fixed is None) if caps is None else \
            (max([c for c in caps if c is not None], default=0), None in caps)
        self._auto_step = auto and bool(self.candidates)
        if not self._auto_step:  # every row's γ is its own: the floor, or the smallest built shape above it
            above = [] if ready is None or ready(floor) else \
                [g for g in (*self.candidates, self.fixed or 0) if g > floor and ready(g)]
            gamma = min(above, default=floor)
            self._plain_run = self._plain_run + 1 if gamma == 0 else 0
            self._set_row_caps(given, caps, gamma, running)
            return gamma
        kept = self._choice is not None and self._bucket == batch and self._age < self._keep and self._choice >= floor
        overlap = self._overlap(running) if kept else 1.0
        if kept and overlap >= _SAME_ROWS and (ready is None or ready(self._choice)):
            gamma, self._age = self._choice, self._age + 1
        else:
            gamma, keep = self._decide(batch, running, estimates, length_bucket(length or 1), ready, floor, caps)
            self._choice, self._bucket, self._age, self._keep = gamma, batch, 1, keep
            self._members, self._held = {id(r) for r in running}, tuple(running)  # (held: no id is reused)
            self.chosen[(batch, gamma)] = self.chosen.get((batch, gamma), 0) + 1
            if keep == _HOLD:
                self._winner = gamma
        self._plain_run = self._plain_run + 1 if gamma == 0 else 0
        self._set_row_caps(given, caps, gamma, running, batch, length)
        return gamma

    def observe(self, record) -> None:
        """Every chain step's `StepRecord`, a shape's first run included: a draft-length policy's feedback."""
        if self.loop is not None:
            self.loop.observe(record)

    def row_caps(self) -> tuple[int, ...] | None:
        """The last `choose`'s verify caps per row for `Engine.draft_caps` (`acceptance.pass_caps`; None: unchanged)."""
        return self._row_caps

    def _set_row_caps(self, given, caps, gamma: int, running, batch: int = 0, length: int | None = None) -> None:
        times = self._times(batch, length_bucket(length or 1)) if self.row_cost == "tokens" and gamma else {}
        self._row_caps, self._capped = pass_caps(given, caps, self.fixed, self.max_draft_tokens, self._capped, gamma,
                                                 running, self.depth, times, self.predicted.get(gamma, 1.0))

    def _overlap(self, running) -> float:
        """The share of the rows the kept decision was made for that still run (of the larger of the two sets)."""
        return sum([id(r) in self._members for r in running]) / max(len(self._members), len(running), 1)

    def _decide(self, batch: int, running, estimates, ell: int, ready, floor: int = 0, caps=None) -> tuple[int, int]:
        """→ (γ, steps to keep it): an arm ≥ floor; each row counted at min(γ, its cap) (caps: see `choose`)."""
        arms, unready = self._arms(ready, floor)
        spec = [g for g in arms if g]
        default = min(spec, key=lambda g: (abs(g - self.default), g)) if spec else 0  # the first speculative probe
        if not any(b != batch for b in self._grid):  # the first bucket: time a speculative and a plain probe
            need = [g for g in (default, 0) if g in arms and self._timed(batch, g) < _FIRST_SAMPLES]
            if need:
                first = need[0]
                if first == 0 and default and self.plain_catches_up and self._plain_run >= _FREE_PLAIN:
                    return default, 1  # (a longer run of plain steps would cost a catch-up: one step between)
                return first, _FIRST_SAMPLES if first else _PROBE
        else:  # a new bucket: time the arm the engine is running (no catch-up) and, when that speculates, plain
            current = self._winner if self._winner in arms else default  # steps (a free probe); a plain
            for first in (current, 0) if current else (0,):  # run borrows the speculative arms (`_times`)
                if first in arms and self._timed(batch, first) < _FIRST_SAMPLES:
                    if first == 0 and current and self.plain_catches_up and self._plain_run >= _FREE_PLAIN:
                        return current, 1  # (separate the plain probes: a longer plain run would cost a catch-up)
                    return first, _FIRST_SAMPLES if first else _PROBE
        totals = estimates() if estimates is not None else [_estimate(r).totals() for r in running]
        self.prior_alpha, rows = row_rates(totals, self.prior_alpha, _PRIOR_WEIGHT)
        self.depth.decided(running, rows, self.prior_alpha)
        self.watch.decided(running, [a for a, _ in rows], self.prior_alpha, [t[1] for t in totals])
        times = self._times(batch, ell)
        per_step = self.catch_up.get(batch) or [v for values in self.catch_up.values() for v in values]
        plain_extra = _median(per_step) if per_step else 0.0
        pending = 0.0  # hysteresis: a switch into or out of a run of plain steps commits to one catch-up
        if self.plain_catches_up:
            switch = self._catch_up_cost(batch, times) / _REGIME
            if self._plain_run > _FREE_PLAIN:
                pending = switch
            elif self._decisions:  # (the first decision of all picks the regime freely: nothing runs yet)
                plain_extra = max(plain_extra, switch)
        extra = _extra_tokens(rows, spec, self.depth.shape(), caps)
        admit = self.admission.per_token() * len(rows)  # the drafter's prompt feeding per row-token of a spec. step
        pending += self.admission.backlog() / _REGIME  # and leaving a plain run feeds it what that run admitted
        capture = self._capture_cost(batch, times) / _REGIME if unready else 0.0  # a capture, spread like a catch-up
        rates, predicted = {}, {}
        for gamma in arms:
            tau = 1.0 + extra[gamma] / len(rows) if gamma and rows else 1.0
            seconds = _interpolate(times, gamma) + (plain_extra if gamma == 0 else pending + tau * admit)
            seconds += capture if gamma in unready else 0.0
            predicted[gamma], rates[gamma] = tau, tau / max(seconds, 1e-12)
        self.last_rates, self.predicted = rates, predicted
        ranked = sorted(rates, key=lambda g: (-rates[g], g))
        return self._explore_or_win(batch, ranked, times, unready)

    def _arms(self, ready, floor: int = 0) -> tuple[tuple[int, ...], frozenset]:
        """→ (the arms ≥ floor to choose from, those of them whose shape is not built yet). With `only_ready`, only the
        built arms while any is (a shape no warm-up reached — none of its arms built — captures whatever runs)."""
        arms = tuple(g for g in (0, *self.candidates) if g >= floor)  # (max_draft_tokens, the largest cap, is one)
        if ready is None:
            return arms, frozenset()
        unready = frozenset(g for g in arms if not ready(g))
        if self.only_ready and len(unready) < len(arms):
            return tuple(g for g in arms if g not in unready), frozenset()
        return arms, unready

    def _explore_or_win(self, batch: int, ranked: list[int], times: dict[int, float], unready=frozenset()):
        """(the winner, `_HOLD`), or now and then (another arm, `_PROBE`): see the module doc."""
        count = self._decisions[batch] = self._decisions.get(batch, 0) + 1
        state = self._explore.setdefault(batch, {"after": count + _EXPLORE_MIN, "since": self._clock, "turn": 0})
        winner = ranked[0]
        if len(ranked) < 2:
            return winner, _HOLD
        here = {g for b, g in self._counts if b == batch}
        runner = ranked[1]  # its time borrowed from another batch bucket (a ratio that may not hold here): time it
        if (runner in times and runner not in here and runner not in unready
                and not (self.plain_catches_up and winner == 0 and runner > 0)):
            return runner, _PROBE
        if count < state["after"]:
            return winner, _HOLD
        arm = ranked[1 + state["turn"] % (len(ranked) - 1)]  # the runner-up first, then the others in turn
        rates = self.last_rates
        # what the probe is expected to lose: its steps at the arm's rate instead of the winner's, and the catch-up
        # it causes when it interrupts a run of plain steps
        loss = _PROBE * _interpolate(times, arm) * max(1.0 - rates[arm] / rates[winner], 0.0)
        if winner == 0 and arm and self.plain_catches_up:
            loss += self._catch_up_cost(batch, times) + self.admission.backlog()
        if arm in unready:  # a probe of an arm not built yet captures it
            loss += self._capture_cost(batch, times)
        if (self._clock - state["since"]) * _EXPLORE_BUDGET < loss:
            return winner, _HOLD
        state["turn"] += 1
        state["after"], state["since"] = count + _EXPLORE_MIN, self._clock
        return arm, _PROBE

    def _catch_up_cost(self, batch: int, times: dict[int, float]) -> float:
        return catch_up_cost(self.catch_up_events, batch, times, _CATCH_UP_PRIOR)

    def _capture_cost(self, batch: int, times: dict[int, float]) -> float:
        return capture_cost(self.capture_events, times, _CAPTURE_PRIOR)

    def _timed(self, batch: int, gamma: int) -> int:
        return self._counts.get((batch, gamma), 0)

    def _times(self, batch: int, ell: int) -> dict[int, float]:
        return batch_times(self._grid, batch, ell)

    # ------------------------------------------------------------------------------------ measurements
    def record_step(self, batch: int, gamma: int, seconds: float, tokens_per_row: float,
                    length: int | None = None, catch_up_of: int = 0, catch_up_share: float = 1.0,
                    rows: int = 1, catch_up_prompts: int = 0, accepted=None, drafted=None,
                    draft_seconds: float | None = None, chunk_tokens: int = 0, chunk_share: float = 0.0) -> None:
        """A whole step at (b, γ, the longest row's `length`) took `seconds` and each of its `rows` running rows
        produced `tokens_per_row` on average. catch_up_of > 0: the step first fed the drafter what that many plain
        steps committed; `catch_up_share` of its time beyond the usual step at its cell is charged to them
        (`record_catch_up`; the rest fed `catch_up_prompts` prompt tokens admitted in the plain run, which admission
        feeds otherwise: a sample of the drafter's seconds per prompt token, `policy_admission`). accepted / drafted:
        per running row (slot order) its accepted drafts and its draft length (`policy_depth`; None: not told);
        draft_seconds: the step's drafting (a bound on the drafter's feed cost per token, `policy_admission`);
        chunk_tokens > 0: a mixed step that fed so many prompt tokens, `chunk_share` of its seconds the engine's split
        (`ChunkBudget.mixed_share`): the table takes its decode's share (`policy_mixed`)."""
        whole, seconds = seconds, self.mixed.decode_seconds(gamma, seconds, chunk_tokens, chunk_share)
        self._clock += max(seconds, 0.0)
        self.gaps.stepped(batch, gamma)
        self.admission.stepped(gamma, tokens_per_row * rows, rows)
        if gamma and draft_seconds is not None:
            self.admission.drafted(draft_seconds, sum(drafted[:rows]) if drafted is not None else gamma * rows)
        if gamma and accepted is not None and self._auto_step:  # (the rows' α are those "auto" last decided on)
            self.depth.observe(self._step_rows, accepted, drafted if drafted is not None else [gamma] * len(accepted))
        if accepted is not None and self._watching:  # (every step of "auto" rows, plain ones too: cool-downs)
            self.watch.observe(self._step_rows, accepted, drafted if drafted is not None else [gamma] * len(accepted))
        if catch_up_of > 0:
            usual = self.step_time(batch, gamma, length) if (batch, gamma) in self._counts else None
            if usual is not None and catch_up_share > 0:
                self.record_catch_up(batch, (seconds - usual) * catch_up_share, catch_up_of)
            if usual is not None and catch_up_prompts > 0 and catch_up_share < 1:
                self.admission.fed(max(seconds - usual, 0.0) * (1.0 - catch_up_share), catch_up_prompts)
            return
        key = (batch, gamma, length_bucket(length or 1))  # (a mixed step: pure steps' times first, `policy_mixed`)
        for (b, g, ell), values in self.mixed.sample(key, whole, chunk_tokens, chunk_share,
                                                     self.samples.get(key, [])).items():
            self.samples[(b, g, ell)] = values
            self._grid.setdefault(b, {}).setdefault(ell, {})[g] = _median(values)
        self._counts[(batch, gamma)] = self._counts.get((batch, gamma), 0) + 1
        old = self.tokens.get((batch, gamma))
        self.tokens[(batch, gamma)] = tokens_per_row if old is None else 0.8 * old + 0.2 * tokens_per_row

    def record_admission(self, prompt_tokens: int, seconds: float | None = None, requests: int = 1,
                         target_seconds: float | None = None) -> None:
        """Admission took in `requests` requests of `prompt_tokens` prompt tokens in all (every admission of an
        engine whose drafter keeps a cache, plain run or not) and, when `seconds` is given, fed them to the drafter
        (as it does only while the engine speculates; a plain run's are fed by the next catch-up), which took that
        long; `target_seconds`: the target's prefill of them (every timed admission: what bounds and, with the
        drafter's share of it, re-estimates the drafter's feed cost): see `specdec.engine.policy_admission`."""
        self.admission.admitted(prompt_tokens, seconds, requests, target_seconds)

    def record_capture(self, seconds: float) -> None:
        """A step that first built its shape (captured its graphs) took `seconds`, the capture included."""
        self._clock += max(seconds, 0.0)
        keep_last(self.capture_events, max(seconds, 0.0), _WINDOW)

    def record_catch_up(self, batch: int, seconds: float, plain_steps: int) -> None:
        """A speculative step at bucket b that first fed the drafter what `plain_steps` plain steps committed
        took `seconds` longer than that step usually takes: each of those plain steps cost that much more."""
        for store, value in ((self.catch_up, max(seconds, 0.0) / max(plain_steps, 1)),
                             (self.catch_up_events, max(seconds, 0.0))):
            keep_last(store.setdefault(batch, []), value, _WINDOW)

    def record_row(self, request, beta_sum: float, reached: int, drafting: int) -> None:
        """One speculative step of one request: its Σβ, verified positions, and whether it drafted anything."""
        est = _estimate(request)
        est.beta_sum += beta_sum
        est.reached += reached
        est.spec_steps += 1
        est.drafting_steps += drafting
