"""Async scheduling (`EngineConfig.async_scheduling`, vLLM's name; SGLang's overlap scheduler): the host launches
decode step N+1 before it reads step N's record, so the device does not idle through the host's bookkeeping.

    engine = Engine(target, drafter, EngineConfig(num_draft_tokens=4, async_scheduling=True))

`Engine.step` with no step in flight runs the synchronous step (aborts, admission, prefill, the decode step and its
commit), then launches the next decode step ahead where it needs no decision of the host (`AsyncSteps.plan`). With a
step N in flight, a call launches step N+1 first — where it too needs nothing of the host — then reads N's record (a
copy into pinned host memory behind a CUDA event; on CPU the step ran already: the same code path, synchronously)
and commits it. Where N+1 cannot run ahead the call commits N alone, and the next call is synchronous.

What N+1 needs of N, and where it is: N's committed tokens, lengths and budgets are in the slot state on the device
(the verify pass wrote them); the host's part — which rows run, their caps, γ, the batch bucket — is what N ran with,
unchanged while nothing joins or leaves; the length bucket is known when every length N can leave (each row commits
1..γ+1 tokens) falls in N's bucket. Rows that finished in N are masked on the device before N+1 runs (`mask`:
`SlotState.active` cleared from N's table, so they commit and count nothing), keep their slots until N+1 is read
(`zombies`), and then leave: their N+1 rows are discarded, never emitted.

A step runs ahead only as a chain step (no token trees, beam groups, host constraints or mixed steps), at a fixed γ
(every row's cap an int — `num_draft_tokens` fixed, or each request's own, or no drafter: "auto" decides from the
records it would not have yet), with nothing filling or admissible
(no waiting request while a slot is free), no abort pending, N's step shape, no drafter catch-up, and (paged) blocks
for both steps without a preemption; `fallbacks` counts the other steps by reason. An abort seen while a step is in
flight drops that step's output of the request (the synchronous engine would not have run it for the request) and
the request leaves at the next call, as it would have.

Each call still returns one decode step's outputs (the step launched ahead is the next call's); every request's tokens
are the synchronous engine's (with a fixed γ a request's tokens do not depend on its batch), but a request added while
a step runs ahead joins one step later. Steps launched ahead carry no draft / verify times (`StepRecord`: 0).
`Engine.stats` read while a step is in flight holds that step's acceptance counters (device sums) but not yet its
host counts; assigned while one is in flight, that step counts on neither side (`stats_reset`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.engine import admission
from specdec.engine.commit import commit, finish, finished_slots
from specdec.engine.config import BATCH_BUCKETS
from specdec.engine.drafters import Flavor
from specdec.engine.step_input import StepInput
from specdec.metrics import SpecStats
from specdec.step import RequestOutput, StepRecord

__all__ = ["AsyncSteps", "InFlight"]


@dataclass(frozen=True)
class InFlight:
    """A launched step not yet read: its input and shape; its `pack_step` table on the device (`device`, read by the
    next step's `mask`) and on its way to the host (`table`, valid once `event` has passed; no event on CPU); the slot
    state's counters after it (`counters [rows, width]`, host: the finished rows' statistics, read without waiting
    for the next step); its drafter's passes; the longest row's host length its bucket was chosen for; whether a
    drafter catch-up preceded it; whether it was its shape's first run (a capture: no step time); its launch time."""

    step: StepInput
    run: object
    device: torch.Tensor
    table: torch.Tensor
    counters: torch.Tensor
    event: object
    drafter_calls: int
    longest: int
    caught_up: bool
    first_run: bool
    launched: float


class AsyncSteps:
    """See the module doc: the engine's step in the async order, with its own state (the step in flight, the
    zombie slots, the pinned host buffers, the counts of steps run ahead and of fallbacks by reason)."""

    def __init__(self, engine):
        self.engine = engine
        self.pending: InFlight | None = None
        self.zombies: list[int] = []  # slots finished in a committed step while the next ran (masked there)
        self.ahead = 0  # steps launched before the step before them was read
        self.fallbacks: dict[str, int] = {}  # why a step did not run ahead → how often
        self._rings: dict[tuple, list] = {}  # (table shape, counters shape) → [toggle, two (table, counters, event)]
        self._read_at = 0.0
        self._unstated: InFlight | None = None  # the step in flight when `Engine.stats` was reset (`stats_reset`)

    # ----------------------------------------------------------------------------------------------- the step
    def step(self) -> list[RequestOutput]:
        e = self.engine
        pending = self.pending
        if pending is None:  # the synchronous step, then the next one launched ahead where it can be
            outputs = e._step()
            self.pending = self._ahead(None)
            return outputs
        aborted = self._aborted()  # (seen now: dropped from the step in flight, leave at the next call)
        after = self._ahead(pending) if not aborted else self._fallback("abort")
        record = self.read(pending)
        self.pending = after
        return self._commit(pending, record, after is not None, aborted)

    def _aborted(self) -> set[str]:
        """The ids aborted so far (a copy under the scheduler's lock: `abort` may add to the set from another thread)."""
        s = self.engine.scheduler
        if not s.aborted:
            return set()
        with s.lock:
            return set(s.aborted)

    def _fallback(self, why: str) -> None:
        self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
        return None

    def _ahead(self, pending: InFlight | None) -> InFlight | None:
        plan = self.plan(pending)
        if isinstance(plan, str):
            return self._fallback(plan)
        return self._launch(pending, *plan)

    def plan(self, pending: InFlight | None):
        """The next step, run ahead of `pending`'s read (None: of nothing; the host's lengths are exact) → (its
        `StepInput`, shape, longest host length, caught up?), or why it cannot run ahead (a reason string). Past the
        pure checks it has the synchronous step's side effects (caps, the policy's choice, blocks, a catch-up)."""
        e = self.engine
        s, runner = e.scheduler, e.runner
        running = s.running
        n, zombies = len(running), self.zombies
        if n == len(zombies):
            return "idle" if not n else "finished"
        if s.aborted:
            return "abort"
        if s.filling:
            return "filling"
        if e.beams.has_unfinished:
            return "beams"
        if s.waiting and self._admits(e.beams._chain_limit(), n - len(zombies)):
            return "admission"
        if running[0].params.draft_tree is not None:
            return "tree"
        batch, longest, flavor = s.step_rows(e.policy.fixed)
        if flavor.constrained:
            return "constrained"
        if None in s.caps:  # (an "auto" row: its γ and caps come from the records; every cap an int: the choice
            return "auto"  # is a function of the rows, the same for the step ahead)
        if zombies:  # finished rows kept masked in their slots: the live rows' step must be the one they would run
            longest = self._beside(zombies, batch, flavor)
            if isinstance(longest, str):
                return longest
        length = longest
        if pending is not None:
            last = pending.step
            if (batch, n, flavor) != (last.batch, last.num_rows, last.flavor):
                return "shape"
            gamma = last.gamma  # (the rows and caps of `last`: the policy's choice is the same)
            length = longest + gamma + 1  # every length `last` can leave lies in longest + 1 .. + γ + 1
            if runner.positions(longest + 1, gamma) != last.positions or runner.positions(length, gamma) != last.positions:
                return "length bucket"
            if zombies and runner.positions(max(running[i].length for i in zombies), gamma) > last.positions:
                return "finished"  # (a zombie's junk writes stay inside the step's positions)
            if runner.drafter_cached and s.drafter_synced != (gamma > 0):
                return "catch-up"  # (a catch-up or a plain step's bookkeeping reads the host's lengths)
        pool = e.kv_pool
        if pool is not None:  # blocks for what the step may write (past `last`'s commit, when one is in flight)
            if s.prefix_cache is not None:
                s.prefix_cache.commit_rows(running, s.drafter_state)
            if pending is None:
                if s.short_row() is not None:
                    return "pool"
            elif any(not pool.reserve(i, r.length + gamma + 1 + s.pool_margin(r.params)) for i, r in enumerate(running)):
                return "pool"
            pool.flush()
        if s.device_caps is not e._caps_from:
            e._caps_from = e._step_caps = s.device_caps
        ready = None
        if e.cuda_graphs or e.policy.only_ready:
            steps = runner.steps
            ready = lambda g: (batch, g, runner.positions(length, g), flavor) in steps  # noqa: E731
        gamma = e.policy.choose(batch, running, e._row_estimates, length=length, ready=ready, caps=s.caps)
        capped = e.policy.row_caps()
        if capped is not None:
            e._step_caps = tuple(capped) + e._step_caps[n:]
        if pending is not None and gamma != pending.step.gamma:
            return "gamma"
        caught_up = e._catch_up_drafter(gamma)
        step = StepInput(n, batch, gamma, runner.positions(length, gamma), flavor, e._step_caps)
        shape = e._step_for(step)
        if pending is not None and shape is not pending.run:
            return "shape"
        return step, shape, length, caught_up

    def _admits(self, limit: int, occupied: int) -> bool:
        """Whether the next synchronous call would admit a waiting request, `occupied` slots of `limit` held (the
        zombies' counted free): `Scheduler.admission_waits`' rule, whose side effect (when a free slot started
        waiting) is made only where the answer is to wait — the synchronous call then decides the same."""
        s = self.engine.scheduler
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

    def _beside(self, zombies: list[int], batch: int, flavor) -> int | str:
        """With zombie rows in the step: the longest live row's length, or why the step is not the live rows' own
        (their batch bucket, flavor or largest cap would differ: the zombies must leave first)."""
        s = self.engine.scheduler
        gone = set(zombies)
        live = [r for i, r in enumerate(s.running) if i not in gone]
        caps = [c for i, c in enumerate(s.caps) if i not in gone]
        if next(b for b in BATCH_BUCKETS if b >= len(live)) != batch or Flavor.union(r.flavor for r in live) != flavor \
                or max(s.caps[i] for i in zombies) > max(caps):
            return "finished"
        return max(r.length for r in live)

    def _launch(self, pending: InFlight | None, step: StepInput, shape, length: int, caught_up: bool) -> InFlight:
        runner = self.engine.runner
        first_run = not shape.ran
        if pending is not None:
            self.mask(pending)
            self.ahead += 1
        launched = time.perf_counter()
        device = runner.launch(step, shape)
        counters = runner.state.counters[: device.shape[0] - 1]
        table, held, event = self._buffers(device, counters)  # (CUDA: pinned, both copies behind one event; CPU:
        table.copy_(device, non_blocking=True)  # the step ran already, the same buffers taken in turn)
        held.copy_(counters, non_blocking=True)
        if event is not None:
            event.record()
        return InFlight(step, shape, device, table, held, event, shape.drafts.forward_passes, length, caught_up,
                        first_run, launched)

    def _buffers(self, device: torch.Tensor, counters: torch.Tensor):
        """Two sets of host buffers per table shape (pinned, with an event, on CUDA), taken in turn: one step's is
        read while the next step's lands."""
        key = (tuple(device.shape), tuple(counters.shape))
        ring = self._rings.get(key)
        if ring is None:
            cuda = device.is_cuda
            ring = self._rings[key] = [0] + [
                (torch.empty(device.shape, dtype=device.dtype, pin_memory=cuda),
                 torch.empty(counters.shape, dtype=counters.dtype, pin_memory=cuda),
                 torch.cuda.Event() if cuda else None)
                for _ in range(2)]
        ring[0] ^= 1
        return ring[1 + ring[0]]

    def mask(self, pending: InFlight) -> None:
        """Rows that finished in `pending` commit nothing more: their `active` cleared on the device from its table
        (column `finished`, `step.StepLayout`), in stream order before the next step reads it."""
        rows = pending.device.shape[0] - 1
        active = self.engine.runner.state.active[:rows]
        active.logical_and_(pending.device[:rows, pending.run.layout.k + 3] == 0)

    def read(self, pending: InFlight) -> StepRecord:
        """The step's record, once its copy has landed (the step's one wait)."""
        if pending.event is not None:
            pending.event.synchronize()
        return StepRecord.unpack(pending.table, pending.run.layout, drafter_calls=pending.drafter_calls)

    def stats_reset(self) -> None:
        """`Engine.stats` was assigned: the device sums were zeroed behind the step in flight (stream order), so its
        host counts stay out of the new statistics too (else its tokens would count without its acceptance)."""
        self._unstated = self.pending

    # --------------------------------------------------------------------------------------------- the commit
    def _commit(self, pending: InFlight, record: StepRecord, hold: bool, aborted: set) -> list[RequestOutput]:
        """`Engine._commit` of a step read late: the zombie rows' (empty) outputs discarded, the aborted requests'
        dropped; rows that finished wait in their slots (`hold`: the next step is in flight) or leave now, with the
        zombies."""
        e = self.engine
        s = e.scheduler
        outputs = commit(record, s, e._stats if pending is not self._unstated else SpecStats())
        finished = finished_slots(record, len(s.running))  # (zombies are inactive: never among them)
        if finished:
            finish(finished, pending.counters[finished].tolist(), record, outputs, s, e.max_draft_tokens)
            s.forget([s.running[i].request_id for i in finished])
        self._record(pending, record)
        gone = set(self.zombies)
        kept = [out for i, out in enumerate(outputs) if i not in gone and out.request_id not in aborted]
        if hold:
            self.zombies = self.zombies + finished
        else:
            for slot in sorted(gone.union(finished), reverse=True):
                admission.release(s, e.runner, slot)
            self.zombies = []
        return kept

    def _record(self, pending: InFlight, record: StepRecord) -> None:
        """The policy's and the prefill budget's measurements of the step (`Engine._step`'s), its time the span since
        the later of its launch and the last read (the device's step period while steps run ahead)."""
        e, step = self.engine, pending.step
        s = e.scheduler
        now = time.perf_counter()
        seconds, self._read_at = now - max(pending.launched, self._read_at), now
        if not pending.first_run:
            e.policy.record_step(step.batch, step.gamma, seconds, record.num_produced / step.num_rows,
                                 length=pending.longest, rows=step.num_rows,
                                 catch_up_of=s.plain_run if pending.caught_up else 0,
                                 catch_up_share=s.catch_up_share, catch_up_prompts=s.catch_up_prompts,
                                 accepted=record.num_accepted, drafted=record.num_drafted)
            e.chunked.decoded(seconds)
        s.plain_run = s.plain_run + 1 if step.gamma == 0 else 0
