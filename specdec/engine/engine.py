"""The request-level engine: continuous batching of speculative decoding over a static slot cache.

    engine = Engine(target, drafter, EngineConfig(max_batch_size=64))
    engine.add_request(prompt_ids, SamplingParams(temperature=0, max_new_tokens=128))
    while engine.has_unfinished():
        for out in engine.step(): ...          # RequestOutput: new tokens, finished, finish_reason

One `step()`: admit waiting requests into free slots (prefill, eager, chunked), then one decode step for
every running request: the policy picks γ; the drafter proposes (one graph), the target scores
[last, x_1..x_γ] and `core.verify` accepts (a second graph, which also commits with `step.commit_counts`
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
from dataclasses import dataclass, field

import torch

from specdec.engine.config import BATCH_BUCKETS, EngineConfig
from specdec.engine.drafters import Flavor
from specdec.engine.policy import GammaPolicy
from specdec.engine.slots import MAX_EOS_IDS, PrefillGraphs, SlotCache, SlotState, chunk_shapes, prefill_rows
from specdec.engine.step_runner import StepRunner
from specdec.fast.graphs import new_pool
from specdec.metrics import SpecStats
from specdec.request import SamplingParams, as_int, normalize_prompts, resolve_seed
from specdec.step import Clock, RequestOutput, StepCounts, StepRecord

__all__ = ["Engine", "RequestOutput"]

_MIN_POSITIONS = 64


@dataclass
class _Request:
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


class Engine:
    """See the module doc. `add_request` and `abort` are thread-safe; `step` runs on one thread."""

    def __init__(self, target, drafter=None, config: EngineConfig | None = None):
        from specdec.engine.build import build_drafter, build_model  # loading is at the edge

        self.config = config = config or EngineConfig()
        with torch.inference_mode():
            self.model = build_model(target, config.kernels)
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
            positions = self.max_seq_len + self.max_draft_tokens + 2  # verify writes + the junk slot
            self.max_batch = config.max_batch_size
            self.cache = SlotCache(self.model, self.max_batch, positions)
            self.num_positions = self.cache.num_positions
            width = StepCounts.width(self.max_draft_tokens)  # counters of any γ, laid out at the largest
            self.state = SlotState(self.max_batch, self.num_positions, self.device, counter_width=width)
            self.counter_sums = torch.zeros(width, dtype=torch.float64, device=self.device)  # engine-wide
            self.drafter = build_drafter(drafter, self) if drafter is not None else None
            # feature drafters read the target's hidden states (EAGLE-3: those entering some of its layers)
            self.model.feature_layers = getattr(self.drafter, "feature_layers", None)
            if getattr(self.drafter, "needs_features", False):
                self.state.enable_features(getattr(self.drafter, "feature_dim", shape.dim), self.model.dtype)
            self.model.rope_tables(self.num_positions)  # built before any capture (graphs keep their address)
            if hasattr(self.drafter, "model"):
                self.drafter.model.rope_tables(self.num_positions)
        on_cuda = self.device.type == "cuda"
        if config.cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        self.cuda_graphs = on_cuda if config.cuda_graphs is None else config.cuda_graphs
        if config.prefill_graphs and not self.cuda_graphs:
            raise ValueError("prefill_graphs=True needs cuda_graphs (a CUDA device)")
        use = self.cuda_graphs if config.prefill_graphs is None else config.prefill_graphs
        self.prefill_graphs = PrefillGraphs() if use else None  # admission chunks as CUDA graphs (slots.py)
        self.policy = GammaPolicy(config.num_draft_tokens if drafter is not None else 0, self.max_draft_tokens,
                                  plain_catches_up=hasattr(self.drafter, "prefill"))
        self.stats = SpecStats()
        self._num_steps = self._spec_steps = self._passes = 0  # steps run (requests diff these at the end)
        self._last_used: dict[int, int] = {}  # γ → index of the last step that ran it
        self._flavor = None  # of the running set; None = recompute (requests joined or left)
        self._drafter_synced = True  # every row's drafter cache holds all but its last 2 tokens (see catch-up)
        self._plain_run = 0  # plain steps since the last speculative one (what a catch-up makes up for)
        self._last_run = (None, None)
        self._running: list[_Request] = []  # index = slot
        self._waiting: deque[_Request] = deque()
        self._aborted: set[str] = set()
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._steps: dict = {}
        self._pool = None
        self._clock = Clock(self.device)

    # ------------------------------------------------------------------------------------------ public
    @property
    def stats(self) -> SpecStats:
        """Engine-wide statistics since the last assignment (acceptance counters folded in from the device)."""
        stats = self._stats
        values = self.counter_sums.tolist()
        with torch.inference_mode():  # the engine's tensors are inference tensors
            self.counter_sums.zero_()
        counts = StepCounts.from_row(values, self.max_draft_tokens)
        counted = max((i + 1 for i, r in enumerate(counts.reached) if r), default=0)  # (a step that raised)
        stats.add_counts(counts.narrow(max(stats.max_num_draft_tokens, counted)))
        return stats

    @stats.setter
    def stats(self, value: SpecStats) -> None:
        with torch.inference_mode():
            self.counter_sums.zero_()
        self._stats = value

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_unfinished(self) -> bool:
        return bool(self._running or self._waiting or self._aborted)

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue a request (validated now; errors name the argument). Returns its id."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.processors:
            raise ValueError(f"{', '.join(params.processors)}: logits processors run on the transformers loop "
                             "for now (engine='hf')")
        prompt = normalize_prompts([prompt_ids], None, self.vocab_size)[0]
        total = len(prompt) + params.max_new_tokens
        if total > self.max_seq_len:
            raise ValueError(
                f"prompt length {len(prompt)} + max_new_tokens {params.max_new_tokens} = {total} exceeds the "
                f"engine's max_seq_len of {self.max_seq_len} tokens"
            )
        if len(params.eos_token_ids) > MAX_EOS_IDS:
            raise ValueError(f"at most {MAX_EOS_IDS} eos_token_ids per request, got {len(params.eos_token_ids)}")
        for tok in params.eos_token_ids:
            if tok >= self.vocab_size:
                raise ValueError(f"eos_token_id {tok} is outside the vocabulary [0, {self.vocab_size})")
        seed = resolve_seed(params.seed)
        with self._lock:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
            elif not isinstance(request_id, str) or not request_id:
                raise TypeError(f"request_id must be a non-empty string, got {request_id!r}")
            if request_id in self._known:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._known.add(request_id)
            self._waiting.append(_Request(request_id, prompt, params, seed, time.perf_counter(), len(prompt),
                                          flavor=Flavor.of(params)))
        return request_id

    def abort(self, request_id: str) -> None:
        """Cancel a request; its slot is freed at the next `step()`, which reports it finished ("abort")."""
        with self._lock:
            if request_id in self._known:
                self._aborted.add(request_id)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        outputs = self._handle_aborts()
        self._admit(outputs)
        if not self._running:
            return outputs
        running = self._running
        n = len(running)
        batch = next(b for b in BATCH_BUCKETS if b >= n)
        longest = max([r.length for r in running])
        gamma = self.policy.choose(batch, running, self._row_estimates, length=longest)
        started = time.perf_counter()  # the step's time: not the policy's reads, not admission (see _admit)
        caught_up = self._catch_up_drafter(gamma)
        need = longest + gamma + 2
        positions = min(max(_MIN_POSITIONS, 1 << (need - 1).bit_length()), self.num_positions)
        flavor = self._flavor
        if flavor is None:  # the running set changed
            flavor = self._flavor = Flavor.union(r.flavor for r in running)
        run = self._step_for(batch, gamma, positions, flavor)
        first_run = not run.ran  # its time includes graph capture: not a step time
        run.ran = True
        clock = self._clock
        clock.mark(0)
        run.draft()
        clock.mark(1)
        packed = run.verify()
        clock.mark(2)
        passes = self.drafter.forward_passes(gamma) if gamma and self.drafter is not None else 0
        record = StepRecord.unpack(packed, run.layout, drafter_calls=passes,  # the step's one synchronization
                                   draft_time_s=clock.elapsed(0, 1), verify_time_s=clock.elapsed(1, 2))
        committed = self._commit(record)
        produced = record.num_produced
        seconds = time.perf_counter() - started
        # the policy weighs whole steps, device time and the host's share alike; a first run's time includes its
        # graph capture (no step time); a catch-up step's excess over the usual step is the plain steps' cost
        if not first_run:
            self.policy.record_step(batch, gamma, seconds, produced / n, length=longest,
                                    catch_up_of=self._plain_run if caught_up else 0)
        self._plain_run = self._plain_run + 1 if gamma == 0 else 0
        return outputs + committed

    # -------------------------------------------------------------------------------------- scheduling
    def _handle_aborts(self) -> list[RequestOutput]:
        if not self._aborted:  # read without the lock: an abort that races this is seen at the next step
            return []
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if aborted:
                self._waiting = deque(r for r in self._waiting if r.request_id not in aborted)
        outputs = [RequestOutput(rid, [], None, 0, 0, True, "abort") for rid in sorted(aborted)]
        for slot in sorted((i for i, r in enumerate(self._running) if r.request_id in aborted), reverse=True):
            self._release(slot)
        with self._lock:
            self._known -= aborted
        return outputs

    def _admit(self, outputs: list[RequestOutput]) -> None:
        """Move waiting requests into free slots; those admitted together prefill together."""
        first = len(self._running)
        admitted: list[_Request] = []
        while len(self._running) < self.max_batch:
            with self._lock:
                if not self._waiting:
                    break
                request = self._waiting.popleft()
            if request.params.max_new_tokens == 0:
                request.stats.set_wall_time(time.perf_counter() - request.arrival)
                outputs.append(RequestOutput(request.request_id, [], None, 0, 0, True, "length", request.stats))
                with self._lock:
                    self._known.discard(request.request_id)
                continue
            self._running.append(request)
            self._joined(request)
            admitted.append(request)
        if not admitted:
            return
        self.state.admit_rows(first, [r.prompt for r in admitted], [r.params for r in admitted],
                              [r.seed for r in admitted])
        start = time.perf_counter()
        rows = slice(first, len(self._running))
        lengths = [len(r.prompt) for r in admitted]
        # extent=0: the admitted slots hold nothing that must survive, so each chunk attends over a positions
        # bucket just past what it feeds, not the whole cache. With EngineConfig.prefill_graphs, a request admitted
        # alone into slot 0 (the batch-1 case, where eager prefill is launch-bound: ~7 ms vs ~2 ms replayed on an
        # H200) replays its chunk shapes as CUDA graphs once seen; other admissions vary in their rows, which would
        # multiply the shapes (and the mid-traffic captures), and are GPU-bound enough at 8+ rows to run eagerly.
        graphs = self.prefill_graphs if first == 0 and len(admitted) == 1 else None
        valid = self._prefill(rows, lengths, graphs)
        for request, v in zip(admitted, valid):
            request.draft_valid = v
        if self.device.type == "cuda":  # prefill runs ahead of the host: finish it here, or its device time
            torch.cuda.synchronize(self.device)  # lands in the next step's (the policy's) and prefill_time_s
        seconds = time.perf_counter() - start
        for request, n in zip(admitted, lengths):
            request.stats.add_prefill(seconds, 1 if n > 1 else 0)

    def _prefill(self, rows: slice, lengths: list[int], graphs) -> list[int]:
        """Prefill freshly admitted `rows` with prompts of `lengths`: the target all but each prompt's last token,
        the drafter (if it keeps a cache) all but its last two → the drafter's valid positions per row."""
        chunk, zeros = self.config.prefill_chunk, [0] * len(lengths)
        prefill_rows(self.model, self.cache, self.state, rows, zeros, [n - 1 for n in lengths], chunk,
                     features=self.state.features, extent=0, graphs=graphs)
        valid = [max(n - 2, 0) for n in lengths]
        if self.drafter is not None and hasattr(self.drafter, "prefill"):
            self.drafter.prefill(self.state, rows, zeros, valid, chunk, extent=0, graphs=graphs)
        return valid

    def _warm_prefill(self, max_length: int) -> int:
        """Capture the prefill graphs of a request admitted alone into slot 0, for every prompt length up to
        `max_length` (one length per distinct set of chunk shapes; slot 0 must be free) → lengths run."""
        graphs = self.prefill_graphs
        if graphs is None or self._running:
            return 0
        capacity, runs = self.state.capacity, 0
        drafter_positions = getattr(getattr(self.drafter, "cache", None), "num_positions", None)
        seen: set = set()
        for n in range(2, max_length + 1):
            shapes = {("target", *x) for x in chunk_shapes([0], [n - 1], self.config.prefill_chunk, 0, capacity,
                                                           self.cache.num_positions)}
            if drafter_positions is not None and hasattr(self.drafter, "prefill"):
                shapes |= {("drafter", *x) for x in chunk_shapes([0], [max(n - 2, 0)], self.config.prefill_chunk, 0,
                                                                 capacity, drafter_positions)}
            if shapes <= seen:
                continue
            seen |= shapes
            for _ in range(graphs.after + 1):  # seen `after` times, then captured
                self._prefill(slice(0, 1), [n], graphs)
            runs += 1
        return runs

    def _joined(self, request: _Request) -> None:
        """A request took a slot (its steps, passes and counters start counting from here)."""
        request.admitted_at = (self._num_steps, self._spec_steps, self._passes)
        self._flavor = None

    def _catch_up_drafter(self, gamma: int) -> bool:
        """Rows that ran plain steps fell behind in the drafter's cache; feed what it has not seen.

        After a speculative step every row's drafter cache holds all but its last 2 committed tokens (the window
        re-fed committed text and the accepted drafts were fed); `_drafter_synced` says so for all rows at once,
        and the rows' `draft_valid` is written only when a plain step follows. → whether it fed anything."""
        if self.drafter is None or not hasattr(self.drafter, "prefill"):
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
        rows = range(lagging[0], lagging[-1] + 1)  # one batched prefill; rows not lagging feed nothing
        starts = [self._running[i].draft_valid if i in lagging else 0 for i in rows]
        ends = [behind[i] if i in lagging else 0 for i in rows]
        extent = max(self._running[i].length for i in rows) + self.max_draft_tokens + 2  # what a row may hold
        self.drafter.prefill(self.state, slice(rows.start, rows.stop), starts, ends, self.config.prefill_chunk,
                             extent=extent)
        for i in lagging:
            self._running[i].draft_valid = behind[i]
        return True

    def _release(self, slot: int) -> None:
        """Free `slot`: the last running request moves into it, so running requests stay in 0..n-1."""
        last = len(self._running) - 1
        if slot != last:
            moved = self._running[last]
            positions = min(self.num_positions, 1 << max(moved.length + 1, 1).bit_length())
            self.cache.move(last, slot, positions)
            self.state.move(last, slot)
            if self.drafter is not None and hasattr(self.drafter, "move"):
                self.drafter.move(last, slot, positions)
            self._running[slot] = moved
        self._running.pop()
        self._flavor = None
        self.state.clear(last)

    # ------------------------------------------------------------------------------------------- steps
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
        else:
            outputs = [make(r.request_id, t, lp if r.params.logprobs else None, a if a < len(t) else len(t), d)
                       for r, t, a, d, lp in zip(running, tokens, accepted, drafted, logprobs)]
        for request, t in zip(running, tokens):
            request.length += len(t)
        self._stats.add_step(record)
        if record.num_finished:
            self._finish([slot for slot, f in enumerate(record.finished[: len(running)]) if f], record, outputs)
        return outputs

    def _finish(self, slots: list[int], record: StepRecord, outputs: list[RequestOutput]) -> None:
        """Requests that finished this step: their statistics (counters read from the device) and slots."""
        sums = self.state.counters[slots].tolist()
        now = time.perf_counter()
        for slot, values in zip(slots, sums):
            request, out = self._running[slot], outputs[slot]
            steps, _, passes = request.admitted_at
            stats = request.stats
            gamma = max([g for g, last in self._last_used.items() if last >= steps], default=0)
            stats.add_steps(self._num_steps - steps, drafter_calls=self._passes - passes,
                            num_generated_tokens=request.length - len(request.prompt), max_gamma=gamma,
                            counts=StepCounts.from_row(values, self.max_draft_tokens).narrow(gamma))
            stats.set_wall_time(now - request.arrival)
            outputs[slot] = RequestOutput.make(out.request_id, out.new_token_ids, out.logprobs, out.num_accepted,
                                               out.num_drafted, True, "stop" if record.hit_eos[slot] else "length",
                                               stats)
        for slot in reversed(slots):
            with self._lock:
                self._known.discard(self._running[slot].request_id)
            self._release(slot)

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

    def _step_for(self, batch: int, gamma: int, positions: int, flavor: Flavor) -> "StepRunner":
        key = (batch, gamma, positions, flavor)
        last_key, run = self._last_run
        if key == last_key:  # the usual case: the same shape as the last step
            return run
        run = self._steps.get(key)
        if run is None:
            if self.cuda_graphs and self._pool is None:
                self._pool = new_pool()
            run = self._steps[key] = StepRunner(self, batch, gamma, positions, flavor)
        self._last_run = (key, run)
        return run

    def warmup(self, batch_sizes=(1,), gammas=None, max_length: int | None = None,
               temperatures=(0.0,)) -> int:
        """Capture the decode graphs ahead of traffic (as servers do at start-up) for these batch sizes,
        γ values (default: every γ the policy may pick), every length bucket up to `max_length` (default:
        max_seq_len) and these temperatures (no top-k/top-p), and the prefill graphs of a request admitted
        alone (`EngineConfig.prefill_graphs`) for prompts up to `max_length`; returns how many step shapes
        were built."""
        gammas = gammas if gammas is not None else sorted({0, *self.policy.candidates})
        for size in batch_sizes:
            as_int(size, "batch_sizes", minimum=1, maximum=self.max_batch)
        for gamma in gammas:
            as_int(gamma, "gammas", minimum=0, maximum=self.max_draft_tokens)
        if max_length is not None:
            as_int(max_length, "max_length", minimum=1, maximum=self.max_seq_len)
        for temperature in temperatures:
            SamplingParams(temperature=temperature)  # a number >= 0, named in the error
        limit = min(self.num_positions, max_length + self.max_draft_tokens + 2 if max_length else self.num_positions)
        flavors = {Flavor(t == 0) for t in temperatures}
        built = 0
        with torch.inference_mode():
            for batch in sorted({next(b for b in BATCH_BUCKETS if b >= s) for s in batch_sizes}):
                positions = _MIN_POSITIONS
                while True:
                    for gamma in gammas:
                        for flavor in flavors:
                            self._step_for(batch, gamma, min(positions, self.num_positions), flavor).capture()
                            built += 1
                    if positions >= limit:
                        break
                    positions *= 2
            self._warm_prefill(max_length or self.max_seq_len)
        return built
