"""The engine's scheduler: who runs, in which slot, with which draft cap — it never touches a model's tensors.

It owns the requests from `add_request` to their finish: the queues (waiting → filling, with a prefill budget →
running; aborted), the slots (running requests hold slots 0..n−1: a leaving request's slot gets the last running
one), the paged pool's block tables (`KVPool`: reserve at admission and before each step, release, move — table
edits) and its prefix cache, admission (in groups while requests run: `admit_min` / `admit_max_wait`), recompute
preemption (the latest-arrived request gives its blocks back and waits first), the rows' draft caps and the
bookkeeping of lengths (each request's committed length and its drafter's valid positions: rollback is a length
move). What it decides, the runner (`engine/runner.py`) does to the tensors; the engine (`engine/engine.py`)
hands each decision over — a slot move, rows to prefill, a `StepInput`. vLLM's `Scheduler` has the same role.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass

from specdec.engine.config import BATCH_BUCKETS
from specdec.engine.drafters import Flavor
from specdec.engine.kv_pool import blocks_for
from specdec.engine.request_checks import pool_margin
from specdec.engine.slots import positions_bucket as prefill_span  # (a prefill's span: what a move copies)
from specdec.engine.engine_request import EngineRequest
from specdec.processing import start_constraints
from specdec.request import SamplingParams
from specdec.step import RequestOutput

__all__ = ["CatchUp", "Scheduler"]


@dataclass(frozen=True)
class CatchUp:
    """A cached drafter's catch-up: rows `rows` fed positions [starts[i], ends[i]) (a row not lagging: 0, 0),
    attending over at most `extent` positions; `tokens` fed in all."""

    rows: slice
    starts: list[int]
    ends: list[int]
    extent: int
    tokens: int


class Scheduler:
    """See the module doc. `add` and `abort` are thread-safe (`lock`); the rest runs on the engine's step thread."""

    def __init__(self, max_batch: int, num_positions: int, *, admit_min: int, admit_max_wait: int,
                 max_draft_tokens: int, drafter_cached: bool, has_drafter: bool, kv_pool=None, prefix_cache=None):
        self.max_batch, self.num_positions = max_batch, num_positions
        self.admit_min, self.admit_max_wait = admit_min, admit_max_wait
        self.max_draft_tokens, self.drafter_cached, self.has_drafter = max_draft_tokens, drafter_cached, has_drafter
        self.kv_pool, self.prefix_cache = kv_pool, prefix_cache
        self.running: list[EngineRequest] = []  # index = slot
        self.waiting: deque[EngineRequest] = deque()
        self.filling: list[EngineRequest] = []  # admitted, prompt not fed yet, oldest first (`engine.prefill`)
        self.aborted: set[str] = set()
        self.known: set[str] = set()
        self.lock = threading.Lock()
        self._ids = itertools.count()
        self.free_since = None  # the step since which a slot has been free while requests waited (`admission_waits`)
        self.num_admissions = 0  # admissions (each one prefill of the requests admitted together)
        self.num_steps = self.spec_steps = self.passes = 0  # steps run (requests diff these at the end)
        self.last_used: dict[int, int] = {}  # γ → index of the last step that ran it
        self.flavor: Flavor | None = None  # of the running set; None = recompute (requests joined or left)
        self.caps: list[int | None] = []  # each running row's draft cap (an int, or None: "auto"), slot order
        self.device_caps: tuple[int, ...] = ()  # the same as the verify pass reads them ("auto": max_draft_tokens)
        self.caps_default = None  # the default γ they were resolved with (`policy.set_fixed` moves it)
        self.drafter_synced = True  # every row's drafter cache holds all but its last 2 tokens (see `plan_catch_up`)
        self.plain_run = 0  # plain steps since the last speculative one (what a catch-up makes up for)
        self.catch_up_share = 1.0  # of the last catch-up's tokens, the share plain steps committed (not prompts)
        self.catch_up_prompts = 0  # and the prompt tokens it fed (admitted in the plain run)

    # ------------------------------------------------------------------------------------ requests in and out
    def add(self, request_id: str | None, build, enqueue=None) -> str:
        """Register a request id (a fresh one for None) and queue `build(request_id)` (`enqueue`: another queue's
        append, called under the lock: beam groups') → the id."""
        with self.lock:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
            elif not isinstance(request_id, str) or not request_id:
                raise TypeError(f"request_id must be a non-empty string, got {request_id!r}")
            if request_id in self.known:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self.known.add(request_id)
            request = build(request_id)
            (self.waiting.append if enqueue is None else enqueue)(request)
        return request_id

    def abort(self, request_id: str) -> None:
        with self.lock:
            if request_id in self.known:
                self.aborted.add(request_id)

    def take_aborts(self) -> set[str]:
        """The ids cancelled since the last call, gone from the waiting queue (read without the lock first: an abort
        that races this is seen at the next step)."""
        if not self.aborted:
            return set()
        with self.lock:
            aborted, self.aborted = self.aborted, set()
            if aborted:
                self.waiting = deque(r for r in self.waiting if r.request_id not in aborted)
        return aborted

    def forget(self, request_ids) -> None:
        """These requests left (finished, aborted): their ids may be used again."""
        with self.lock:
            self.known.difference_update(request_ids)

    # ------------------------------------------------------------------------------------------ admission
    def admission_waits(self, limit: int) -> bool:
        """While requests run, admission waits for `admit_min` free slots (of `limit`) or for a slot free
        `admit_max_wait` steps."""
        occupied = len(self.running) + len(self.filling)
        free = limit - occupied
        if occupied and self.waiting and free < self.admit_min:
            if free <= 0:
                self.free_since = None
                return True
            if self.free_since is None:
                self.free_since = self.num_steps
            if self.num_steps - self.free_since < self.admit_max_wait:
                return True
        self.free_since = None
        return False

    def select(self, limit: int, outputs: list[RequestOutput], vocab_size: int) -> list[EngineRequest]:
        """The waiting requests admitted now, in order, while slots below `limit` are free (a request asking for no
        tokens finishes here, into `outputs`); their constraints started."""
        occupied = len(self.running) + len(self.filling)
        admitted: list[EngineRequest] = []
        while occupied + len(admitted) < limit:
            with self.lock:
                if not self.waiting:
                    break
                tree = self.waiting[0].params.draft_tree
                holder = (self.running or self.filling or admitted or [None])[0]
                if holder is not None and tree != holder.params.draft_tree:
                    break  # a step runs one tree shape (or chains): it waits, in order, until the running ones finish
                if self.kv_pool is not None and self.pool_short(admitted + [self.waiting[0]]):
                    break  # the pool cannot hold its prompt yet: it waits, in order, for blocks to free
                if self.prefix_cache is not None and self.prefix_cache.pending(self.waiting[0], admitted):
                    break  # one admitted now prefills its prompt's first block: it waits a step, and hits
                request = self.waiting.popleft()
            if request.params.max_new_tokens == 0:
                request.stats.set_wall_time(time.perf_counter() - request.arrival)
                outputs.append(RequestOutput(request.request_id, [], None, 0, 0, True, "length", request.stats))
                self.forget([request.request_id])
                continue
            if request.params.constraint is not None and request.constraint is None:  # (kept over a preemption)
                request.constraint = start_constraints(request.params, 1, vocab_size)[0]
            admitted.append(request)
        if admitted:
            self.num_admissions += 1
        return admitted

    def join(self, request: EngineRequest) -> None:
        """A request took a running slot (its steps, passes and counters start counting from here)."""
        request.admitted_at = (self.num_steps, self.spec_steps, self.passes)
        self.flavor = None

    def start(self, requests: list[EngineRequest]) -> int:
        """Admitted requests join the running rows (slots n, n + 1, ...) → the first of their slots."""
        first = len(self.running)
        for request in requests:
            self.running.append(request)
            self.join(request)
        return first

    def release(self, slot: int) -> tuple[int, int] | None:
        """The running request in `slot` leaves (its blocks freed); the last running request moves into it, so
        running requests stay in 0..n−1 (its blocks: a table edit) → the move the runner makes, (from slot, the
        positions to copy), or None."""
        self.release_blocks(slot)
        last, move = len(self.running) - 1, None
        if slot != last:
            moved = self.running[last]
            move = (last, min(self.num_positions, 1 << max(moved.length + 1, 1).bit_length()))
            if self.kv_pool is not None:
                self.kv_pool.move(last, slot)
            self.running[slot] = moved
        self.running.pop()
        self.flavor = None
        return move

    def promote(self, request: EngineRequest) -> tuple[str, int, int, int] | None:
        """A filling request whose prompt is fed joins the running rows in slot n (a younger filling request there
        takes its slot: the two exchange) → what the runner moves, ("move" | "swap", its slot, n, positions), or
        None when it already fills slot n."""
        self.filling.remove(request)
        slot, n, move = request.slot, len(self.running), None
        if slot != n:
            other = next((r for r in self.filling if r.slot == n), None)
            positions = prefill_span(len(request.prompt) + 1, self.num_positions)
            if other is None:
                if self.kv_pool is not None:
                    self.kv_pool.move(slot, n)
                move = ("move", slot, n, positions)
            else:
                positions = max(positions, prefill_span(len(other.prompt) + 1, self.num_positions))
                if self.kv_pool is not None:
                    self.kv_pool.swap(slot, n)
                other.slot = slot
                move = ("swap", slot, n, positions)
        request.slot = n
        self.running.append(request)
        self.join(request)
        return move

    # ------------------------------------------------------------------------------------------- the pool
    def pool_margin(self, params: SamplingParams) -> int:
        """Positions past a row's committed length that one step may write (`request_checks.pool_margin`)."""
        return pool_margin(params, self.max_draft_tokens)

    def check_pool(self, prompt_len: int, params: SamplingParams) -> None:
        """What a chain request asks of the paged pool, refused at `add_request` when it could never be met (a beam
        group's: `beam.Beams._check_beam_pool`)."""
        need = blocks_for(prompt_len + params.max_new_tokens + self.pool_margin(params), self.kv_pool.block_size)
        usable = self.kv_pool.allocator.num_usable_blocks
        if need > usable:
            raise ValueError(f"prompt length {prompt_len} + max_new_tokens {params.max_new_tokens} needs {need} KV "
                             f"blocks of {self.kv_pool.block_size} positions; the pool holds {usable} "
                             "(raise kv_cache_memory / --kv-cache-memory)")

    def pool_short(self, requests: list[EngineRequest]) -> bool:
        """Whether the pool lacks the blocks these requests' prompts (+ one step) take at admission."""
        size = self.kv_pool.block_size
        need = sum(blocks_for(len(r.prompt) + self.pool_margin(r.params), size) for r in requests)
        return need > self.kv_pool.allocator.num_free_blocks

    def release_blocks(self, slot: int) -> None:
        if self.kv_pool is not None:
            self.kv_pool.release(slot)

    def reserve_admitted(self, slot: int, request: EngineRequest) -> None:
        """A request admitted into `slot` takes its blocks (a prefix cache's hits first)."""
        if self.kv_pool is None:
            return
        if self.prefix_cache is not None:  # (a hit: the row starts with the cached blocks, prefilled past them)
            self.prefix_cache.attach(slot, request)
        taken = self.kv_pool.reserve(slot, len(request.prompt) + self.pool_margin(request.params))
        assert taken, "admission checked the free blocks"  # (`pool_short`)

    def short_row(self) -> int | None:
        """Before a step: every running row takes blocks past what the step may write → the first row the pool
        cannot serve, or None."""
        return next((i for i, r in enumerate(self.running)
                     if not self.kv_pool.reserve(i, r.length + self.pool_margin(r.params))), None)

    def preemption_victim(self) -> EngineRequest:
        """Who gives its blocks back when the pool is short: the latest-arrived request, running or filling."""
        return max(self.running + self.filling, key=lambda r: r.arrival)

    def requeue(self, request: EngineRequest) -> None:
        """A preempted request (its blocks released) waits first in the queue, to be recomputed on readmission."""
        request.slot, request.prefilled, request.draft_valid = -1, 0, 0
        self.kv_pool.num_preemptions += 1
        with self.lock:
            self.waiting.appendleft(request)

    @property
    def drafter_state(self) -> bool | None:
        """What a prefix cache reads of the drafter's valid positions (None: no cached drafter)."""
        return self.drafter_synced if self.drafter_cached else None

    # ------------------------------------------------------------------------------------- the step's rows
    def row_cap(self, params: SamplingParams, default: int) -> int | None:
        """A request's draft cap: its `num_draft_tokens` (None: `default`, the policy's fixed γ), None = "auto"."""
        cap = params.num_draft_tokens
        cap = default if cap is None else None if cap == "auto" else cap
        return cap if self.has_drafter else 0

    def step_rows(self, default: int) -> tuple[int, int, Flavor]:
        """The running rows' (batch bucket, longest row, flavor) for the next step; their caps recomputed when the
        rows or the default γ changed (`caps`, `device_caps`)."""
        running = self.running
        batch = next(b for b in BATCH_BUCKETS if b >= len(running))
        longest = max([r.length for r in running])
        if self.filling:  # filling rows inside the batch bucket are its padding: their prompts must fit the step
            longest = max([longest] + [r.length for r in self.filling if r.slot < batch])
        flavor = self.flavor
        if flavor is None:  # the running set changed
            flavor = self.flavor = Flavor.union(r.flavor for r in running)
            self.set_caps(default)
        elif self.caps_default != default:  # (a new default γ: the rows that take it)
            self.set_caps(default)
        return batch, longest, flavor

    def set_caps(self, default: int) -> None:
        self.caps, self.caps_default = [self.row_cap(r.params, default) for r in self.running], default
        values = [self.max_draft_tokens if c is None else c for c in self.caps]
        self.device_caps = tuple(values + [0] * (self.max_batch - len(values)))

    def count_step(self, gamma: int, drafter_calls: int) -> None:
        """A step ran (γ, its drafter's forward passes)."""
        self.last_used[gamma] = self.num_steps
        self.num_steps += 1
        self.passes += drafter_calls
        self.spec_steps += 1 if gamma else 0

    def gamma_since(self, step: int) -> int:
        """The largest γ a step ran since step `step` (0: none)."""
        return max([g for g, last in self.last_used.items() if last >= step], default=0)

    # ---------------------------------------------------------------------------------- the drafter's lengths
    def drafter_behind(self, rows: int | None = None) -> None:
        """A plain step (or a prefill that skipped the drafter) leaves the drafter behind: the first `rows`
        running rows (all: None) record what it holds, all but their last 2 tokens."""
        if self.drafter_synced:
            for r in self.running[:rows]:
                r.draft_valid = max(r.draft_valid, r.length - 2)
            self.drafter_synced = False

    def plan_catch_up(self, gamma: int, window: int) -> CatchUp | None:
        """Before a speculative step: what a cached drafter must be fed of the text plain steps committed without
        it (and the prompts admitted in them, not fed at admission) — None when nothing lags. Not cut by a prefill
        budget: starved by the prompts, a catch-up spread over steps left rows drafting from stale caches."""
        if not self.drafter_cached:
            return None
        if gamma == 0:
            self.drafter_behind()
            return None
        if self.drafter_synced:  # nothing lags: WINDOW >= 2
            return None
        self.drafter_synced = True  # after this step
        running = self.running
        behind = [max(r.length - window, 0) for r in running]
        lagging = [i for i, r in enumerate(running) if behind[i] > r.draft_valid]
        if not lagging:
            return None
        # the share of what it feeds that plain steps committed (the rest: prompts admitted in the plain run, which
        # admission would have fed anyway): only that share of the catch-up is a cost of the plain steps
        fed = sum([behind[i] - running[i].draft_valid for i in lagging])
        prompts = sum([max(min(behind[i], len(running[i].prompt) - 2) - running[i].draft_valid, 0) for i in lagging])
        self.catch_up_share = 1.0 - prompts / fed
        self.catch_up_prompts = prompts
        rows = range(lagging[0], lagging[-1] + 1)  # one batched prefill; rows not lagging feed nothing
        starts = [running[i].draft_valid if i in lagging else 0 for i in rows]
        ends = [behind[i] if i in lagging else 0 for i in rows]
        extent = max(running[i].length for i in rows) + self.max_draft_tokens + 2  # what a row may hold
        for i in lagging:
            running[i].draft_valid = behind[i]
        return CatchUp(slice(rows.start, rows.stop), starts, ends, extent, fed)
