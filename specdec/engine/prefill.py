"""Chunked prefill as the mixed prefill/decode step (`EngineConfig.prefill_budget`, `EngineConfig.mixed_step`).

With the mixed step on, a request admitted while others run does not prefill at admission: it takes a free slot past
the running ones and is *filling* there (`Scheduler.filling`, oldest first) — its row's state is written but
inactive, so the steps' verify rows leave it alone. Each step `plan_mixed` takes at most one budget of the filling
requests' prompts, the target's and a cached drafter's feeds together, oldest request first (each request's target
prefill, then the drafter's feed of the same prompt, which reads the target's features: `ChunkBudget.plan`); the
target's share rides in the step's one target forward as `PrefillChunks` (`StepInput.prefill`) beside the verify
rows (`engine/mixed_step.py`), and `finish_mixed` then runs a cached drafter's feed (its own pass, in the same step:
batched over groups of consecutive fed slots, `ChunkBudget.groups`), measures the feeds and moves the ready requests
— those whose prompts are fed in full — into slot n, the first past the running ones (`promote_ready`: a younger
filling request there swaps into its slot). So between two decode steps of a running request the engine prefills
at most one budget, and the chunks' share of the step's seconds is timed apart (`ChunkBudget.mixed_share`; the γ
policy sees it: `policy_admission.AdmissionCost.prefilled`). The budget is a fixed number of tokens or "auto"
(`prefill_budget.py`: a fraction of the measured decode step, at the measured prefill rate); with `prefill_steps`
K (4 with "auto") a step feeds more when the backlog needs it, so every request is fed within K steps of its
admission (`step_budget`).

Where the mixed step cannot run the prompts prefill whole: with it off (`config.resolve_mixed_step`: the static
layout, a target body the ragged forward does not cover) and for token-tree requests (no mixed tree step) at
admission (`admission.admit`); requests left filling when nothing runs (every running request finished: no step to
carry their chunks) the rest of their prompts at once, `prefill_rest`, before the step that then runs them.

Invariants: running requests hold slots 0..n-1 (as without a budget); filling requests hold slots ≥ n, in any
order, below the beam groups' (`beam.py` counts them as chain rows), and are always chain requests beside chain
rows (`Scheduler.select` admits one tree shape at a time, and tree requests never fill). In a mixed step the rows
past the n running ones are dead (the null block, `mixed_step.mixed_batch`); in a decode step beside filling rows
(a step whose budget fed a cached drafter alone, no target chunk) an inactive filling row inside the batch bucket
is padding: the step writes its target cache at positions ≥ its prompt length − 1 and its drafter's at ≥ length −
WINDOW (the state holds its prompt length), which its first own step rewrites before anything reads them, and
prefill only ever attends below them. Exactness: a chunk feeds the same positions with the same tokens as an
admission prefill would, so a request's tokens are the same with or without a budget
(tests/engine/test_mixed_prefill.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specdec.engine.engine_request import EngineRequest
from specdec.engine.mixed_shapes import token_buckets, token_floor
from specdec.engine.step_input import PrefillChunks
from specdec.engine.prefill_budget import DEFAULT_STALL, DEFAULT_STEPS, AutoBudget

__all__ = ["ChunkBudget", "MixedFeed", "finish_mixed", "plan_mixed", "prefill_rest", "promote_ready"]


class ChunkBudget:
    """The mixed step's prefill budget (`EngineConfig.prefill_budget`: an int or "auto" — `prefill_budget.AutoBudget`,
    measured; None: the mixed step is off, `config.mixed_step` resolved False), the deadline K (`prefill_steps`), and
    what each step feeds of the filling requests."""

    def __init__(self, config, agree=None):
        mixed = config.mixed_step is True  # (resolved: `config.resolve_mixed_step`, when the runner is built)
        self.mixed_buckets = token_buckets(config) if mixed else None  # (its bounded shapes: mixed_shapes.py)
        self.budget = (config.prefill_budget or "auto") if mixed else None
        auto = self.budget == "auto"
        self.auto = AutoBudget(config.prefill_stall or DEFAULT_STALL) if auto else None
        # agree(int) → int, collective (a sharded target's `leader_int`): "auto" sizes from this rank's timings,
        # so under tensor parallelism each step's budget is rank 0's, or the ranks would feed different chunks
        self.agree = agree if auto else None
        self._decode = self.auto or AutoBudget()  # the decode step's median (a mixed step's excess over it: its chunks)
        self._mixed = AutoBudget()  # mixed steps' seconds against their chunk tokens: a + b·n, a = the step alone
        self.steps = config.prefill_steps or (DEFAULT_STEPS if auto else None)
        self.chunk = config.prefill_chunk

    @property
    def step_prefill_budget(self) -> int | None:
        """The prompt tokens the next step may prefill before its deadlines (`prefill_steps`) ask for more: the fixed
        budget, or "auto"'s from the measured decode step and prefill rate (None: chunked prefill is off)."""
        if self.auto is not None:
            return self.auto.budget(self._decode_seconds())
        return self.budget

    def report(self) -> dict | None:
        """JSON-ready: "auto"'s measurements and budget now (None unless prefill_budget="auto")."""
        if self.auto is None:
            return None
        report = self.auto.report()
        if report["decode_step_ms"] is None and self._decode_seconds() is not None:  # (every step mixed so far)
            report["decode_step_ms"] = self._decode_seconds() * 1e3
        report["budget"] = self.step_prefill_budget
        return report

    def measure_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill fed `tokens` prompt tokens (target and drafter) in `seconds` ("auto" sizes the budget from it)."""
        if self.auto is not None:
            self.auto.fed(tokens, seconds)

    def decoded(self, seconds: float) -> None:
        """A decode step took `seconds` ("auto" sizes the budget from it)."""
        self._decode.decoded(seconds)

    def _decode_seconds(self) -> float | None:
        """The decode step: the median of the measured ones, else (every step mixed: traffic that never stops
        filling) the mixed steps' fitted cost at no chunk tokens (None: neither yet)."""
        step = self._decode.step_seconds()
        if step is None and self._mixed.feed_cost() is not None:
            step = self._mixed.feed_cost()[0] or None
        return step

    def mixed_share(self, tokens: int, seconds: float) -> float:
        """A mixed step fed `tokens` chunk tokens in `seconds` → what its chunks cost: once the mixed steps' seconds
        are fitted against their tokens (a + b·n), b·tokens; before, its excess over the measured decode step (all
        of it before one is measured). The rest is the step's decode (the γ policy's sample)."""
        self._mixed.fed(tokens, seconds)
        if self._mixed.fitted:
            return min(self._mixed.feed_cost()[1] * tokens, seconds)
        step = self._decode.step_seconds()
        return max(seconds - step, 0.0) if step is not None else seconds

    def step_budget(self, filling: list[EngineRequest], num_steps: int, drafter_cached: bool,
                    buckets: tuple[int, ...] | None = None) -> int:
        """This step's budget: `prefill_budget` ("auto"'s rounded down to one of `buckets`, where given: a full step
        pads nothing), or with `prefill_steps` K more where the backlog needs it, so every filling request is fed
        within K steps of its admission — fed oldest first, request i (its own and the older requests' unfed tokens
        C_i, d_i steps left to its deadline) needs ⌈C_i / d_i⌉ this step."""
        budget, steps = self.step_prefill_budget, self.steps
        if self.agree is not None:
            budget = self.agree(budget)
        if buckets is not None and self.auto is not None:
            budget = token_floor(min(budget, buckets[-1]), buckets)
        if not steps:
            return budget
        backlog = 0
        for r in filling:
            backlog += len(r.prompt) - 1 - r.prefilled
            if drafter_cached:
                backlog += max(len(r.prompt) - 2, 0) - r.draft_valid
            budget = max(budget, -(-backlog // max(r.fed_by - num_steps, 1)))
        return budget

    def plan(self, filling: list[EngineRequest], budget: int, drafter_cached: bool) -> tuple[dict, dict]:
        """What this step feeds, oldest request first, within `budget` tokens: ({slot: (start, end)} of the target,
        of a cached drafter); the requests' `prefilled` / `draft_valid` advanced to it."""
        target, drafter = {}, {}
        for request in filling:
            if budget <= 0:
                break
            end = len(request.prompt) - 1  # the target is fed all but the last prompt token
            if request.prefilled < end:
                take = min(end - request.prefilled, budget)
                target[request.slot] = (request.prefilled, request.prefilled + take)
                request.prefilled += take
                budget -= take
            end = max(len(request.prompt) - 2, 0)  # a cached drafter all but the last two (as at admission)
            if drafter_cached and request.prefilled == len(request.prompt) - 1 and request.draft_valid < end \
                    and budget > 0:
                take = min(end - request.draft_valid, budget)
                drafter[request.slot] = (request.draft_valid, request.draft_valid + take)
                request.draft_valid += take
                budget -= take
        return target, drafter

    def groups(self, fed: dict[int, tuple[int, int]], ragged: bool = False) -> list[tuple[slice, list[int], list[int]]]:
        """The batched feeds of the slots in `fed` ({slot: (start, end)}): (rows, starts, ends) per forward group.

        A forward runs every row of its slice: over the chunk columns [min start, max end) of all of them
        (`prefill_rows`: one feed for every filling row computed rows × columns, not tokens — 30 rows filling at
        different offsets, 2 of them fed a budget, cost 15x the tokens fed), or over the longest feed from each
        row's own start (`ragged`: `prefill_ragged`, the target's feeds). So a group holds only slots fed now,
        consecutive, and a slot joins the previous group only while that costs fewer token slots than a forward of
        its own (`prefill_chunk` slots: a forward's launches, in tokens, roughly)."""
        cost = _ragged if ragged else _rectangle
        groups: list[list[int]] = []
        for slot in sorted(fed):
            group = groups[-1] if groups and groups[-1][-1] == slot - 1 else None
            if group is not None:
                merged = cost([fed[s] for s in group + [slot]])
                apart = cost([fed[s] for s in group]) + cost([fed[slot]])
                if merged <= apart + self.chunk:
                    group.append(slot)
                    continue
            groups.append([slot])
        return [(slice(g[0], g[-1] + 1), [fed[s][0] for s in g], [fed[s][1] for s in g]) for g in groups]


def prefill_rest(scheduler, runner, policy, chunked: ChunkBudget) -> bool:
    """Nothing runs, so no step carries chunks: every filling request's unfed prompt prefilled whole now (the
    target's, then a cached drafter's, ragged from where their chunks stopped), and they join the running rows (the
    step then runs them). → whether anything was fed."""
    cached = runner.drafter_cached
    target, drafter = chunked.plan(scheduler.filling, 1 << 62, cached)
    start = time.perf_counter()
    middle = runner.feed(chunked.groups(target, ragged=True) if target else [],
                         chunked.groups(drafter, ragged=runner.drafter_ragged) if drafter else [])
    seconds = time.perf_counter() - start
    fed_target = sum(e - s for s, e in target.values())
    fed_drafter = sum(e - s for s, e in drafter.values())
    chunked.measure_prefill(fed_target + fed_drafter, seconds)
    ready = promote_ready(scheduler, runner, target, drafter, seconds)
    policy.admission.prefilled(fed_target, middle - start, fed_drafter,
                               time.perf_counter() - middle if drafter else None, len(ready),
                               sum(len(r.prompt) for r in ready))
    return bool(target or drafter)


def promote_ready(scheduler, runner, target: dict, drafter: dict, seconds: float) -> list[EngineRequest]:
    """The filling requests fed this step (`target` / `drafter`: {slot: (start, end)}) count `seconds` of prefill;
    those whose prompts are fed in full move into slot n and join the decode steps → them."""
    ready = []
    for request in list(scheduler.filling):
        if target.get(request.slot) or drafter.get(request.slot):
            request.stats.add_prefill(seconds, 1 if request.slot in target else 0)
        if request.prefilled == len(request.prompt) - 1 and (
                not runner.drafter_cached or request.draft_valid >= len(request.prompt) - 2):
            ready.append(request)
    for request in ready:  # it moves into slot n and joins the decode steps
        move = scheduler.promote(request)
        if move is not None:
            kind, src, dst, positions = move
            if kind == "move":  # (the usual case: slot n is free)
                runner.move_slot(src, dst, positions)
                runner.clear_row(src)
            else:  # a younger request fills slot n: the two exchange slots
                runner.swap_slots(src, dst, positions)
        runner.state.active[request.slot] = True
    return ready


@dataclass(frozen=True)
class MixedFeed:
    """What a mixed step feeds (`plan_mixed`): `chunks` in its target forward (None: no target chunk this step,
    the step is a decode step), and `target` / `drafter` ({slot: (start, end)}: `ChunkBudget.plan`'s)."""

    chunks: PrefillChunks | None
    target: dict
    drafter: dict


def plan_mixed(scheduler, chunked: ChunkBudget, drafter_cached: bool) -> MixedFeed:
    """This step's budget of the filling requests' prompts (`ChunkBudget.step_budget` / `plan`, oldest first),
    the target's share as the chunks of the step's forward: at most the largest token bucket
    (`mixed_shapes.token_cap`; an "auto" budget rounded down to a bucket, a deadline's need not), so a step's shape
    is a warmed one."""
    buckets = chunked.mixed_buckets  # at most the largest token bucket ("auto": down to a bucket, padding nothing)
    budget = min(chunked.step_budget(scheduler.filling, scheduler.num_steps, drafter_cached, buckets), buckets[-1])
    target, drafter = chunked.plan(scheduler.filling, budget, drafter_cached)
    chunks = None
    if target:
        bounds = list(target.values())
        chunks = PrefillChunks(tuple(target), tuple(s for s, _ in bounds), tuple(e for _, e in bounds),
                               tuple(r.length for r in scheduler.running))
    return MixedFeed(chunks, target, drafter)


def finish_mixed(scheduler, runner, policy, chunked: ChunkBudget, feed: MixedFeed, share: float) -> None:
    """After a mixed step (its forward fed `feed.chunks` for `share` of its seconds: `ChunkBudget.mixed_share`):
    a cached drafter's feed of the planned prompt positions, in its own pass (it reads the target's features the
    step stored); the feeds measured; the requests fed in full join the decode steps."""
    start = time.perf_counter()
    if feed.drafter:
        runner.feed([], chunked.groups(feed.drafter, ragged=runner.drafter_ragged))
    drafter_seconds = time.perf_counter() - start if feed.drafter else None
    fed_target = sum(e - s for s, e in feed.target.values())
    fed_drafter = sum(e - s for s, e in feed.drafter.values())
    chunked.measure_prefill(fed_target + fed_drafter, share + (drafter_seconds or 0.0))
    ready = promote_ready(scheduler, runner, feed.target, feed.drafter, share + (drafter_seconds or 0.0))
    policy.admission.prefilled(fed_target, share, fed_drafter, drafter_seconds, len(ready),
                               sum(len(r.prompt) for r in ready))


def _rectangle(bounds: list[tuple[int, int]]) -> int:
    """Token slots one forward over these rows computes: rows × (the last end − the first start)."""
    return len(bounds) * (max(e for _, e in bounds) - min(s for s, _ in bounds))


def _ragged(bounds: list[tuple[int, int]]) -> int:
    """Token slots one ragged forward over these rows computes: rows × the longest feed."""
    return len(bounds) * max(e - s for s, e in bounds)
