"""The request-level engine: continuous batching of speculative decoding over a static slot cache.

    engine = Engine(target, drafter, EngineConfig(max_batch_size=64))
    engine.add_request(prompt_ids, SamplingParams(temperature=0, max_new_tokens=128))
    while engine.has_unfinished():
        for out in engine.step(): ...          # RequestOutput: new tokens, finished, finish_reason

One `step()`: admit waiting requests into free slots (prefill, eager, chunked; with the mixed step, `mixed_step` /
`prefill_budget`, at most a budget of prompt tokens per step while others run, riding in the step's own target
forward: `engine.prefill`, `engine.mixed_step`), then one decode step for
every running request: the policy picks γ (each row drafts at most its own cap, `SamplingParams.num_draft_tokens`,
and its budget: per-row draft lengths, so plain and speculative requests share a step); the drafter proposes (one
graph), the target scores [last, x_1..x_γ] and `core.verify` accepts (a second graph, which also commits with
`step.commit_counts`
and counts with `step.step_counters`); one device→host transfer of a small int64 table reads what each row
committed. The acceptance counters never travel per step: the verify graph adds them into per-slot running
sums on the device (`SlotState.counters`) and an engine-wide sum, read when a request finishes (its
`SpecStats`), when `engine.stats` is read, and when the γ policy needs per-row acceptance. Finished
requests leave and their slots are refilled at the next step. Rollback is free: each row's cache write
position is its committed length − 1, reset at every step.

Who runs is the scheduler's (`engine/scheduler.py`: queues, slots, the paged pool's tables, admission, preemption,
caps); the tensors are the runner's (`engine/runner.py`: models, caches, slot state, step shapes); between them a
step is a frozen `StepInput` in and a `StepRecord` out, which `engine.commit` folds into outputs.

Graphs are captured once per (batch bucket, γ, length bucket, flavor) and replayed; the cache is allocated
once. Each request carries its own parameters and seed; its random draws are a function of (seed, position)
(`specdec.rng`), so with a fixed γ its tokens do not depend on the other requests in the batch.
"""

from __future__ import annotations

import time

import torch

from specdec.engine import admission
from specdec.engine.agreement import agree_choice, timed_choice
from specdec.engine.async_steps import AsyncSteps
from specdec.engine.beam import BeamParams, Beams
from specdec.engine.commit import commit, finish, finished_slots, row_estimates
from specdec.engine.config import EngineConfig, resolve_async
from specdec.engine.drafters import WINDOW, Flavor
from specdec.engine.engine_request import EngineRequest
from specdec.engine.memory import KVCacheUsage
from specdec.engine.policy import GammaPolicy
from specdec.engine.prefill import ChunkBudget, finish_mixed, plan_mixed, prefill_rest
from specdec.engine.request_checks import check_request
from specdec.engine.runner import Runner
from specdec.engine.scheduler import Scheduler
from specdec.engine.step_input import StepInput
from specdec.engine.warmup import warm_prefill, warm_steps
from specdec.metrics import SpecStats
from specdec.processing import commit_constraints
from specdec.request import SamplingParams, normalize_prompts, resolve_seed
from specdec.step import RequestOutput, StepCounts, StepRecord

__all__ = ["Engine", "RequestOutput"]


def _forward(owner: str, name: str, doc: str | None = None) -> property:
    """A read-only attribute of the engine that is its scheduler's or runner's."""
    return property(lambda self: getattr(getattr(self, owner), name), doc=doc)


class Engine:
    """See the module doc. `add_request` and `abort` are thread-safe; `step` runs on one thread.

    Its parts are objects with their own state: the `scheduler` (`engine/scheduler.py`: queues, slots, the paged
    pool's tables, admission, preemption, caps), the `runner` (`engine/runner.py`: models, caches, slot state, step
    shapes), the γ `policy` and the mixed step's prefill budget (`chunked`, a `prefill.ChunkBudget`). A step is: the
    scheduler's decisions (admission, `engine/admission.py`; chunked prefill, `engine/prefill.py`), a `StepInput`
    the runner runs into a `StepRecord`, and `commit.commit` of that record into outputs; beam groups
    (`beam.Beams`) run their own forwards on the runner's slots above the chains'."""

    def __init__(self, target, drafter=None, config: EngineConfig | None = None):
        self.runner = runner = Runner(target, drafter, config or EngineConfig())
        self.config = config = runner.config  # (its mixed_step resolved: `config.resolve_mixed_step`)
        self.chunked = ChunkBudget(config, agree=getattr(runner.model, "leader_int", None))  # the mixed step's
        # budget: an int, "auto" or None (off); a sharded target's ranks feed rank 0's "auto" budget
        self._agree = getattr(runner.model, "leader_ints", None)  # (and run rank 0's "auto" γ: engine.agreement)
        admit_min = config.admit_min or max(1, runner.max_batch // 16)  # free slots worth one admission
        if self.chunked.budget and config.admit_min is None:  # (grouping admissions saves launches of whole
            admit_min = 1  # prefills; chunked feeds batch the filling rows anyway: a group only delays them)
        self.scheduler = Scheduler(runner.max_batch, runner.num_positions, admit_min=admit_min,
                                   admit_max_wait=config.admit_max_wait, max_draft_tokens=runner.max_draft_tokens,
                                   drafter_cached=runner.drafter_cached, has_drafter=runner.drafter is not None,
                                   kv_pool=runner.kv_pool, prefix_cache=runner.prefix_cache)
        self.policy = GammaPolicy(config.num_draft_tokens if drafter is not None else 0, runner.max_draft_tokens,
                                  plain_catches_up=runner.drafter_cached)
        # the mixed step feeds a cached drafter every filling prompt in every regime: no charge to speculating
        self.policy.admission.every_regime = bool(self.chunked.budget) and runner.drafter_cached
        self.stats = SpecStats()
        self._caps_from = self._step_caps = None  # the scheduler's caps record, and the one the steps run with (a
        # policy's per-row hold, `row_caps`, replaces its first rows until the rows change)
        self.beams = Beams(self.scheduler, runner)
        self.overlap = AsyncSteps(self) if resolve_async(config, runner.device) else None  # (`engine/async_steps.py`)

    # the runner's and the scheduler's numbers and parts, read where the engine was asked before the split
    model, cache, state, drafter, drafter_cached, device, vocab_size = (_forward("runner", n) for n in (
        "model", "cache", "state", "drafter", "drafter_cached", "device", "vocab_size"))
    max_batch, max_seq_len, num_positions, max_draft_tokens, max_tree_nodes = (_forward("runner", n) for n in (
        "max_batch", "max_seq_len", "num_positions", "max_draft_tokens", "max_tree_nodes"))
    memory, limits, draft_caps = (_forward("runner", n) for n in ("memory", "limits", "draft_caps"))
    cuda_graphs = property(lambda self: self.runner.cuda_graphs,
                           lambda self, value: setattr(self.runner, "cuda_graphs", value))  # (benchmarks: eager)
    prefill_graphs = property(lambda self: self.runner.prefill_graphs,
                              lambda self, value: setattr(self.runner, "prefill_graphs", value))
    counter_sums, tree_counter_sums, prefill_tokens = (_forward("runner", n) for n in (
        "counter_sums", "tree_counter_sums", "prefill_tokens"))
    kv_pool, prefix_cache, num_admissions, admit_min = (_forward("scheduler", n) for n in (
        "kv_pool", "prefix_cache", "num_admissions", "admit_min"))
    _steps = _forward("runner", "steps", "Step shapes built so far, by key (read by `text.warmup`).")
    _num_steps, _free_since, _catch_up_share = (_forward("scheduler", n) for n in (
        "num_steps", "free_since", "catch_up_share"))
    num_beam_groups = _forward("beams", "num_beam_groups", "Beam requests running (each holds num_beams slots).")
    prefill_budget = _forward("chunked", "budget")
    step_prefill_budget = _forward("chunked", "step_prefill_budget", "The prompt tokens the next step may prefill "
                                   "(`prefill.ChunkBudget.step_prefill_budget`; None: chunked prefill is off).")
    prefill_report = property(lambda self: self.chunked.report(), doc="\"auto\" prefill budget's report (or None).")
    prefix_cache_queries = property(lambda self: self.prefix_cache.queries if self.prefix_cache else 0)  # (tokens)
    prefix_cache_hits = property(lambda self: self.prefix_cache.hits if self.prefix_cache else 0)

    # ------------------------------------------------------------------------------------------ public
    @property
    def stats(self) -> SpecStats:
        """Engine-wide statistics since the last assignment (acceptance counters folded in from the device)."""
        stats = self._stats
        values, trees = self.runner.take_counter_sums()
        for row, has_beta in ((values, True), (trees, False)):
            counts = StepCounts.from_row(row, self.max_draft_tokens, has_beta)
            if has_beta or counts.active_rows:
                counted = max((i + 1 for i, r in enumerate(counts.reached) if r), default=0)  # (a step that raised)
                stats.add_counts(counts.narrow(max(stats.max_num_draft_tokens, counted)))
        return stats

    @stats.setter
    def stats(self, value: SpecStats) -> None:
        self.runner.zero_counter_sums()  # (a step in flight: its counts leave both sides, `AsyncSteps.stats_reset`)
        self._stats = value
        if getattr(self, "overlap", None) is not None:
            self.overlap.stats_reset()

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the engine's KV caches (the target's and a cached drafter's) and stored target features."""
        m = self.memory
        return m.target_kv + m.drafter_kv + m.features

    @property
    def kv_cache_usage(self) -> KVCacheUsage:
        """The KV cache's blocks now (vLLM's kv_cache_usage_perc is `.usage_perc`) and the preemptions so far."""
        return KVCacheUsage.of(self.kv_pool, self.num_running + self.num_prefilling, self.max_batch)

    @property
    def kv_cache_usage_perc(self) -> float:
        """Fraction of the KV cache held by requests, in [0, 1] (paged: blocks; static: slots)."""
        return self.kv_cache_usage.usage_perc

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_prefilling(self) -> int:
        """Requests admitted whose prompts are being prefilled a budget per step (`EngineConfig.prefill_budget`)."""
        return len(self.scheduler.filling)

    @property
    def num_step_shapes(self) -> int:
        """Step shapes built so far (each captured once as CUDA graphs when `cuda_graphs` is on)."""
        return len(self.runner.steps)

    def has_unfinished(self) -> bool:
        s = self.scheduler
        return bool(s.running or s.filling or s.waiting or s.aborted or self.beams.has_unfinished)

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: str | None = None, *,
                    beams: BeamParams | None = None) -> str:
        """Queue a request (validated now; errors name the argument). Returns its id. `beams`: a beam search of
        that width instead of a chain (`engine/beam.py`; it reports once, when it finishes)."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = normalize_prompts([prompt_ids], None, self.vocab_size)[0]
        check_request(len(prompt), params, self.limits)
        if self.kv_pool is not None:  # (a beam group's blocks: beam.py)
            self.scheduler.check_pool(len(prompt), params) if beams is None else \
                self.beams._check_beam_pool(len(prompt), params, beams)
        if beams is not None:
            self.beams._check_beams(params, beams, len(prompt))
        if params.processors:
            with torch.inference_mode():
                self.state.enable_processors(self.vocab_size)
        seed = resolve_seed(params.seed)

        def build(request_id: str) -> EngineRequest:
            return EngineRequest(request_id, prompt, params, seed, time.perf_counter(), len(prompt),
                                 flavor=Flavor.of(params))
        enqueue = None if beams is None else (lambda request: self.beams._queue_beams(request, beams))
        return self.scheduler.add(request_id, build, enqueue)

    def abort(self, request_id: str) -> None:
        """Cancel a request; its slot is freed at the next `step()`, which reports it finished ("abort")."""
        self.scheduler.abort(request_id)

    def warmup(self, batch_sizes=(1,), gammas=None, max_length: int | None = None,
               temperatures=(0.0,), draft_trees=(), progress=None) -> int:
        """Capture the decode graphs ahead of traffic (as servers do at start-up) for these batch sizes,
        γ values (default: every γ the policy may pick), every length bucket up to `max_length` (default:
        max_seq_len) and these temperatures (no top-k/top-p), the token-tree steps of `draft_trees` (shapes
        requests will ask for in `SamplingParams.draft_tree`), and the prefill graphs of a request admitted
        alone (`EngineConfig.prefill_graphs`) for prompts up to `max_length`; returns how many step shapes
        were built. `progress(built, total)` is called after each shape (a start-up progress bar)."""
        gammas = gammas if gammas is not None else sorted({0, *self.policy.candidates})
        built = warm_steps(self.runner, gammas, batch_sizes, max_length, temperatures, draft_trees, progress)
        with torch.inference_mode():
            self._warm_prefill(max_length or self.max_seq_len)
        self.policy.only_ready = True  # "auto" keeps to built shapes from now on (where any is built)
        return built

    def _warm_prefill(self, max_length: int) -> int:
        """The prefill graphs of a request admitted alone into slot 0 (`warmup.warm_prefill`; 0 while one runs)."""
        return 0 if self.scheduler.running else warm_prefill(self.runner, max_length)

    def row_cap(self, params: SamplingParams) -> int | None:
        """A request's draft cap on this engine: its `num_draft_tokens` (None: the engine's default), None = "auto"."""
        return self.scheduler.row_cap(params, self.policy.fixed)

    # ------------------------------------------------------------------------------------------- the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        return self._step() if self.overlap is None else self.overlap.step()  # (async scheduling: its own order)

    def _step(self) -> list[RequestOutput]:
        beams = self.beams
        outputs = beams._beam_aborts() + self._handle_aborts()
        beams._admit_beams(outputs)  # (beam groups: their own forwards, before the chains' timed step)
        self._admit(outputs)
        outputs += beams._step_beams()
        scheduler, runner = self.scheduler, self.runner
        # the filling rows' chunks ride in the step's own target forward (prefill.plan_mixed); with no chain step to
        # carry them (nothing runs; tree rows never run beside filling ones: admission.admit) the rest of their
        # prompts prefill whole now (prefill.prefill_rest)
        if scheduler.filling and (not scheduler.running or scheduler.running[0].params.draft_tree is not None):
            self._prefill_rest()
        if self.kv_pool is not None:  # blocks for what the step may write, preempting where the pool is short
            admission.reserve_blocks(scheduler, runner)
        if not scheduler.running:
            return outputs
        feed = plan_mixed(scheduler, self.chunked, runner.drafter_cached) if scheduler.filling else None
        chunks = feed.chunks if feed is not None else None
        running = scheduler.running
        n = len(running)
        batch, longest, flavor = scheduler.step_rows(self.policy.fixed)
        if scheduler.device_caps is not self._caps_from:  # (the rows or their caps changed: the device takes them)
            self._caps_from = self._step_caps = scheduler.device_caps
        tree = running[0].params.draft_tree  # running requests share one tree shape (or none; see _admit)
        if tree is None:
            ready = None  # which γ's step shapes are built: the policy keeps to them after a warm-up (no mid-run capture)
            if self.cuda_graphs or self.policy.only_ready:
                steps = runner.steps
                ready = lambda g: (batch, g, runner.positions(longest, g), flavor) in steps  # noqa: E731
            gamma = self.policy.choose(batch, running, self._row_estimates, length=longest, ready=ready,
                                       caps=scheduler.caps)
            capped = self.policy.row_caps()  # rows the policy holds below their caps this step (a collapse)
            if self._agree is not None and timed_choice(self.policy.fixed, scheduler.caps):  # (tensor parallel)
                gamma, capped = agree_choice(self._agree, gamma, capped, n)
            if capped is not None:
                self._step_caps = tuple(capped) + self._step_caps[n:]
            written = gamma
        else:  # a tree of depth D: no γ to choose
            gamma, written = len(tree), runner.tree(tree).spec.num_nodes - 1
        started = time.perf_counter()  # the step's time: not the policy's reads, not admission (see _admit)
        caught_up = self._catch_up_drafter(gamma)
        rows = batch  # (a mixed step too: its verify rows padded to the bucket, `engine/mixed_shapes.py`)
        constraints = tuple([r.constraint for r in running] + [None] * (min(rows, self.max_batch) - n)) \
            if flavor.constrained else None
        step = StepInput(n, rows, gamma, runner.positions(longest, written), flavor, self._step_caps, tree,
                         constraints, chunks)
        shape = self._step_for(step)
        first_run = not shape.ran  # its time includes graph capture, or a warmed graph's first replay: no step time
        capturing = self.cuda_graphs and not shape.captured and chunks is None  # (a mixed capture: not the policy's)
        record = runner.run(step, shape)
        if tree is None:
            self.policy.observe(record)  # (every chain step, first runs too: a draft-length policy's feedback)
        if flavor.constrained:
            commit_constraints([r.constraint for r in running], record.tokens)
        committed = self._commit(record)
        produced = record.num_produced
        seconds = time.perf_counter() - started
        # the policy weighs whole steps, device time and the host's share alike; a first run's time includes its
        # graph capture (no step time); a catch-up step's excess over the usual step is the plain steps' cost
        # a mixed step's time holds its chunks' (`ChunkBudget.mixed_share`, the prefill budget's split); the policy
        # takes its decode's share, pure decode steps' times first (`policy_mixed`)
        share = self.chunked.mixed_share(chunks.num_tokens, seconds) if chunks is not None else 0.0
        if not first_run and tree is None and share < seconds:
            self.policy.record_step(batch, gamma, seconds, produced / n, length=longest, rows=n,
                                    chunk_tokens=chunks.num_tokens if chunks is not None else 0, chunk_share=share,
                                    catch_up_of=scheduler.plain_run if caught_up else 0,
                                    catch_up_share=scheduler.catch_up_share,
                                    catch_up_prompts=scheduler.catch_up_prompts,
                                    accepted=record.num_accepted, drafted=record.num_drafted,  # (per slot)
                                    draft_seconds=record.draft_time_s)
        elif capturing:  # a capture in the middle of traffic (a shape the warm-up did not build): what it cost
            self.policy.record_capture(seconds)
        if not first_run and chunks is None:
            self.chunked.decoded(seconds)  # ("auto" prefill budget: a fraction of the decode step)
        if feed is not None:  # the drafter's feed of the planned prompts; fed requests join (prefill.finish_mixed)
            finish_mixed(scheduler, runner, self.policy, self.chunked, feed, share)
        scheduler.plain_run = scheduler.plain_run + 1 if gamma == 0 else 0
        return outputs + committed

    # the step's phases, each a method so that `engine.profile.phase_timer` can time it from outside
    def _handle_aborts(self) -> list[RequestOutput]:
        return admission.handle_aborts(self.scheduler, self.runner)

    def _admit(self, outputs: list[RequestOutput]) -> None:
        admission.admit(self.scheduler, self.runner, self.policy, self.chunked, outputs, self.beams._chain_limit())

    def _prefill_rest(self) -> bool:
        return prefill_rest(self.scheduler, self.runner, self.policy, self.chunked)

    def _catch_up_drafter(self, gamma: int) -> bool:
        return admission.catch_up_drafter(self.scheduler, self.runner, gamma, WINDOW)

    def _step_for(self, step: StepInput):
        return self.runner.shape(step)

    def _commit(self, record: StepRecord) -> list[RequestOutput]:
        """An output per running request; the finished ones complete and leave their slots."""
        scheduler = self.scheduler
        outputs = commit(record, scheduler, self._stats)
        slots = finished_slots(record, len(scheduler.running))
        if slots:
            finish(slots, self.runner.counters(slots), record, outputs, scheduler, self.max_draft_tokens)
            for slot in reversed(slots):
                scheduler.forget([scheduler.running[slot].request_id])
                admission.release(scheduler, self.runner, slot)
        return outputs

    def _row_estimates(self) -> list[tuple]:
        """The γ policy's per-row totals (`commit.row_estimates`; a host read of the runner's counters)."""
        return row_estimates(self.scheduler, self.runner.row_sums(len(self.scheduler.running)))
