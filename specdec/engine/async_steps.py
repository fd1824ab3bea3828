"""Async scheduling (`EngineConfig.async_scheduling`, vLLM's name; SGLang's overlap scheduler): the host launches
decode step N+1 before it reads step N's record, so the device does not idle through the host's bookkeeping.

    engine = Engine(target, drafter, EngineConfig(num_draft_tokens=4, async_scheduling=True))

`Engine.step` with no step in flight runs the synchronous step (aborts, admission, prefill, the decode step and its
commit), then launches the next decode step ahead where it needs no decision of the host (`AsyncSteps.plan`). With a
step N in flight, a call launches step N+1 first — where it too needs nothing of the host — then reads N's record (a
copy into pinned host memory behind a CUDA event; on CPU the step ran already: the same code path, synchronously)
and commits it. Where N+1 cannot run ahead the call commits N alone, and the next call is synchronous.

What N+1 needs of N, and where it is: N's committed tokens, lengths and budgets are in the slot state on the device
(the verify pass wrote them); the host's part — which rows run, their caps, the batch bucket — is what N ran with,
unchanged while nothing joins or leaves; γ is the rows' fixed floor (N's) or, for "auto" rows, the policy's choice
from the last record read (N − 1's: one step late, `engine/async_plan.py`); the length bucket is that of the bound
every length N can leave (each row commits 1..γ_N+1 tokens; fixed caps: it must be N's bucket, so N's shape). Rows
that finished in N are masked on the device before N+1 runs (`mask`: `SlotState.active` cleared from N's table, so
they commit and count nothing), keep their slots until N+1 is read (`zombies`), and then leave: their N+1 rows are
discarded, never emitted.

A step runs ahead where its shape is known without N's record: a chain step (no token tree, beam group, host
constraint or mixed step; γ not a draft-length policy's, which is told each record before its next choice; "auto"
not under tensor parallelism, whose ranks agree on rank 0's choice), nothing filling or admissible (no waiting
request while a slot is free), no abort pending, N's batch, rows and flavor (and, fixed caps, N's γ and shape), no
drafter catch-up (a cached drafter switching between plain and speculative steps: its bookkeeping reads the host's
lengths), zombies inside the step's positions and the live rows' own batch bucket and flavor, and (paged) blocks for
both steps without a preemption. Every other step is the synchronous one; `synchronous_fallbacks` counts them by
reason, `ahead` the steps that ran ahead (`report()`). An abort seen while a step is in flight drops that step's
output of the request (the synchronous engine would not have run it for the request) and the request leaves at the
next call, as it would have.

Each call still returns one decode step's outputs (the step launched ahead is the next call's). With fixed caps every
request's tokens are the synchronous engine's (a request's tokens do not depend on its batch); with "auto" rows its
greedy tokens are (exactness at any γ), its sampled ones follow the target's law but not the synchronous engine's
draws (their γ's differ: one step late). A request added while a step runs ahead joins one step later. Steps
launched ahead carry no draft / verify times (`StepRecord`: 0). `Engine.stats` read while a step is in flight holds
that step's acceptance counters (device sums) but not yet its host counts; assigned while one is in flight, that step
counts on neither side (`stats_reset`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.engine import admission, async_plan
from specdec.engine.commit import commit, finish, finished_slots
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
    zombie slots, the pinned host buffers, the last read step's slot counters, the counts of steps run ahead and
    of synchronous fallbacks by reason: `report()`)."""

    def __init__(self, engine):
        self.engine = engine
        self.pending: InFlight | None = None
        self.zombies: list[int] = []  # slots finished in a committed step while the next ran (masked there)
        self.ahead = 0  # steps launched before the step before them was read
        self.synchronous_fallbacks: dict[str, int] = {}  # why a step did not run ahead → how often
        self.read_counters: torch.Tensor | None = None  # the slot counters the last read step left (host, [rows, w])
        self.chosen: list[int] = []  # the slots of the policy's last choice (live rows, slot order)
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
        self.synchronous_fallbacks[why] = self.synchronous_fallbacks.get(why, 0) + 1
        return None

    def report(self) -> dict:
        """JSON-ready: the steps launched ahead of the step before them, and the synchronous fallbacks by reason."""
        return {"ahead": self.ahead, "synchronous_fallbacks": dict(sorted(self.synchronous_fallbacks.items()))}

    def _ahead(self, pending: InFlight | None) -> InFlight | None:
        plan = self.plan(pending)
        if isinstance(plan, str):
            return self._fallback(plan)
        return self._launch(pending, *plan)

    def plan(self, pending: InFlight | None):
        """The next step, run ahead of `pending`'s read → (its `StepInput`, shape, longest host length, caught up?),
        or why it cannot run ahead (`engine/async_plan.py`)."""
        return async_plan.plan(self, pending)

    def estimates(self, live: list[int]) -> list[tuple]:
        """The policy's per-row totals (`commit.row_estimates`) of the slots `live` as the last read step left them
        (`read_counters`, host: never the step in flight's) and the steps committed so far."""
        s = self.engine.scheduler
        sums = async_plan.counter_totals(self.read_counters[live], self.engine.max_draft_tokens)
        return [(b, r, s.spec_steps - s.running[i].admitted_at[1], d) for i, (b, r, d) in zip(live, sums)]

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
        self.read_counters = pending.counters.clone()  # (the ring's buffer is taken again two launches on)
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
        the later of its launch and the last read (the device's step period while steps run ahead); its rows the ones
        it ran (the zombies masked), its per-row counts those of the rows of the policy's last choice (`chosen`: the
        step's, or the live ones of the step launched after it — a subset)."""
        e, step = self.engine, pending.step
        s = e.scheduler
        now = time.perf_counter()
        seconds, self._read_at = now - max(pending.launched, self._read_at), now
        if not pending.first_run:
            rows = max(step.num_rows - len(self.zombies), 1)
            accepted, drafted = ([counts[i] for i in self.chosen] for counts in (record.num_accepted, record.num_drafted))
            e.policy.record_step(step.batch, step.gamma, seconds, record.num_produced / rows,
                                 length=pending.longest, rows=rows,
                                 catch_up_of=s.plain_run if pending.caught_up else 0,
                                 catch_up_share=s.catch_up_share, catch_up_prompts=s.catch_up_prompts,
                                 accepted=accepted, drafted=drafted)
            e.chunked.decoded(seconds)
        s.plain_run = s.plain_run + 1 if step.gamma == 0 else 0
