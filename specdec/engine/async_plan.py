"""What async scheduling launches ahead (`AsyncSteps.plan`): the next step's `StepInput` and shape, decided before
the step in flight is read — or why it cannot run ahead (a reason, counted in `AsyncSteps.synchronous_fallbacks`).

γ. Rows that each carry a fixed cap (an int: `num_draft_tokens` fixed, a request's own, or no drafter) run at the
floor, the same while the rows are: the step ahead must be N's step shape, so its tokens are the synchronous
engine's. "auto" rows: the policy chooses from the last record read, one step late — its books (`record_step`)
hold the steps read, the rows' acceptance totals (`estimates`) are the slot counters the last read step left (a
host copy, `AsyncSteps.read_counters`; never the device's, which already hold the step in flight) and the steps
committed (`Scheduler.spec_steps`): with N in flight, records ≤ N − 1, the choice the synchronous engine would make
were it one record behind. The step ahead of N attends over the length bucket of the bound every length N can leave
(longest + γ_N + 1 + its own γ + 1): near a boundary one step runs at the larger bucket, never a fallback.

The policy decides for the live rows (finished ones kept masked in their slots, `AsyncSteps.zombies`, are not its
rows: the synchronous engine would have released them). A choice whose step then proves unable to run ahead (a
catch-up, a zombie's writes past its positions: both known only with γ) is carried to the synchronous step
(`GammaPolicy.carry`): the policy's books hold one decision per step that ran — unless a row finished in the step
read meanwhile, when the synchronous step decides again for the rows that remain (the dropped choice stays counted).
"""

from __future__ import annotations

from specdec.engine.agreement import timed_choice
from specdec.engine.config import BATCH_BUCKETS
from specdec.engine.drafters import Flavor
from specdec.engine.step_input import StepInput
from specdec.step import StepCounts

__all__ = ["plan", "counter_totals"]


def plan(steps, pending):
    """The next step, run ahead of `pending`'s read (None: of nothing; the host's lengths are exact) → (its
    `StepInput`, shape, longest host length, caught up?), or why it cannot run ahead (a reason string). Past the
    pure checks it has the synchronous step's side effects (caps, the policy's choice, blocks, a catch-up)."""
    e = steps.engine
    s, runner, policy = e.scheduler, e.runner, e.policy
    running = s.running
    n, zombies = len(running), steps.zombies
    if n == len(zombies):
        return "idle" if not n else "finished"
    if s.aborted:
        return "abort"
    if s.filling:
        return "filling"
    if e.beams.has_unfinished:
        return "beams"
    if s.waiting and admits(s, e.beams._chain_limit(), n - len(zombies)):
        return "admission"
    if running[0].params.draft_tree is not None:
        return "tree"
    batch, longest, flavor = s.step_rows(policy.fixed)
    if flavor.constrained:
        return "constrained"
    if policy.loop is not None:  # (a draft-length policy is told each step's record before it chooses the next)
        return "draft-length policy"
    auto = None in s.caps  # (an "auto" row: the policy chooses from the last record read)
    if auto and e._agree is not None and timed_choice(policy.fixed, s.caps):
        return "tensor parallel"  # (rank 0's choice, one broadcast: not behind a step in flight)
    gone = set(zombies)
    live = [i for i in range(n) if i not in gone]
    if zombies:  # finished rows kept masked in their slots: the step must be the live rows' own
        longest = beside(s, live, batch, flavor)
        if isinstance(longest, str):
            return longest
    length, gamma = longest, None
    if pending is not None:
        last = pending.step
        if (batch, n, flavor) != (last.batch, last.num_rows, last.flavor):
            return "shape"
        length = longest + last.gamma + 1  # every length `last` can leave lies in longest + 1 .. + γ + 1
        if not auto:  # (fixed caps: `last`'s γ and its bucket, so its shape)
            gamma = last.gamma
            if runner.positions(longest + 1, gamma) != last.positions or runner.positions(length, gamma) != last.positions:
                return "length bucket"
            why = blocked(steps, gamma, length)
            if why is not None:
                return why
    pool = e.kv_pool
    if pool is not None:  # blocks for what the step may write (past `last`'s commit, when one is in flight)
        if s.prefix_cache is not None:
            s.prefix_cache.commit_rows(running, s.drafter_state)
        if pending is None:
            if s.short_row() is not None:
                return "pool"
        elif any(not pool.reserve(i, r.length + last.gamma + 1 + s.pool_margin(r.params)) for i, r in enumerate(running)):
            return "pool"  # (the margin holds any γ the step may take)
        pool.flush()
    if s.device_caps is not e._caps_from:
        e._caps_from = e._step_caps = s.device_caps
    ready = None
    if e.cuda_graphs or policy.only_ready:
        built = runner.steps
        ready = lambda g: (batch, g, runner.positions(length, g), flavor) in built  # noqa: E731
    if pending is None and auto:  # (the step just read: the next plan's record, taken before this step runs)
        steps.read_counters = runner.state.counters[:n].to("cpu", copy=True)
    rows = [running[i] for i in live] if zombies else running
    caps = [s.caps[i] for i in live] if zombies else s.caps
    chosen = policy.choose(batch, rows, lambda: steps.estimates(live), length=length, ready=ready, caps=caps)
    steps.chosen = live  # (the rows of the policy's choice, slot order: what `record_step`'s counts are of)
    capped = policy.row_caps()
    if capped is not None:  # (the live rows' caps; a zombie's slot keeps its own, masked)
        held = iter(capped)
        e._step_caps = tuple(e._step_caps[i] if i in gone else next(held) for i in range(n)) + e._step_caps[n:]
    if pending is not None:
        if gamma is not None and chosen != gamma:
            return "gamma"
        why = blocked(steps, chosen, length) if gamma is None else None
        if why is not None:
            policy.carry(rows, chosen)  # (the synchronous step runs this choice: one decision for one step)
            return why
    caught_up = e._catch_up_drafter(chosen)
    step = StepInput(n, batch, chosen, runner.positions(length, chosen), flavor, e._step_caps)
    shape = e._step_for(step)
    if pending is not None and gamma is not None and shape is not pending.run:
        return "shape"
    return step, shape, length, caught_up


def blocked(steps, gamma: int, length: int) -> str | None:
    """Why a step at γ cannot run ahead of the step in flight (the host's lengths `length` at most), or None: a
    zombie's junk writes would pass its positions, or the drafter's bookkeeping needs the host's lengths (a catch-up
    before a speculative step, or a plain step's record of what the drafter holds)."""
    e = steps.engine
    s, runner = e.scheduler, e.runner
    if steps.zombies and runner.positions(max(s.running[i].length for i in steps.zombies), gamma) > \
            runner.positions(length, gamma):
        return "finished"
    if runner.drafter_cached and s.drafter_synced != (gamma > 0):
        return "catch-up"
    return None


def admits(s, limit: int, occupied: int) -> bool:
    """Whether the next synchronous call would admit a waiting request, `occupied` slots of `limit` held (the
    zombies' counted free): `Scheduler.admission_waits`' rule, whose side effect (when a free slot started
    waiting) is made only where the answer is to wait — the synchronous call then decides the same."""
    free = limit - occupied
    if free <= 0:
        s.free_since = None
        return False
    if free < s.admit_min:
        since = s.num_steps if s.free_since is None else s.free_since
        if s.num_steps - since < s.admit_max_wait:
            s.free_since = since
            return False
    return True


def beside(s, live: list[int], batch: int, flavor) -> int | str:
    """With zombie rows in the step: the longest live row's length, or why the step is not the live rows' own
    (their batch bucket or flavor would differ: the zombies must leave first)."""
    rows = [s.running[i] for i in live]
    if next(b for b in BATCH_BUCKETS if b >= len(live)) != batch or Flavor.union(r.flavor for r in rows) != flavor:
        return "finished"
    return max(r.length for r in rows)


def counter_totals(counters, gamma: int) -> list[tuple[float, float, float]]:
    """Rows of slot counters `[rows, width(γ)]` (host) → each row's (Σβ, verified positions, steps that drafted), as
    `Runner.row_sums` reads them on the device."""
    beta, drafting = StepCounts.column("beta_sum", gamma), StepCounts.column("drafting_rows", gamma)
    reached = StepCounts.positions("reached", gamma)
    return [(v[beta], sum(v[reached]), v[drafting]) for v in counters.tolist()]
