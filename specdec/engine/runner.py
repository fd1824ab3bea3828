"""The engine's runner: the models, their caches, the slot state and the step shapes — it never decides who runs.

`Runner(target, drafter, config)` builds the target's `FastLlama`, the drafter, the slot caches (static, or over
the paged pool's blocks: `kv_pool.paged_caches`, whose tables the scheduler edits), the per-slot state on the device
(`SlotState`) and the engine-wide counters, after counting every buffer against free memory (`memory.check_engine`).
`run(StepInput) → StepRecord` runs one decode/verify step on its shape (`StepRunner`, `TreeStepRunner`: built once
per (batch bucket, γ or tree, length bucket, flavor), eager or captured as CUDA graphs, each given the runner's
parts, `StepParts`); the row operations (`admit_rows`, `move_slot`, `swap_slots`, `clear_row`, `resume_row`) and
the prefill compute (`prefill_target`, `prefill_drafter`, `feed`, `catch_up`) do what the scheduler decided.
vLLM's `GPUModelRunner` has the same role.
"""

from __future__ import annotations

import time

import torch

from specdec.drafters.protocol import CachedSlotDrafter, FeatureSlotDrafter
from specdec.engine.config import EngineConfig, positions_bucket, resolve_mixed_step
from specdec.engine.drafters import Flavor
from specdec.engine.features import FeatureStore
from specdec.engine.kv_pool import paged_caches
from specdec.engine.memory import check_engine
from specdec.engine.mixed_step import mixed_shape
from specdec.engine.prefix_build import build_prefix_cache
from specdec.engine.request_checks import RequestLimits
from specdec.engine.runner_parts import StepParts
from specdec.engine.slots import PrefillGraphs, SlotCache, SlotState, prefill_ragged, prefill_rows
from specdec.engine.step_input import StepInput
from specdec.engine.step_runner import StepRunner
from specdec.engine.tree_step import EngineTree, TreeStepRunner
from specdec.fast.cache import round_up
from specdec.fast.graphs import new_pool
from specdec.fast.ragged import covers as ragged_covers
from specdec.metrics import Clock
from specdec.step import StepCounts, StepRecord

__all__ = ["Runner"]


class Runner:
    """See the module doc. Its numbers (`max_batch`, `max_seq_len`, `num_positions`, `max_draft_tokens`, ...) are what
    the scheduler and the request checks are sized by."""

    def __init__(self, target, drafter=None, config: EngineConfig | None = None):
        from specdec.engine.build import build_drafter, build_model  # loading is at the edge

        self.config = config = config or EngineConfig()
        with torch.inference_mode():
            self.model = build_model(target, config.kernels, config.bitwise, config.model_impl, config.gguf_weights)
            shape = self.model.shape
            # mixed_step True / False from here on (forward_ragged runs that body's layers; True where not: refused)
            self.config = config = resolve_mixed_step(config, ragged_covers(self.model), type(self.model).__name__)
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
            dim = self.drafter.feature_dim if features else 0
            draft = self.drafter.cache if self.drafter_cached else None
            self.kv_pool = None  # (the paged pool: its tables are the scheduler's to edit; the caches read them)
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
        cuda_graphs = on_cuda if config.cuda_graphs is None else config.cuda_graphs
        if config.prefill_graphs and not cuda_graphs:
            raise ValueError("prefill_graphs=True needs cuda_graphs (a CUDA device)")
        use = cuda_graphs if config.prefill_graphs is None else config.prefill_graphs
        self.prefill_graphs = PrefillGraphs() if use else None  # admission chunks as CUDA graphs (slots.py)
        # each slot's draft cap on the device (the verify pass clamps its draft length to it and to its budget)
        self.draft_caps = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)
        self._caps_written: tuple | None = None  # the `StepInput.draft_caps` last copied there
        self.prefill_tokens = 0  # tokens prefilled so far: prompts (target and cached drafter) and catch-ups
        self.steps: dict = {}  # step shapes by (batch, γ or tree branching, positions, flavor)
        self.mixed_steps: dict = {}  # mixed steps' shapes by (batch bucket, γ, flavor, token bucket): mixed_shapes.py
        self.num_mixed_steps = 0  # steps that fed prompt chunks in their target forward (`EngineConfig.mixed_step`)
        self.trees: dict[tuple, EngineTree] = {}
        self._last_run = (None, None)
        self._clock = Clock(self.device)
        self.parts = StepParts(self.model, self.cache, self.drafter, self.drafter_cached, self.state, self.draft_caps,
                               self.counter_sums, self.tree_counter_sums, config, self.device, self.vocab_size,
                               self.max_draft_tokens, cuda_graphs, new_pool() if cuda_graphs else None)

    @property
    def cuda_graphs(self) -> bool:
        """Whether steps run as CUDA graphs (set False for an eager pass: every step shape reads it)."""
        return self.parts.cuda_graphs

    @cuda_graphs.setter
    def cuda_graphs(self, value: bool) -> None:
        self.parts.cuda_graphs = bool(value)

    def _limits(self, config: EngineConfig, paged: bool) -> RequestLimits:
        from specdec.engine.drafters import EngineModelDrafter  # (the cross-vocabulary one grows no trees)

        shape = self.model.shape
        return RequestLimits(self.vocab_size, self.max_seq_len, self.max_draft_tokens, self.max_tree_nodes,
                             None if self.drafter is None else type(self.drafter).__name__,
                             type(self.drafter) is EngineModelDrafter, paged, config.bitwise,
                             any(shape.arch.window(i) is not None for i in range(shape.n_layers)))

    # ------------------------------------------------------------------------------------------ step shapes
    def positions(self, longest: int, written: int) -> int:
        """The length bucket of a step writing `written` + 1 slots (γ + 1, or a tree's nodes) whose longest row
        holds `longest` tokens: the positions it attends over (`config.positions_bucket`)."""
        return positions_bucket(longest + written + 2, self.num_positions)

    def tree(self, branching: tuple[int, ...]) -> EngineTree:
        if branching not in self.trees:  # (device tensors built once per shape)
            self.trees[branching] = EngineTree.of(branching, self.device)
        return self.trees[branching]

    def step_for(self, batch: int, gamma: int, positions: int, flavor: Flavor, tree: EngineTree | None = None):
        """The step shape for these (built once: eager, or captured at its first run / by the warm-up)."""
        # a tree step's key holds its branching where a chain's holds γ (the policy's `ready` looks chains up)
        key = (batch, gamma if tree is None else tree.spec.branching, positions, flavor)
        last_key, run = self._last_run
        if key == last_key:  # the usual case: the same shape as the last step
            return run
        run = self.steps.get(key)
        if run is None:
            run = self.steps[key] = StepRunner(self.parts, batch, gamma, positions, flavor) if tree is None else \
                TreeStepRunner(self.parts, batch, tree, positions, flavor)
        self._last_run = (key, run)
        return run

    def shape(self, step: StepInput):
        """The step shape `step` runs on (a mixed step's: `mixed_step.MixedStepRunner`, one per bounded key)."""
        if step.prefill is not None:  # (its bounded shape: batch bucket, γ, flavor, token bucket)
            return mixed_shape(self, step)
        tree = None if step.tree is None else self.tree(step.tree)
        return self.step_for(step.batch, step.gamma, step.positions, step.flavor, tree)

    def run(self, step: StepInput, shape=None) -> StepRecord:
        """One decode/verify step over rows 0..num_rows−1 → its record (the step's one synchronization)."""
        run = shape if shape is not None else self.shape(step)
        self._prepare(step, run)
        clock = self._clock
        clock.mark(0)
        run.draft()
        clock.mark(1)
        packed = run.verify()
        clock.mark(2)
        return StepRecord.unpack(packed, run.layout, drafter_calls=run.drafts.forward_passes,  # (the proposal's)
                                 draft_time_s=clock.elapsed(0, 1), verify_time_s=clock.elapsed(1, 2),
                                 has_beta=step.tree is None)

    def launch(self, step: StepInput, shape) -> torch.Tensor:
        """`run` without its read: the step's draft and verify launched → its `pack_step` table on the device, not
        waited for (async scheduling, `engine/async_steps.py`, reads it behind an event; a chain step, no mixed one)."""
        self._prepare(step, shape)
        shape.draft()
        return shape.launch_verify()

    def _prepare(self, step: StepInput, run) -> None:
        """What a step hands its shape before it runs: a mixed step's chunks, changed draft caps, host constraints."""
        run.ran = True
        if step.prefill is not None:  # (a mixed step: the filling rows' chunks ride in its target forward)
            run.prefill = step.prefill
            self.prefill_tokens += step.prefill.num_tokens
            self.num_mixed_steps += 1
        if step.draft_caps is not self._caps_written:  # (the rows or their caps changed)
            self.draft_caps.copy_(torch.tensor(step.draft_caps), non_blocking=True)
            self._caps_written = step.draft_caps
        if step.constraints is not None:  # the host constraints of the rows, in slot order
            run.view.constraints = list(step.constraints)

    # ------------------------------------------------------------------------------------------------ rows
    def admit_rows(self, first: int, requests) -> None:
        """Rows first, first + 1, ... take these requests' prompts, parameters and seeds."""
        self.state.admit_rows(first, [r.prompt for r in requests], [r.params for r in requests],
                              [r.seed for r in requests])

    def resume_row(self, slot: int, prompt: list[int], generated: int) -> None:
        """A request preempted after `generated` tokens (now the tail of `prompt`) re-admitted into `slot`: the state
        its admission wrote as if it were new — generated tokens, output counts — set back to what it had."""
        self.state.generated[slot] = generated
        history = self.state.history
        if history is not None:  # the prompt's tokens are the repetition penalty's; the output's are counted
            before, output = prompt[:-generated], prompt[-generated:]
            device = history.counts.device
            history.prompt_seen[slot] = False
            history.prompt_seen[slot, torch.tensor(before, device=device)] = True
            history.counts[slot] = torch.bincount(torch.tensor(output, device=device),
                                                  minlength=history.counts.shape[1]).float()

    def move_slot(self, src: int, dst: int, positions: int) -> None:
        """Slot `src` (its first `positions` cache positions, in the target's and a cached drafter's caches, and its
        row state) into slot `dst` (paged: the scheduler moved the table row; the caches move their lengths)."""
        self.cache.move(src, dst, positions)
        self.state.move(src, dst)
        if self.drafter_cached:
            self.drafter.cache.move(src, dst, positions)

    def swap_slots(self, a: int, b: int, positions: int) -> None:
        """Slots `a` and `b` exchange everything `move_slot` moves."""
        self.cache.swap(a, b, positions)
        self.state.swap(a, b)
        if self.drafter_cached:
            self.drafter.cache.swap(a, b, positions)

    def clear_row(self, slot: int) -> None:
        self.state.clear(slot)

    def committed(self, slot: int, length: int) -> list[int]:
        """Row `slot`'s first `length` tokens (a host read)."""
        return self.state.tokens[slot, :length].tolist()

    # -------------------------------------------------------------------------------------------- prefill
    def prefill_target(self, rows: slice, starts: list[int], ends: list[int], graphs=None,
                       timed: bool = False) -> float | None:
        """The target fed rows' positions [starts, ends) of fresh rows (extent 0: nothing past them must survive) →
        its seconds when `timed` (finished on the device first), else None."""
        start = time.perf_counter()
        prefill_rows(self.model, self.cache, self.state, rows, starts, ends, self.config.prefill_chunk,
                     features=self.state.features, extent=0, graphs=graphs)
        self.prefill_tokens += sum(max(e - s, 0) for s, e in zip(starts, ends))
        if not timed or not self.drafter_cached:
            return None
        if self.device.type == "cuda":  # (the target's prefill alone: a bound on what the drafter's feed costs)
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def prefill_drafter(self, rows: slice, starts: list[int], ends: list[int], graphs=None,
                        timed: bool = False) -> float:
        """A cached drafter fed rows' positions [starts, ends) of fresh rows → its seconds (synchronized when timed)."""
        start = time.perf_counter()
        self.drafter.prefill(self.state, rows, starts, ends, self.config.prefill_chunk, extent=0, graphs=graphs)
        self.prefill_tokens += sum(max(e - s, 0) for s, e in zip(starts, ends))
        if timed and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def feed(self, target: list, drafter: list) -> float:
        """Prompt feeds outside a step (`prefill.ChunkBudget.groups`: rows, starts, ends): the target's ragged (the rest
        of a prompt left filling when nothing runs, `prefill.prefill_rest`), then a cached drafter's (a mixed step's
        feed, `prefill.finish_mixed`), each finished on the device → the `time.perf_counter()` between the two."""
        cuda = self.device.type == "cuda"
        for rows, starts, ends in target:
            prefill_ragged(self.model, self.cache, self.state, rows, starts, ends, self.config.prefill_chunk,
                           features=self.state.features)
        if target and cuda:  # (timed apart: the drafter's share of the same prompts' cost, for the policy)
            torch.cuda.synchronize(self.device)
        middle = time.perf_counter()
        if drafter:
            ragged = getattr(self.drafter, "prefill_ragged", None)  # (the engine's model drafter and heads)
            for rows, starts, ends in drafter:
                (ragged or self.drafter.prefill)(self.state, rows, starts, ends, self.config.prefill_chunk, extent=0)
            if cuda:
                torch.cuda.synchronize(self.device)
        self.prefill_tokens += sum(e - s for group in target + drafter for s, e in zip(group[1], group[2]))
        return middle

    @property
    def drafter_ragged(self) -> bool:
        """Whether the drafter feeds rows from their own offsets (`prefill_ragged`)."""
        return getattr(self.drafter, "prefill_ragged", None) is not None

    def catch_up(self, plan) -> None:
        """A cached drafter fed what the scheduler's `CatchUp` says (rows of different lengths lag at different
        offsets: ragged where the drafter can, each row from its own start)."""
        feed = getattr(self.drafter, "prefill_ragged", None) or self.drafter.prefill
        feed(self.state, plan.rows, plan.starts, plan.ends, self.config.prefill_chunk, extent=plan.extent)
        self.prefill_tokens += plan.tokens

    # ------------------------------------------------------------------------------------------- counters
    def counters(self, slots: list[int]) -> list[list[float]]:
        """The acceptance counters of these slots (one host read)."""
        return self.state.counters[slots].tolist()

    def take_counter_sums(self) -> tuple[list[float], list[float]]:
        """The engine-wide counter sums of chain and token-tree steps, zeroed after the read."""
        values, trees = self.counter_sums.tolist(), self.tree_counter_sums.tolist()
        self.zero_counter_sums()
        return values, trees

    def zero_counter_sums(self) -> None:
        with torch.inference_mode():  # the engine's tensors are inference tensors
            self.counter_sums.zero_()
            self.tree_counter_sums.zero_()

    def row_sums(self, n: int) -> list[tuple[float, float, float]]:
        """Rows 0..n−1's (Σβ, verified positions, steps that drafted) from the running counters (a host read)."""
        gamma = self.max_draft_tokens
        beta, drafting = StepCounts.column("beta_sum", gamma), StepCounts.column("drafting_rows", gamma)
        reached = StepCounts.positions("reached", gamma)
        counters = self.state.counters[:n]
        if n <= 16:  # few rows: read them whole; many: sum on the device first
            return [(v[beta], sum(v[reached]), v[drafting]) for v in counters.tolist()]
        return torch.stack([counters[:, beta], counters[:, reached].sum(1), counters[:, drafting]], 1).tolist()
