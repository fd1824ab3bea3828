"""Admission: requests enter and leave the engine's slots — the scheduler's decisions handed to the runner.

Each function takes the `Scheduler` (who, where: queues, slots, blocks) and the `Runner` (the tensors) it joins:
`admit` moves waiting requests into free slots and prefills them together (target, then the drafter if it keeps a
cache, timed for the γ policy) — while others run, once `admit_min` slots are free or one has waited `admit_max_wait`
steps; with the mixed step on (a prefill budget), while others run, `place` starts chain requests filling instead,
their chunks riding in the steps' forwards (`engine/prefill.py`; token-tree requests prefill whole: a tree step has
no mixed form); `handle_aborts` drops cancelled ones; `release` frees a slot (the last running request moves into it,
so running requests stay in slots 0..n−1); `catch_up_drafter` feeds a cached drafter the text that plain (γ = 0)
steps committed without it, and the prompts admitted during them (not fed at admission); `reserve_blocks` and
`preempt` keep the paged pool ahead of each step."""

from __future__ import annotations

import time

import torch

from specdec.engine.commit import fold_stats
from specdec.engine.engine_request import EngineRequest
from specdec.step import RequestOutput

__all__ = ["EngineRequest", "admit", "catch_up_drafter", "handle_aborts", "place", "prefill", "preempt", "release",
           "reserve_blocks", "resume"]


def handle_aborts(scheduler, runner) -> list[RequestOutput]:
    """Cancelled requests leave the queue, their filling or running slots → an "abort" output each."""
    aborted = scheduler.take_aborts()
    if not aborted:
        return []
    outputs = [RequestOutput(rid, [], None, 0, 0, True, "abort") for rid in sorted(aborted)]
    for request in [r for r in scheduler.filling if r.request_id in aborted]:  # (filling: nothing to move)
        scheduler.filling.remove(request)
        runner.clear_row(request.slot)
        scheduler.release_blocks(request.slot)
    for slot in sorted((i for i, r in enumerate(scheduler.running) if r.request_id in aborted), reverse=True):
        release(scheduler, runner, slot)
    scheduler.forget(aborted)
    return outputs


def admit(scheduler, runner, policy, chunked, outputs: list[RequestOutput], limit: int, again: bool = False) -> None:
    """Move waiting requests into free slots below `limit` (the slots beam groups leave to chains); those admitted
    together prefill together (with the mixed step's budget, while requests run, chains start filling: `place`).
    again: a second round in the same step, for copies of a prompt just prefilled (`PrefixCache.take_held`)."""
    if not again and scheduler.admission_waits(limit):
        return
    occupied = len(scheduler.running) + len(scheduler.filling)
    admitted = scheduler.select(limit, outputs, runner.vocab_size)
    if not admitted:
        return
    if chunked.budget and occupied and not again and admitted[0].params.draft_tree is None:  # others run (or fill):
        # chunks of a budget per step in the mixed steps, not now (they share one tree shape or none:
        # `Scheduler.select`); a second round's copies hit the blocks just prefilled: the rest whole, now, beside them
        place(scheduler, runner, chunked, admitted, limit)
        return
    first = scheduler.start(admitted)
    runner.admit_rows(first, admitted)
    for slot, request in enumerate(admitted, first):
        resume(scheduler, runner, slot, request)
    start = time.perf_counter()
    rows = slice(first, len(scheduler.running))
    lengths = [len(r.prompt) for r in admitted]
    # extent=0: the admitted slots hold nothing that must survive, so each chunk attends over a positions
    # bucket just past what it feeds, not the whole cache. With EngineConfig.prefill_graphs, a request admitted
    # alone into slot 0 (the batch-1 case, where eager prefill is launch-bound: ~7 ms vs ~2 ms replayed on an
    # H200) replays its chunk shapes as CUDA graphs once seen; other admissions vary in their rows, which would
    # multiply the shapes (and the mid-traffic captures), and are GPU-bound enough at 8+ rows to run eagerly.
    graphs = runner.prefill_graphs if first == 0 and len(admitted) == 1 else None
    # in a run of plain steps a cached drafter is not fed at admission: the next speculative step's catch-up
    # feeds every lagging row in one prefill, and a request that finishes before speculation resumes never
    # costs the drafter anything (admissions every step or two at 64 slots made the drafter's eager prefill a
    # cost of plain steps too)
    fed = runner.prefill_tokens
    valid = prefill(scheduler, runner, policy, rows, lengths, graphs, drafter=not scheduler.plain_run, timed=True,
                    starts=[r.num_cached_tokens for r in admitted])  # (past a prefix cache's hits)
    for request, v in zip(admitted, valid):
        request.draft_valid = v
    if runner.device.type == "cuda":  # prefill runs ahead of the host: finish it here, or its device time
        torch.cuda.synchronize(runner.device)  # lands in the next step's (the policy's) and prefill_time_s
    seconds = time.perf_counter() - start
    for request, n in zip(admitted, lengths):
        request.stats.add_prefill(seconds, 1 if n > 1 else 0)
    chunked.measure_prefill(runner.prefill_tokens - fed, seconds)  # ("auto" budget: the prefill rate, from the start)
    cache = scheduler.prefix_cache  # (`n > 1`: copies held back for these prompts' blocks hit them now, this step)
    if cache is not None and not again and cache.take_held(scheduler.running, scheduler.drafter_state):
        admit(scheduler, runner, policy, chunked, outputs, limit, again=True)


def prefill(scheduler, runner, policy, rows: slice, lengths: list[int], graphs, drafter: bool = True,
            timed: bool = False, starts: list[int] | None = None) -> list[int]:
    """Prefill freshly admitted `rows` with prompts of `lengths`: the target all but each prompt's last token,
    the drafter (if it keeps a cache, and `drafter`) all but its last two → the drafter's valid positions per
    row (`starts` where it was not fed: the catch-up feeds it). timed: the drafter's prefill is timed for the
    policy (`record_admission`). starts: positions already held (a prefix cache's hits; None = 0)."""
    zeros = starts or [0] * len(lengths)
    target = runner.prefill_target(rows, zeros, [n - 1 for n in lengths], graphs, timed)
    if not runner.drafter_cached:
        return [max(n - 2, 0) for n in lengths]
    if not drafter:
        if timed:  # (not fed: the next catch-up feeds these prompts, and reports that share of its time)
            policy.record_admission(sum(lengths), None, len(lengths), target_seconds=target)
        scheduler.drafter_behind(rows.start)  # (the rows already running hold all but their last 2 tokens)
        return zeros
    valid = [max(n - 2, 0) for n in lengths]
    seconds = runner.prefill_drafter(rows, zeros, valid, graphs, timed)  # (the target's done: the drafter's alone)
    if timed:
        policy.record_admission(sum(lengths), seconds, len(lengths), target_seconds=target)
    return valid


def place(scheduler, runner, chunked, admitted: list[EngineRequest], limit: int) -> None:
    """Admitted requests take free slots past the running ones, highest first (below `limit`), and start filling:
    a filling row inside the decode step's batch bucket is padding whose prompt the step's positions span must cover
    (a 2,000-token prompt filling beside short rows would double the span, so every decode step's attention, while
    it fills); from the top they stay outside the bucket while a slot there is free. Ready, a request moves down
    into slot n (`prefill.promote_ready`: one copy of its cache)."""
    taken = {r.slot for r in scheduler.filling}  # (below the slots beam groups hold: `beam._chain_limit`)
    free = (s for s in range(limit - 1, len(scheduler.running) - 1, -1) if s not in taken)
    for request in admitted:
        request.slot = next(free)
        runner.admit_rows(request.slot, [request])
        runner.state.active[request.slot] = False  # not a row of the decode steps until it is ready
        resume(scheduler, runner, request.slot, request)  # (its blocks, paged; a preempted request's generated count)
        request.prefilled = request.draft_valid = request.num_cached_tokens  # (0, or a prefix cache's hit)
        request.fed_by = scheduler.num_steps + (chunked.steps or 0)  # (this step counts: `ChunkBudget.step_budget`)
        scheduler.filling.append(request)


def resume(scheduler, runner, slot: int, request: EngineRequest) -> None:
    """A request admitted into `slot`: its blocks (paged), and for one preempted before, the state its admission
    wrote as if it were new — generated tokens, output counts — set back to what it had generated."""
    scheduler.reserve_admitted(slot, request)
    if request.generated_before:
        runner.resume_row(slot, request.prompt, request.generated_before)


def release(scheduler, runner, slot: int) -> None:
    """Free `slot`: the last running request moves into it, so running requests stay in 0..n−1."""
    if scheduler.prefix_cache is not None:  # (its committed blocks stay cached after it leaves)
        scheduler.prefix_cache.commit_row(slot, scheduler.running[slot], runner.state.tokens, scheduler.drafter_state)
    last = len(scheduler.running) - 1
    move = scheduler.release(slot)
    if move is not None:
        runner.move_slot(move[0], slot, move[1])
    runner.clear_row(last)


def catch_up_drafter(scheduler, runner, gamma: int, window: int) -> bool:
    """Rows that ran plain steps fell behind in the drafter's cache; feed what it has not seen (one batched prefill,
    `Scheduler.plan_catch_up`) → whether it fed anything. After a speculative step every row's drafter cache holds
    all but its last 2 committed tokens (the window re-fed committed text and the accepted drafts were fed)."""
    plan = scheduler.plan_catch_up(gamma, window)
    if plan is None:
        return False
    runner.catch_up(plan)
    return True


def reserve_blocks(scheduler, runner) -> None:
    """Before a step: every running row holds blocks past what the step may write; where the pool has too few,
    the latest-arrived request (running or filling) is preempted (vLLM's recompute preemption) until it does."""
    if scheduler.prefix_cache is not None:  # (the running rows' prompt blocks their models now hold: cached)
        scheduler.prefix_cache.commit_rows(scheduler.running, scheduler.drafter_state)
    while scheduler.short_row() is not None:
        preempt(scheduler, runner, scheduler.preemption_victim())
    scheduler.kv_pool.flush()  # (the step's graph reads the table by address: the new blocks land before it runs)


def preempt(scheduler, runner, request: EngineRequest) -> None:
    """Take a request's blocks back: its committed text becomes its prompt (recomputed on readmission), its
    statistics so far are folded, and it waits first in the queue. Never failed, never truncated."""
    if request in scheduler.filling:
        scheduler.filling.remove(request)
        runner.clear_row(request.slot)
        scheduler.release_blocks(request.slot)
    else:
        slot = scheduler.running.index(request)
        committed = runner.committed(slot, request.length)
        fold_stats(request, scheduler, runner.counters([slot])[0], runner.max_draft_tokens)  # (its time in the slot)
        request.generated_before += request.length - len(request.prompt)
        request.prompt = committed
        release(scheduler, runner, slot)
    scheduler.requeue(request)
