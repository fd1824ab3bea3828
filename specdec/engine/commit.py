"""The end of a step: its record becomes outputs, statistics and finished requests — functions of (record, the
scheduler's books).

`commit` turns the step's one `StepRecord` (row i = slot i) into a `RequestOutput` per running request, advances
each request's committed length and the scheduler's step counts, and folds the engine-wide statistics
(`SpecStats.add_step`); `finish` completes the outputs of the requests that finished (their acceptance counters,
read from the runner, folded into their `SpecStats` by `fold_stats`); `row_estimates` are the per-row totals the γ
policy weighs. Freeing the finished requests' slots is admission's (`admission.release`).
"""

from __future__ import annotations

import time

from specdec.step import RequestOutput, StepCounts, StepRecord

__all__ = ["commit", "finish", "finished_slots", "fold_stats", "row_estimates"]


def commit(record: StepRecord, scheduler, stats) -> list[RequestOutput]:
    """An output per running request (row i of the step = slot i) from the step's record; the requests' lengths
    and the scheduler's step counts advanced, the engine-wide `stats` folded."""
    scheduler.count_step(record.gamma, record.drafter_calls)
    make, running = RequestOutput.make, scheduler.running
    tokens, accepted, drafted, logprobs = record.tokens, record.num_accepted, record.num_drafted, record.logprobs
    # num_accepted of an output: the accepted drafts among its committed tokens
    if logprobs is None:
        outputs = [make(r.request_id, t, None, a if a < len(t) else len(t), d)
                   for r, t, a, d in zip(running, tokens, accepted, drafted)]
    elif record.top_logprobs is None:
        outputs = [make(r.request_id, t, lp if r.params.logprobs else None, a if a < len(t) else len(t), d)
                   for r, t, a, d, lp in zip(running, tokens, accepted, drafted, logprobs)]
    else:  # each row's own N of the step's most alternatives
        outputs = [make(r.request_id, t, lp if r.params.logprobs else None, a if a < len(t) else len(t), d,
                        top_logprobs=[alt[: r.params.top_logprobs] for alt in top] if r.params.top_logprobs
                        else None)
                   for r, t, a, d, lp, top in zip(running, tokens, accepted, drafted, logprobs, record.top_logprobs)]
    for request, t in zip(running, tokens):
        request.length += len(t)
    if scheduler.prefix_cache is not None:  # (the committed text a prefix cache names its blocks by)
        scheduler.prefix_cache.extend(running, tokens)
    stats.add_step(record)
    return outputs


def finished_slots(record: StepRecord, num_running: int) -> list[int]:
    """The slots whose request finished in this step."""
    return [slot for slot, f in enumerate(record.finished[:num_running]) if f] if record.num_finished else []


def finish(slots: list[int], counters: list[list[float]], record: StepRecord, outputs: list[RequestOutput],
           scheduler, max_draft_tokens: int) -> None:
    """Requests that finished this step (in `slots`, `counters`: their acceptance counters' rows): their
    statistics folded, their outputs final ("stop" at an EOS, else "length")."""
    now = time.perf_counter()
    for slot, values in zip(slots, counters):
        request, out = scheduler.running[slot], outputs[slot]
        fold_stats(request, scheduler, values, max_draft_tokens)
        stats = request.stats
        stats.set_wall_time(now - request.arrival)
        outputs[slot] = RequestOutput.make(out.request_id, out.new_token_ids, out.logprobs, out.num_accepted,
                                           out.num_drafted, True, "stop" if record.hit_eos[slot] else "length",
                                           stats, top_logprobs=out.top_logprobs,
                                           num_cached_tokens=request.num_cached_tokens)


def fold_stats(request, scheduler, values: list[float], max_draft_tokens: int) -> None:
    """Fold the request's steps and acceptance counters since it took its slot (`values`: its counters row) into
    its `SpecStats` — at its finish, or at a preemption: each stay in a slot once."""
    steps, _, passes = request.admitted_at
    gamma = scheduler.gamma_since(steps)
    cap = request.params.num_draft_tokens  # (its own cap, not the default: `policy.set_fixed` may move that)
    gamma = min(gamma, cap) if isinstance(cap, int) and request.params.draft_tree is None else gamma
    request.stats.add_steps(scheduler.num_steps - steps, drafter_calls=scheduler.passes - passes,
                            num_generated_tokens=request.length - len(request.prompt), max_gamma=gamma,
                            counts=StepCounts.from_row(values, max_draft_tokens,
                                                       request.params.draft_tree is None).narrow(gamma))


def row_estimates(scheduler, sums: list[tuple]) -> list[tuple]:
    """The γ policy's per-row totals (Σβ, verified positions, speculative steps, steps that drafted) from the
    runner's per-row counter `sums` (`Runner.row_sums`)."""
    spec_steps = scheduler.spec_steps
    return [(beta_sum, reached, spec_steps - r.admitted_at[1], drafting)
            for r, (beta_sum, reached, drafting) in zip(scheduler.running, sums)]
