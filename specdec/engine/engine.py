"""The request-level engine: continuous batching of speculative decoding over a static slot cache.

    engine = Engine(target, drafter, EngineConfig(max_batch_size=64))
    engine.add_request(prompt_ids, SamplingParams(temperature=0, max_new_tokens=128))
    while engine.has_unfinished():
        for out in engine.step(): ...          # RequestOutput: new tokens, finished, finish_reason

One `step()`: admit waiting requests into free slots (prefill, eager, chunked; with `prefill_budget`, at most that
many prompt tokens per step while others run: `engine.prefill`), then one decode step for
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

Graphs are captured once per (batch bucket, γ, length bucket, flavor) and replayed; the cache is allocated
once. Each request carries its own parameters and seed; its random draws are a function of (seed, position)
(`specdec.rng`), so with a fixed γ its tokens do not depend on the other requests in the batch.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

import torch

from specdec.drafters.protocol import CachedSlotDrafter, FeatureSlotDrafter
from specdec.engine.admission import Admission, EngineRequest
from specdec.engine.beam import BeamParams, Beams
from specdec.engine.commit import Commit
from specdec.engine.config import BATCH_BUCKETS, EngineConfig, positions_bucket
from specdec.engine.drafters import Flavor
from specdec.engine.features import FeatureStore
from specdec.engine.kv_pool import paged_caches
from specdec.engine.memory import KVCacheUsage, check_engine
from specdec.engine.policy import GammaPolicy
from specdec.engine.prefill import ChunkedPrefill
from specdec.engine.prefix_cache import build_prefix_cache
from specdec.engine.request_checks import RequestLimits, check_request
from specdec.engine.slots import PrefillGraphs, SlotCache, SlotState
from specdec.engine.step_runner import StepRunner
from specdec.engine.tree_step import EngineTree, TreeStepRunner
from specdec.engine.warmup import Warmup
from specdec.fast.cache import round_up
from specdec.fast.graphs import new_pool
from specdec.metrics import Clock, SpecStats
from specdec.processing import commit_constraints
from specdec.request import SamplingParams, normalize_prompts, resolve_seed
from specdec.step import RequestOutput, StepCounts, StepRecord

__all__ = ["Engine", "RequestOutput"]


class Engine(Admission, ChunkedPrefill, Commit, Warmup, Beams):
    """See the module doc. `add_request` and `abort` are thread-safe; `step` runs on one thread.

    Its parts live beside it: admission and slots (`admission.Admission`), chunked prefill (`prefill.ChunkedPrefill`),
    the step's commit and the finish of requests (`commit.Commit`), graph warm-up (`warmup.Warmup`), beam groups
    (`beam.Beams`); this class holds the state and the step."""

    def __init__(self, target, drafter=None, config: EngineConfig | None = None):
        from specdec.engine.build import build_drafter, build_model  # loading is at the edge

        self.config = config = config or EngineConfig()
        with torch.inference_mode():
            self.model = build_model(target, config.kernels, config.bitwise, config.model_impl, config.gguf_weights)
            shape = self.model.shape
            self.device = self.model.device
            self.vocab_size = shape.vocab_size
            context = shape.context or 4096
            self.max_seq_len = int(config.max_seq_len or min(context, 4096))
            if self.max_seq_len > context:
                why = " (LongRoPE's short-factor range; past it the frequencies change mid-text)" \
                    if context == shape.arch.rope_limit else ""
                raise ValueError(f"max_seq_len {self.max_seq_len} exceeds the model's context of {context} tokens{why}")
            self.max_draft_tokens = 0 if drafter is None else config.max_draft_tokens
            self.max_tree_nodes = 0 if drafter is None else config.max_tree_nodes
            written = max(self.max_draft_tokens, self.max_tree_nodes - 1)  # a pass writes γ + 1 or a tree's nodes
            positions = self.max_seq_len + written + 2  # verify writes + the junk slot
            self.max_batch = config.max_batch_size
            self.admit_min = config.admit_min or max(1, self.max_batch // 16)  # free slots worth one admission
            paged = config.kv_layout == "paged"
            self.cache = SlotCache(self.model, self.max_batch, round_up(positions, config.block_size if paged else 16))
            self.num_positions = self.cache.num_positions
            width = StepCounts.width(self.max_draft_tokens)  # counters of any γ, laid out at the largest
            self.state = SlotState(self.max_batch, self.num_positions, self.device, counter_width=width)
            self.counter_sums = torch.zeros(width, dtype=torch.float64, device=self.device)  # engine-wide
            self.tree_counter_sums = torch.zeros_like(self.counter_sums)  # token-tree steps' (no single-draft β)
            self.drafter = build_drafter(drafter, self) if drafter is not None else None
            # what the drafter can do, from its protocols (`drafters.protocol`), found once
            self.drafter_cached = isinstance(self.drafter, CachedSlotDrafter)  # own slot cache: prefill, move
            features = isinstance(self.drafter, FeatureSlotDrafter) and self.drafter.needs_features
            # feature drafters read the target's hidden states (EAGLE-3: those entering some of its layers)
            self.model.feature_layers = self.drafter.feature_layers if features else None
            # (replaces the static caches, never allocated; a block holds the stored features of its positions too)
            dim = self.drafter.feature_dim if features else 0
            draft = self.drafter.cache if self.drafter_cached else None
            self.kv_pool = None
            if paged:  # one pool (its blocks hold the features too) replaces the static caches, never allocated
                self.kv_pool, self.cache, draft = paged_caches(self.cache, draft, dim, config, self.max_batch)
                if draft is not None:
                    self.drafter.cache = draft
            self.limits = self._limits(config, paged)
            self.prefix_cache = build_prefix_cache(config, self.kv_pool, self.model, self.cache, self.drafter, features)
            # every buffer's bytes against free memory (refused in one line), then allocated
            self.memory = check_engine(self.cache, draft, FeatureStore.nbytes_for(
                self.max_batch, self.num_positions, dim, self.model.dtype, self.kv_pool), self.state, self.device,
                self.max_batch, self.num_positions)
            self.cache.allocate()
            if self.drafter_cached:
                self.drafter.cache.allocate()
            if features:
                self.state.enable_features(self.drafter.feature_dim, self.model.dtype, self.kv_pool)
            self.model.rope_tables(self.num_positions)  # built before any capture (graphs keep their address)
            if self.drafter_cached:
                self.drafter.model.rope_tables(self.num_positions)
        on_cuda = self.device.type == "cuda" and getattr(self.model, "capturable", True)
        # (paged too: graphs read the block table by address; not the transformers backend: a model's own code may
        # sync the host, so its steps run eagerly)
        if config.cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        self.cuda_graphs = on_cuda if config.cuda_graphs is None else config.cuda_graphs
        if config.prefill_graphs and not self.cuda_graphs:
            raise ValueError("prefill_graphs=True needs cuda_graphs (a CUDA device)")
        use = self.cuda_graphs if config.prefill_graphs is None else config.prefill_graphs
        self._init_prefill(config)  # chunked prefill (engine/prefill.py): prefill_budget an int, "auto" or None (off)
        self.prefill_graphs = PrefillGraphs() if use else None  # admission chunks as CUDA graphs (slots.py)
        self.policy = GammaPolicy(config.num_draft_tokens if drafter is not None else 0, self.max_draft_tokens,
                                  plain_catches_up=self.drafter_cached)
        # each slot's draft cap on the device (the verify pass clamps its draft length to it and to its budget:
        # `step_runner`), and each running row's on the host (an int, or None: "auto"), set when the rows change
        self.draft_caps = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)
        self._caps: list[int | None] = []
        self._caps_default = self.policy.fixed  # the default they were resolved with (`policy.set_fixed` moves it)
        self.stats = SpecStats()
        self._num_steps = self._spec_steps = self._passes = 0  # steps run (requests diff these at the end)
        self._last_used: dict[int, int] = {}  # γ → index of the last step that ran it
        self._flavor = None  # of the running set; None = recompute (requests joined or left)
        self._drafter_synced = True  # every row's drafter cache holds all but its last 2 tokens (see catch-up)
        self._plain_run = 0  # plain steps since the last speculative one (what a catch-up makes up for)
        self._catch_up_share = 1.0  # of the last catch-up's tokens, the share plain steps committed (not prompts)
        self._catch_up_prompts = 0  # and the prompt tokens it fed (admitted in the plain run)
        self._free_since = None  # the step since which a slot has been free while requests waited (see _admit)
        self.num_admissions = 0  # admissions (each one prefill of the requests admitted together)
        self.prefill_tokens = 0  # tokens prefilled so far: prompts (target and cached drafter) and catch-ups (public)
        self._last_run = (None, None)
        self._running: list[EngineRequest] = []  # index = slot
        self._waiting: deque[EngineRequest] = deque()
        self._aborted: set[str] = set()
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._steps: dict = {}
        self._trees: dict[tuple, EngineTree] = {}
        self._pool = None
        self._clock = Clock(self.device)
        self._init_beams()

    # ------------------------------------------------------------------------------------------ public
    @property
    def stats(self) -> SpecStats:
        """Engine-wide statistics since the last assignment (acceptance counters folded in from the device)."""
        stats = self._stats
        values = self.counter_sums.tolist()
        trees = self.tree_counter_sums.tolist()
        with torch.inference_mode():  # the engine's tensors are inference tensors
            self.counter_sums.zero_()
            self.tree_counter_sums.zero_()
        for row, has_beta in ((values, True), (trees, False)):
            counts = StepCounts.from_row(row, self.max_draft_tokens, has_beta)
            if has_beta or counts.active_rows:
                counted = max((i + 1 for i, r in enumerate(counts.reached) if r), default=0)  # (a step that raised)
                stats.add_counts(counts.narrow(max(stats.max_num_draft_tokens, counted)))
        return stats

    @stats.setter
    def stats(self, value: SpecStats) -> None:
        with torch.inference_mode():
            self.counter_sums.zero_()
            self.tree_counter_sums.zero_()
        self._stats = value

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
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_prefilling(self) -> int:
        """Requests admitted whose prompts are being prefilled a budget per step (`EngineConfig.prefill_budget`)."""
        return len(self._filling)

    @property
    def num_step_shapes(self) -> int:
        """Step shapes built so far (each captured once as CUDA graphs when `cuda_graphs` is on)."""
        return len(self._steps)

    def has_unfinished(self) -> bool:
        return bool(self._running or self._filling or self._waiting or self._aborted or self._beam_groups
                    or self._beam_waiting)

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: str | None = None, *,
                    beams: BeamParams | None = None) -> str:
        """Queue a request (validated now; errors name the argument). Returns its id. `beams`: a beam search of
        that width instead of a chain (`engine/beam.py`; it reports once, when it finishes)."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = normalize_prompts([prompt_ids], None, self.vocab_size)[0]
        check_request(len(prompt), params, self.limits)
        if self.kv_pool is not None:
            self._check_pool(len(prompt), params, beams)
        if beams is not None:
            self._check_beams(params, beams, len(prompt))
        if params.processors:
            with torch.inference_mode():
                self.state.enable_processors(self.vocab_size)
        seed = resolve_seed(params.seed)
        with self._lock:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
            elif not isinstance(request_id, str) or not request_id:
                raise TypeError(f"request_id must be a non-empty string, got {request_id!r}")
            if request_id in self._known:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._known.add(request_id)
            request = EngineRequest(request_id, prompt, params, seed, time.perf_counter(), len(prompt),
                                    flavor=Flavor.of(params))
            if beams is None:
                self._waiting.append(request)
            else:
                self._queue_beams(request, beams)
        return request_id

    def abort(self, request_id: str) -> None:
        """Cancel a request; its slot is freed at the next `step()`, which reports it finished ("abort")."""
        with self._lock:
            if request_id in self._known:
                self._aborted.add(request_id)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        outputs = self._beam_aborts() + self._handle_aborts()
        self._admit_beams(outputs)  # (beam groups: their own forwards, before the chains' timed step)
        self._admit(outputs)
        outputs += self._step_beams()
        if self._filling:  # at most one budget of prompt tokens, then the decode step (see prefill.py)
            self._prefill_step()
        if self.kv_pool is not None:  # blocks for what the step may write, preempting where the pool is short
            self._reserve_blocks()
        if not self._running:
            return outputs
        running = self._running
        n = len(running)
        batch = next(b for b in BATCH_BUCKETS if b >= n)
        longest = max([r.length for r in running])
        if self._filling:  # filling rows inside the batch bucket are its padding: their prompts must fit the step
            longest = max([longest] + [r.length for r in self._filling if r.slot < batch])
        flavor = self._flavor
        if flavor is None:  # the running set changed
            flavor = self._flavor = Flavor.union(r.flavor for r in running)
            self._set_caps(running)
        elif self._caps_default != self.policy.fixed:  # (a new default γ: the rows that take it)
            self._set_caps(running)
        tree = running[0].params.draft_tree  # running requests share one tree shape (or none; see _admit)
        if tree is None:
            ready = None  # which γ's step shapes are built: the policy keeps to them after a warm-up (no mid-run capture)
            if self.cuda_graphs or self.policy.only_ready:
                steps = self._steps
                ready = lambda g: (batch, g, self._positions(longest, g), flavor) in steps  # noqa: E731
            gamma = self.policy.choose(batch, running, self._row_estimates, length=longest, ready=ready,
                                       caps=self._caps)
            capped = self.policy.row_caps()  # rows the policy holds below their caps this step (a collapse)
            if capped is not None:
                self.draft_caps[:n].copy_(torch.tensor(capped), non_blocking=True)
        else:  # a tree of depth D: no γ to choose
            gamma, tree = len(tree), self._tree(tree)
        started = time.perf_counter()  # the step's time: not the policy's reads, not admission (see _admit)
        caught_up = self._catch_up_drafter(gamma)
        positions = self._positions(longest, gamma if tree is None else tree.spec.num_nodes - 1)
        run = self._step_for(batch, gamma, positions, flavor, tree)
        first_run = not run.ran  # its time includes graph capture, or a warmed graph's first replay: no step time
        capturing = self.cuda_graphs and not run.captured
        run.ran = True
        if flavor.constrained:  # the host constraints of the rows, in slot order
            run.view.constraints = [r.constraint for r in running] + [None] * (run.view.lengths.shape[0] - n)
        clock = self._clock
        clock.mark(0)
        run.draft()
        clock.mark(1)
        packed = run.verify()
        clock.mark(2)
        record = StepRecord.unpack(packed, run.layout, drafter_calls=run.drafts.forward_passes,  # (the proposal's)
                                   draft_time_s=clock.elapsed(0, 1), verify_time_s=clock.elapsed(1, 2),
                                   has_beta=tree is None)  # (the step's one synchronization)
        if flavor.constrained:
            commit_constraints([r.constraint for r in running], record.tokens)
        committed = self._commit(record)
        produced = record.num_produced
        seconds = time.perf_counter() - started
        # the policy weighs whole steps, device time and the host's share alike; a first run's time includes its
        # graph capture (no step time); a catch-up step's excess over the usual step is the plain steps' cost
        if not first_run and tree is None:
            self.policy.record_step(batch, gamma, seconds, produced / n, length=longest, rows=n,
                                    catch_up_of=self._plain_run if caught_up else 0,
                                    catch_up_share=self._catch_up_share, catch_up_prompts=self._catch_up_prompts,
                                    accepted=record.num_accepted, drafted=record.num_drafted,  # (per slot)
                                    draft_seconds=record.draft_time_s)
        elif capturing:  # a capture in the middle of traffic (a shape the warm-up did not build): what it cost
            self.policy.record_capture(seconds)
        if not first_run:
            self._decoded(seconds)  # ("auto" prefill budget: a fraction of the decode step)
        self._plain_run = self._plain_run + 1 if gamma == 0 else 0
        return outputs + committed

    # ------------------------------------------------------------------------------------------- steps
    def row_cap(self, params: SamplingParams) -> int | None:
        """A request's draft cap on this engine: its `num_draft_tokens` (None: the engine's default), None = "auto"."""
        cap = params.num_draft_tokens
        cap = self.policy.fixed if cap is None else None if cap == "auto" else cap
        return cap if self.drafter is not None else 0

    def _set_caps(self, running) -> None:
        """The running rows' caps, slot order: on the host for the policy, on the device for the verify pass ("auto"
        rows: max_draft_tokens there, the step's γ bounds them; idle slots 0)."""
        self._caps, self._caps_default = [self.row_cap(r.params) for r in running], self.policy.fixed
        values = [self.max_draft_tokens if c is None else c for c in self._caps]
        self.draft_caps.copy_(torch.tensor(values + [0] * (self.max_batch - len(values))), non_blocking=True)

    def _positions(self, longest: int, written: int) -> int:
        """The length bucket of a step writing `written` + 1 slots (γ + 1, or a tree's nodes) whose longest row
        holds `longest` tokens: the positions it attends over (`config.positions_bucket`)."""
        return positions_bucket(longest + written + 2, self.num_positions)

    def _step_for(self, batch: int, gamma: int, positions: int, flavor: Flavor, tree: EngineTree | None = None):
        # a tree step's key holds its branching where a chain's holds γ (the policy's `ready` looks chains up)
        key = (batch, gamma if tree is None else tree.spec.branching, positions, flavor)
        last_key, run = self._last_run
        if key == last_key:  # the usual case: the same shape as the last step
            return run
        run = self._steps.get(key)
        if run is None:
            if self.cuda_graphs and self._pool is None:
                self._pool = new_pool()
            run = self._steps[key] = StepRunner(self, batch, gamma, positions, flavor) if tree is None else \
                TreeStepRunner(self, batch, tree, positions, flavor)
        self._last_run = (key, run)
        return run

    # ------------------------------------------------------------------------------------------- trees
    def _limits(self, config: EngineConfig, paged: bool) -> RequestLimits:
        from specdec.engine.drafters import EngineModelDrafter  # (the cross-vocabulary one grows no trees)

        shape = self.model.shape
        return RequestLimits(self.vocab_size, self.max_seq_len, self.max_draft_tokens, self.max_tree_nodes,
                             None if self.drafter is None else type(self.drafter).__name__,
                             type(self.drafter) is EngineModelDrafter, paged, config.bitwise,
                             any(shape.arch.window(i) is not None for i in range(shape.n_layers)))

    def _tree(self, branching: tuple[int, ...]) -> EngineTree:
        if branching not in self._trees:  # (device tensors built once per shape)
            self._trees[branching] = EngineTree.of(branching, self.device)
        return self._trees[branching]
