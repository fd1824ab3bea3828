"""The end of a step: its record becomes outputs, statistics and finished requests (mixed into `Engine`).

`_commit` turns the step's one `StepRecord` (row i = slot i) into a `RequestOutput` per running request and folds
the engine-wide statistics (`SpecStats.add_step`); `_finish` reads a finished request's acceptance counters from the
device, folds its `SpecStats` and frees its slot; `_row_estimates` reads the per-row counters the γ policy weighs.
"""

from __future__ import annotations

import time

import torch

from specdec.step import RequestOutput, StepCounts, StepRecord

__all__ = ["Commit"]


class Commit:
    """`Engine`'s step commit and request finish (see the module doc)."""

    def _commit(self, record: StepRecord) -> list[RequestOutput]:
        """An output per running request (row i of the step = slot i) from the step's record; folds the
        engine-wide statistics and finishes the requests that finished."""
        step = self._num_steps
        self._num_steps = step + 1
        self._last_used[record.gamma] = step
        self._passes += record.drafter_calls
        self._spec_steps += 1 if record.gamma else 0
        make, running = RequestOutput.make, self._running
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
        if self.prefix_cache is not None:  # (the committed text a prefix cache names its blocks by)
            self.prefix_cache.extend(running, tokens)
        self._stats.add_step(record)
        if record.num_finished:
            self._finish([slot for slot, f in enumerate(record.finished[: len(running)]) if f], record, outputs)
        return outputs

    def _finish(self, slots: list[int], record: StepRecord, outputs: list[RequestOutput]) -> None:
        """Requests that finished this step: their statistics (counters read from the device) and slots."""
        sums = self.state.counters[slots].tolist()  # (one read for them all)
        now = time.perf_counter()
        for slot, values in zip(slots, sums):
            request, out = self._running[slot], outputs[slot]
            self._fold_stats(request, slot, values)
            stats = request.stats
            stats.set_wall_time(now - request.arrival)
            outputs[slot] = RequestOutput.make(out.request_id, out.new_token_ids, out.logprobs, out.num_accepted,
                                               out.num_drafted, True, "stop" if record.hit_eos[slot] else "length",
                                               stats, top_logprobs=out.top_logprobs,
                                               num_cached_tokens=request.num_cached_tokens)
        for slot in reversed(slots):
            with self._lock:
                self._known.discard(self._running[slot].request_id)
            self._release(slot)

    def _fold_stats(self, request, slot: int, values: list[float] | None = None) -> None:
        """Fold the request's steps and acceptance counters since it took `slot` (`values`: its counters row, read
        here when None) into its `SpecStats` — at its finish, or at a preemption: each stay in a slot once."""
        values = self.state.counters[slot].tolist() if values is None else values
        steps, _, passes = request.admitted_at
        gamma = max([g for g, last in self._last_used.items() if last >= steps], default=0)
        cap = request.params.num_draft_tokens  # (its own cap, not the default: `policy.set_fixed` may move that)
        gamma = min(gamma, cap) if isinstance(cap, int) and request.params.draft_tree is None else gamma
        request.stats.add_steps(self._num_steps - steps, drafter_calls=self._passes - passes,
                                num_generated_tokens=request.length - len(request.prompt), max_gamma=gamma,
                                counts=StepCounts.from_row(values, self.max_draft_tokens,
                                                           request.params.draft_tree is None).narrow(gamma))

    def _row_estimates(self) -> list[tuple]:
        """The γ policy's per-row totals (Σβ, verified positions, speculative steps, steps that drafted), from
        the device's running counters (a host read)."""
        gamma, spec_steps = self.max_draft_tokens, self._spec_steps
        beta, drafting = StepCounts.column("beta_sum", gamma), StepCounts.column("drafting_rows", gamma)
        reached = StepCounts.positions("reached", gamma)
        counters = self.state.counters[: len(self._running)]
        if len(self._running) <= 16:  # few rows: read them whole; many: sum on the device first
            sums = [(v[beta], sum(v[reached]), v[drafting]) for v in counters.tolist()]
        else:
            sums = torch.stack([counters[:, beta], counters[:, reached].sum(1), counters[:, drafting]], 1).tolist()
        return [(beta_sum, reached, spec_steps - r.admitted_at[1], drafting)
                for r, (beta_sum, reached, drafting) in zip(self._running, sums)]
