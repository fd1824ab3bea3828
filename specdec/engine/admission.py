"""Admission: requests enter and leave the engine's slots (mixed into `Engine`).

`_admit` moves waiting requests into free slots and prefills them together (target, then the drafter if it
keeps a cache, timed for the γ policy) — while others run, once `admit_min` slots are free or one has waited
`admit_max_wait` steps; `_handle_aborts` drops cancelled ones; `_release` frees a slot by moving the last running
request into it (running requests stay in slots 0..n-1); `_catch_up_drafter` feeds a cached drafter the text that
plain (γ = 0) steps committed without it, and the prompts admitted during them (not fed at admission). The
engine's state these read and write is set up in `Engine.__init__`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specdec.engine.drafters import Flavor
from specdec.engine.kv_pool import blocks_for
from specdec.engine.request_checks import pool_margin
from specdec.engine.slots import prefill_rows
from specdec.metrics import SpecStats
from specdec.processing import start_constraints
from specdec.request import SamplingParams
from specdec.step import RequestOutput

__all__ = ["EngineRequest", "Admission"]


@dataclass
class EngineRequest:
    """A request as the engine tracks it, from `add_request` until it finishes."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    seed: int
    arrival: float
    length: int = 0  # committed tokens (prompt + generated), as the host knows them
    draft_valid: int = 0  # positions below this are in the drafter's cache
    stats: SpecStats = field(default_factory=SpecStats)
    flavor: Flavor | None = None  # what this request asks of a step (`Flavor.of(params)`)
    admitted_at: tuple = (0, 0, 0)  # the engine's (steps, speculative steps, drafter passes) when it joined
    constraint: object | None = None  # its `core.processors.TokenConstraint`, started at admission
    slot: int = -1  # while filling (`engine.prefill`): its slot; running requests' slot is their index
    prefilled: int = 0  # while filling: prompt positions in the target's cache
    fed_by: int = 0  # while filling, with `prefill_steps`: the engine step by which its prompt is fed in full
    generated_before: int = 0  # tokens it generated before a preemption (paged pool): now the tail of `prompt`
    num_cached_tokens: int = 0  # prompt positions found in the prefix cache at admission (not prefilled)
    prefix: object | None = None  # its `prefix_cache.RequestBlocks` (enable_prefix_caching)


class Admission:
    """`Engine`'s admission and slot bookkeeping (see the module doc)."""

    def _handle_aborts(self) -> list[RequestOutput]:
        if not self._aborted:  # read without the lock: an abort that races this is seen at the next step
            return []
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if aborted:
                self._waiting = deque(r for r in self._waiting if r.request_id not in aborted)
        outputs = [RequestOutput(rid, [], None, 0, 0, True, "abort") for rid in sorted(aborted)]
        for request in [r for r in self._filling if r.request_id in aborted]:  # (filling: nothing to move)
            self._filling.remove(request)
            self.state.clear(request.slot)
            self._release_blocks(request.slot)
        for slot in sorted((i for i, r in enumerate(self._running) if r.request_id in aborted), reverse=True):
            self._release(slot)
        with self._lock:
            self._known -= aborted
        return outputs

    def _admit(self, outputs: list[RequestOutput]) -> None:
        """Move waiting requests into free slots; those admitted together prefill together (with a prefill budget,
        while requests run: they start filling, `engine.prefill`). While requests run, admission waits for
        `admit_min` free slots or for a slot free `admit_max_wait` steps (EngineConfig)."""
        first = len(self._running)
        limit = self._chain_limit()  # max_batch, less the slots beam groups hold (engine/beam.py)
        occupied = first + len(self._filling)
        free = limit - occupied
        if occupied and self._waiting and free < self.admit_min:
            if free <= 0:
                self._free_since = None
                return
            if self._free_since is None:
                self._free_since = self._num_steps
            if self._num_steps - self._free_since < self.config.admit_max_wait:
                return
        self._free_since = None
        admitted: list[EngineRequest] = []
        while occupied + len(admitted) < limit:
            with self._lock:
                if not self._waiting:
                    break
                tree = self._waiting[0].params.draft_tree
                holder = (self._running or self._filling or admitted or [None])[0]
                if holder is not None and tree != holder.params.draft_tree:
                    break  # a step runs one tree shape (or chains): it waits, in order, until the running ones finish
                if self.kv_pool is not None and self._pool_short(admitted + [self._waiting[0]]):
                    break  # the pool cannot hold its prompt yet: it waits, in order, for blocks to free
                if self.prefix_cache is not None and self.prefix_cache.pending(self._waiting[0], admitted):
                    break  # one admitted now prefills its prompt's first block: it waits a step, and hits
                request = self._waiting.popleft()
            if request.params.max_new_tokens == 0:
                request.stats.set_wall_time(time.perf_counter() - request.arrival)
                outputs.append(RequestOutput(request.request_id, [], None, 0, 0, True, "length", request.stats))
                with self._lock:
                    self._known.discard(request.request_id)
                continue
            if request.params.constraint is not None and request.constraint is None:  # (kept over a preemption)
                request.constraint = start_constraints(request.params, 1, self.vocab_size)[0]
            admitted.append(request)
        if not admitted:
            return
        self.num_admissions += 1
        if self.prefill_budget and occupied:  # others run (or fill): chunks of a budget per step, not now
            self._place(admitted)
            return
        for request in admitted:
            self._running.append(request)
            self._joined(request)
        self.state.admit_rows(first, [r.prompt for r in admitted], [r.params for r in admitted],
                              [r.seed for r in admitted])
        for slot, request in enumerate(admitted, first):
            self._resume(slot, request)
        start = time.perf_counter()
        rows = slice(first, len(self._running))
        lengths = [len(r.prompt) for r in admitted]
        # extent=0: the admitted slots hold nothing that must survive, so each chunk attends over a positions
        # bucket just past what it feeds, not the whole cache. With EngineConfig.prefill_graphs, a request admitted
        # alone into slot 0 (the batch-1 case, where eager prefill is launch-bound: ~7 ms vs ~2 ms replayed on an
        # H200) replays its chunk shapes as CUDA graphs once seen; other admissions vary in their rows, which would
        # multiply the shapes (and the mid-traffic captures), and are GPU-bound enough at 8+ rows to run eagerly.
        graphs = self.prefill_graphs if first == 0 and len(admitted) == 1 else None
        # in a run of plain steps a cached drafter is not fed at admission: the next speculative step's catch-up
        # feeds every lagging row in one prefill, and a request that finishes before speculation resumes never
        # costs the drafter anything (admissions every step or two at 64 slots made the drafter's eager prefill a
        # cost of plain steps too)
        fed = self.prefill_tokens
        valid = self._prefill(rows, lengths, graphs, drafter=not self._plain_run, timed=True,
                              starts=[r.num_cached_tokens for r in admitted])  # (past a prefix cache's hits)
        for request, v in zip(admitted, valid):
            request.draft_valid = v
        if self.device.type == "cuda":  # prefill runs ahead of the host: finish it here, or its device time
            torch.cuda.synchronize(self.device)  # lands in the next step's (the policy's) and prefill_time_s
        seconds = time.perf_counter() - start
        for request, n in zip(admitted, lengths):
            request.stats.add_prefill(seconds, 1 if n > 1 else 0)
        self._measure_prefill(self.prefill_tokens - fed, seconds)  # ("auto" budget: the prefill rate, from the start)

    def _prefill(self, rows: slice, lengths: list[int], graphs, drafter: bool = True, timed: bool = False,
                 starts: list[int] | None = None) -> list[int]:
        """Prefill freshly admitted `rows` with prompts of `lengths`: the target all but each prompt's last token,
        the drafter (if it keeps a cache, and `drafter`) all but its last two → the drafter's valid positions per
        row (`starts` where it was not fed: the catch-up feeds it). timed: the drafter's prefill is timed for the
        policy (`record_admission`). starts: positions already held (a prefix cache's hits; None = 0)."""
        chunk, zeros = self.config.prefill_chunk, starts or [0] * len(lengths)
        cuda = timed and self.device.type == "cuda"
        start = time.perf_counter()
        prefill_rows(self.model, self.cache, self.state, rows, zeros, [n - 1 for n in lengths], chunk,
                     features=self.state.features, extent=0, graphs=graphs)
        self.prefill_tokens += sum(max(n - 1 - s, 0) for n, s in zip(lengths, zeros))
        if not self.drafter_cached:
            return [max(n - 2, 0) for n in lengths]
        if cuda:  # (the target's prefill alone is timed: a bound on what the drafter's feed costs, for the policy)
            torch.cuda.synchronize(self.device)
        target = time.perf_counter() - start if timed else None
        if not drafter:
            if timed:  # (not fed: the next catch-up feeds these prompts, and reports that share of its time)
                self.policy.record_admission(sum(lengths), None, len(lengths), target_seconds=target)
            if self._drafter_synced:  # (the rows already running hold all but their last 2 tokens: say so per row)
                for r in self._running[: rows.start]:
                    r.draft_valid = max(r.draft_valid, r.length - 2)
                self._drafter_synced = False
            return zeros
        valid = [max(n - 2, 0) for n in lengths]
        start = time.perf_counter()  # (the target's prefill done: the drafter's alone is timed, for the policy)
        self.drafter.prefill(self.state, rows, zeros, valid, chunk, extent=0, graphs=graphs)
        self.prefill_tokens += sum(max(v - s, 0) for v, s in zip(valid, zeros))
        if cuda:
            torch.cuda.synchronize(self.device)
        if timed:
            self.policy.record_admission(sum(lengths), time.perf_counter() - start, len(lengths), target_seconds=target)
        return valid

    def _joined(self, request: EngineRequest) -> None:
        """A request took a slot (its steps, passes and counters start counting from here)."""
        request.admitted_at = (self._num_steps, self._spec_steps, self._passes)
        self._flavor = None

    def _catch_up_drafter(self, gamma: int) -> bool:
        """Rows that ran plain steps fell behind in the drafter's cache; feed what it has not seen.

        After a speculative step every row's drafter cache holds all but its last 2 committed tokens (the window
        re-fed committed text and the accepted drafts were fed); `_drafter_synced` says so for all rows at once,
        and the rows' `draft_valid` is written only when a plain step follows. Not cut by a prefill budget: starved by
        the prompts, a catch-up spread over steps left rows drafting from stale caches (issue 21, one H200: a 410 ms
        spread catch-up, "auto" 0.55x at 64 slots). → whether it fed anything."""
        if not self.drafter_cached:
            return False
        if gamma == 0:
            if self._drafter_synced:
                for r in self._running:
                    r.draft_valid = max(r.draft_valid, r.length - 2)
                self._drafter_synced = False
            return False
        if self._drafter_synced:  # nothing lags: WINDOW >= 2
            return False
        self._drafter_synced = True  # after this step
        from specdec.engine.drafters import WINDOW

        behind = [max(r.length - WINDOW, 0) for r in self._running]
        lagging = [i for i, r in enumerate(self._running) if behind[i] > r.draft_valid]
        if not lagging:
            return False
        # the share of what it feeds that plain steps committed (the rest: prompts admitted in the plain run, which
        # admission would have fed anyway): only that share of the catch-up is a cost of the plain steps
        fed = sum([behind[i] - self._running[i].draft_valid for i in lagging])
        prompts = sum([max(min(behind[i], len(self._running[i].prompt) - 2) - self._running[i].draft_valid, 0)
                       for i in lagging])
        self._catch_up_share = 1.0 - prompts / fed
        self._catch_up_prompts = prompts
        rows = range(lagging[0], lagging[-1] + 1)  # one batched prefill; rows not lagging feed nothing
        starts = [self._running[i].draft_valid if i in lagging else 0 for i in rows]
        ends = [behind[i] if i in lagging else 0 for i in rows]
        extent = max(self._running[i].length for i in rows) + self.max_draft_tokens + 2  # what a row may hold
        # rows of different lengths lag at different offsets: fed ragged where the drafter can (each row from its
        # own start: rows × the longest lag, not rows × the span of all their offsets)
        feed = getattr(self.drafter, "prefill_ragged", None) or self.drafter.prefill
        feed(self.state, slice(rows.start, rows.stop), starts, ends, self.config.prefill_chunk, extent=extent)
        for i in lagging:
            self._running[i].draft_valid = behind[i]
        self.prefill_tokens += fed
        return True

    def _release(self, slot: int) -> None:
        """Free `slot`: the last running request moves into it, so running requests stay in 0..n-1."""
        if self.prefix_cache is not None:  # (its committed blocks stay cached after it leaves)
            self.prefix_cache.commit_row(slot, self._running[slot], self.state.tokens, self._drafter_state)
        self._release_blocks(slot)
        last = len(self._running) - 1
        if slot != last:
            moved = self._running[last]
            positions = min(self.num_positions, 1 << max(moved.length + 1, 1).bit_length())
            self._move_slot(last, slot, positions)
            self._running[slot] = moved
        self._running.pop()
        self._flavor = None
        self.state.clear(last)

    def _move_slot(self, src: int, dst: int, positions: int) -> None:
        """Slot `src` (its first `positions` cache positions, in the target's and a cached drafter's caches, and its
        row state) into slot `dst`; the one place a request changes slots."""
        if self.kv_pool is not None:  # (paged: a table edit, no K/V copied; the caches move their lengths)
            self.kv_pool.move(src, dst)
        self.cache.move(src, dst, positions)
        self.state.move(src, dst)
        if self.drafter_cached:
            self.drafter.cache.move(src, dst, positions)

    def _swap_slots(self, a: int, b: int, positions: int) -> None:
        """Slots `a` and `b` exchange everything `_move_slot` moves."""
        if self.kv_pool is not None:
            self.kv_pool.swap(a, b)
        self.cache.swap(a, b, positions)
        self.state.swap(a, b)
        if self.drafter_cached:
            self.drafter.cache.swap(a, b, positions)

    # ------------------------------------------------------------------------------------- the paged pool
    prefix_cache_queries = property(lambda self: self.prefix_cache.queries if self.prefix_cache else 0)  # (tokens)
    prefix_cache_hits = property(lambda self: self.prefix_cache.hits if self.prefix_cache else 0)
    _drafter_state = property(lambda self: self._drafter_synced if self.drafter_cached else None)  # (prefix_cache)

    def _pool_margin(self, params: SamplingParams) -> int:
        """Positions past a row's committed length that one step may write (`request_checks.pool_margin`)."""
        return pool_margin(params, self.max_draft_tokens)

    def _check_pool(self, prompt_len: int, params: SamplingParams, beams) -> None:
        """What a request asks of the paged pool, refused at `add_request` when it could never be met."""
        if beams is not None:
            return self._check_beam_pool(prompt_len, params, beams)  # (beam.py: the group's blocks)
        need = blocks_for(prompt_len + params.max_new_tokens + self._pool_margin(params), self.kv_pool.block_size)
        usable = self.kv_pool.allocator.num_usable_blocks
        if need > usable:
            raise ValueError(f"prompt length {prompt_len} + max_new_tokens {params.max_new_tokens} needs {need} KV "
                             f"blocks of {self.kv_pool.block_size} positions; the pool holds {usable} "
                             "(raise kv_cache_memory / --kv-cache-memory)")

    def _pool_short(self, requests: list[EngineRequest]) -> bool:
        """Whether the pool lacks the blocks these requests' prompts (+ one step) take at admission."""
        size = self.kv_pool.block_size
        need = sum(blocks_for(len(r.prompt) + self._pool_margin(r.params), size) for r in requests)
        return need > self.kv_pool.allocator.num_free_blocks

    def _release_blocks(self, slot: int) -> None:
        if self.kv_pool is not None:
            self.kv_pool.release(slot)

    def _resume(self, slot: int, request: EngineRequest) -> None:
        """A request admitted into `slot`: its blocks (paged), and for one preempted before, the state its admission
        wrote as if it were new — generated tokens, output counts — set back to what it had generated."""
        if self.kv_pool is not None:
            if self.prefix_cache is not None:  # (a hit: the row starts with the cached blocks, prefilled past them)
                self.prefix_cache.attach(slot, request)
            taken = self.kv_pool.reserve(slot, len(request.prompt) + self._pool_margin(request.params))
            assert taken, "admission checked the free blocks"  # (`_pool_short`)
        done = request.generated_before
        if not done:
            return
        self.state.generated[slot] = done
        history = self.state.history
        if history is not None:  # the prompt's tokens are the repetition penalty's; the output's are counted
            prompt, output = request.prompt[:-done], request.prompt[-done:]
            device = history.counts.device
            history.prompt_seen[slot] = False
            history.prompt_seen[slot, torch.tensor(prompt, device=device)] = True
            history.counts[slot] = torch.bincount(torch.tensor(output, device=device),
                                                  minlength=history.counts.shape[1]).float()

    def _reserve_blocks(self) -> None:
        """Before a step: every running row holds blocks past what the step may write; where the pool has too few,
        the latest-arrived request (running or filling) is preempted (vLLM's recompute preemption) until it does."""
        if self.prefix_cache is not None:  # (the running rows' prompt blocks their models now hold: cached)
            self.prefix_cache.commit_rows(self._running, self._drafter_state)
        while True:
            short = next((i for i, r in enumerate(self._running)
                          if not self.kv_pool.reserve(i, r.length + self._pool_margin(r.params))), None)
            if short is None:
                return
            self._preempt(max(self._running + self._filling, key=lambda r: r.arrival))

    def _preempt(self, request: EngineRequest) -> None:
        """Take a request's blocks back: its committed text becomes its prompt (recomputed on readmission), its
        statistics so far are folded, and it waits first in the queue. Never failed, never truncated."""
        if request in self._filling:
            self._filling.remove(request)
            self.state.clear(request.slot)
            self._release_blocks(request.slot)
        else:
            slot = self._running.index(request)
            committed = self.state.tokens[slot, : request.length].tolist()
            self._fold_stats(request, slot)  # (commit.py: the steps and counters of its time in the slot)
            request.generated_before += request.length - len(request.prompt)
            request.prompt = committed
            self._release(slot)
        request.slot, request.prefilled, request.draft_valid = -1, 0, 0
        self.kv_pool.num_preemptions += 1
        with self._lock:
            self._waiting.appendleft(request)
