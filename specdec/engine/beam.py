"""Speculative beam search on the engine: a beam request is a *beam group* of w slots (the engine's `Beams`).

    engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=64, eos_token_ids=eos),
                       beams=BeamParams(num_beams=4, draft_beams=4, num_draft_tokens=3))

The result is transformers' `generate(num_beams=w, do_sample=False)` (its rules: `search.beam_rules`), as the transformers path's
`beam_search` gives it: the group runs `search.beam.BeamSearch` — draft (the drafter's beam search of width
u for γ levels), verify (ONE target tree pass over the group's w rows), accept (the `beam_rules` replay), commit
(beams re-gathered from their roots + `commit_path`) — over `beam_slots.SlotTreeLM`, w rows of the engine's own
slot caches (target and draft model), so nothing of that search is spelled twice.

Slots. Chain requests fill slots 0..n−1 as always; beam groups take w consecutive slots from the top of the cache
down (the highest free run), and chain admission stops at the largest batch bucket below the lowest slot a group
holds or the next waiting group will take (`_chain_limit`), so a chain step's rows `[:bucket]` never reach a beam
row. A waiting group is admitted (before the chains of that step) once its run is free of chain buckets — and, on
the paged pool, once the blocks its rows may ever hold are free (`beam_blocks`: the prompt's blocks forked by table,
reorders as table edits, copy-on-write; the group is never preempted).

Step. Each `Engine.step` runs one pass of every running group *as its own forwards*, before the chains' step (which
is timed for the γ policy without it): beam groups and chain rows do not share a forward. Eager (no CUDA graphs;
the tree shape varies with how the draft beams spread over the roots), with the host reads `BeamSearch` makes.
A group reports once, when it finishes: a `BeamOutput` with the best beam as `new_token_ids` (and the
`num_return_sequences` best beams with their scores, and the search's `BeamStats`); the engine-wide
`engine.stats` (chain steps' `SpecStats`) does not count beam passes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specdec.engine.beam_blocks import BeamBlocks, group_blocks
from specdec.engine.beam_slots import SlotTreeLM
from specdec.engine.config import BATCH_BUCKETS, UnsupportedModel
from specdec.fast.kernels.attention import MAX_TREE_SLOTS
from specdec.search.beam import MAX_BEAMS, BeamSearch, BeamStats
from specdec.search.beam_rules import BeamConfig, BeamState
from specdec.metrics import SpecStats
from specdec.request import SamplingParams, as_int, check_num_draft_tokens
from specdec.step import RequestOutput

__all__ = ["BeamParams", "BeamOutput", "Beams"]


@dataclass(frozen=True)
class BeamParams:
    """A request's beam search, named as transformers names it (validated on construction; errors name the field).

    num_beams w; draft_beams u ≥ w (None = w); num_draft_tokens γ draft levels per target pass (None = 3 when the
    engine has a draft model, else 0 = plain beam search); length_penalty, early_stopping (True, False, "never") as
    in transformers; num_return_sequences ≤ w: the best beams (with scores) the final output carries."""

    num_beams: int = 4
    draft_beams: int | None = None
    num_draft_tokens: int | None = None
    length_penalty: float = 1.0
    early_stopping: "bool | str" = False
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        w = as_int(self.num_beams, "num_beams", minimum=1, maximum=MAX_BEAMS)
        object.__setattr__(self, "num_beams", w)
        if self.draft_beams is not None:
            object.__setattr__(self, "draft_beams", as_int(self.draft_beams, "draft_beams", minimum=w, maximum=MAX_BEAMS))
        if self.num_draft_tokens is not None:
            object.__setattr__(self, "num_draft_tokens", check_num_draft_tokens(self.num_draft_tokens, minimum=0))
        penalty = self.length_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty):
            raise ValueError(f"length_penalty must be a finite number, got {penalty!r}")
        object.__setattr__(self, "length_penalty", float(penalty))
        if not any(self.early_stopping is v for v in (True, False)) and self.early_stopping != "never":
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        object.__setattr__(self, "num_return_sequences",
                           as_int(self.num_return_sequences, "num_return_sequences", minimum=1, maximum=w))

    @property
    def width(self) -> int:
        """u, the drafter's beam width."""
        return self.num_beams if self.draft_beams is None else self.draft_beams


@dataclass(frozen=True)
class BeamOutput(RequestOutput):
    """A beam request's one (final) output: `new_token_ids` = the best beam (EOS included, as transformers returns
    it); `beams` / `beam_scores`: the `num_return_sequences` best, best first (scores = transformers'
    sequences_scores: Σ log p / length ** length_penalty); `beam_stats`: the search's passes and beam steps."""

    beams: tuple = ()
    beam_scores: tuple = ()
    beam_stats: BeamStats | None = None


@dataclass
class BeamGroup:
    """A running beam request: its slots [start, start + w) and its search state."""

    request_id: str
    params: SamplingParams
    beams: BeamParams
    arrival: float
    start: int
    search: BeamSearch
    state: BeamState
    stats: SpecStats = field(default_factory=SpecStats)
    blocks: BeamBlocks | None = None  # paged: its rows of the pool (`beam_blocks`)


class Beams:
    """The engine's beam groups (see the module doc): their queue and running groups, over the scheduler's request
    books (ids, aborts, the chain rows' slots) and the runner's models and caches, which it is given."""

    def __init__(self, scheduler, runner):
        self.scheduler, self.runner = scheduler, runner
        self._beam_waiting: deque = deque()  # (EngineRequest, BeamParams), in arrival order
        self._beam_groups: list[BeamGroup] = []

    # what the groups read of the scheduler (requests, slots) and of the runner (models, caches, sizes)
    _running = property(lambda self: self.scheduler.running)
    _filling = property(lambda self: self.scheduler.filling)
    _lock = property(lambda self: self.scheduler.lock)
    _aborted = property(lambda self: self.scheduler.aborted, lambda self, v: setattr(self.scheduler, "aborted", v))
    _known = property(lambda self: self.scheduler.known, lambda self, v: setattr(self.scheduler, "known", v))
    config, model, cache, drafter, drafter_cached = (property(lambda self, n=n: getattr(self.runner, n)) for n in (
        "config", "model", "cache", "drafter", "drafter_cached"))
    kv_pool = property(lambda self: self.scheduler.kv_pool)
    max_batch, vocab_size, num_positions = (property(lambda self, n=n: getattr(self.runner, n)) for n in (
        "max_batch", "vocab_size", "num_positions"))

    @property
    def has_unfinished(self) -> bool:
        return bool(self._beam_groups or self._beam_waiting)

    @property
    def num_beam_groups(self) -> int:
        """Beam requests running (each holds num_beams slots)."""
        return len(self._beam_groups)

    def _check_beams(self, params: SamplingParams, beams: BeamParams, prompt_length: int) -> int:
        """What a beam request needs of this engine (one line naming what is missing) → its γ."""
        from specdec.engine.drafters import EngineModelDrafter

        if not isinstance(beams, BeamParams):
            raise TypeError(f"beams must be a BeamParams, got {type(beams).__name__}")
        w = beams.num_beams
        if w > self.max_batch:
            raise ValueError(f"num_beams={w} needs {w} of the engine's slots; its max_batch_size is {self.max_batch}")
        refused = [(params.temperature != 0, f"temperature={params.temperature}: beam search is greedy "
                    "(transformers' do_sample=False); pass temperature=0"),
                   (params.draft_tree is not None, "draft_tree: beam search drafts its own beams, not a token tree"),
                   (params.leniency != 1.0, "leniency: beam search verifies exactly (leniency=1.0)"),
                   (bool(params.processors), f"{', '.join(params.processors)}: logits processors run on chains, "
                    "not on beam search"),
                   (params.logprobs or params.top_logprobs > 0, "logprobs: beam outputs carry beam scores, not "
                    "per-token log-probabilities"),
                   (self.config.bitwise, "beams: bitwise=True has no tree mask in its batch-invariant attention")]
        for bad, message in refused:
            if bad:
                raise ValueError(message)
        if any(self.model.shape.arch.window(i) is not None for i in range(self.model.shape.n_layers)):
            raise UnsupportedModel("beams: the target has sliding-window layers, which the engine's tree passes do "
                                   "not run")
        model_drafter = type(self.drafter) is EngineModelDrafter
        gamma = beams.num_draft_tokens if beams.num_draft_tokens is not None else (3 if model_drafter else 0)
        if gamma and not model_drafter:
            what = "no drafter" if self.drafter is None else f"a {type(self.drafter).__name__}"
            raise ValueError(f"num_draft_tokens={gamma}: speculative beams need a draft model, the engine has {what} "
                             "(num_draft_tokens=0 is plain beam search)")
        u = beams.width
        if gamma and u > self.vocab_size:
            raise ValueError(f"draft_beams ({u}) cannot exceed the vocabulary size ({self.vocab_size})")
        if u * gamma + 1 > MAX_TREE_SLOTS:
            raise ValueError(f"draft_beams × num_draft_tokens + 1 = {u * gamma + 1} exceeds the {MAX_TREE_SLOTS} "
                             "tree nodes a row's target pass holds")
        need = self._beam_positions(prompt_length, params.max_new_tokens, u * gamma)
        if need > self.num_positions:
            raise ValueError(f"prompt length {prompt_length} + max_new_tokens {params.max_new_tokens} + the draft "
                             f"tree's {u * gamma} nodes needs {need} cache positions; the engine has {self.num_positions}"
                             " (raise max_seq_len)")
        return gamma

    @staticmethod
    def _beam_positions(prompt_length: int, max_new_tokens: int, nodes: int) -> int:
        """Positions a row of the group may reach: its text, a tree pass's nodes past its last token, the junk slot."""
        return prompt_length + max_new_tokens + nodes + 2

    # --------------------------------------------------------------------------------------------- slots
    def _beam_run(self, width: int) -> int | None:
        """The highest start of `width` consecutive slots no beam group holds, or None."""
        held = [False] * self.max_batch
        for g in self._beam_groups:
            for s in range(g.start, g.start + g.beams.num_beams):
                held[s] = True
        for start in range(self.max_batch - width, -1, -1):
            if not any(held[start : start + width]):
                return start
        return None

    def _chain_limit(self) -> int:
        """Slots the chain rows may fill: all of them without beams; else the largest batch bucket at or below the
        lowest slot a beam group holds or the next waiting one would take (a chain step's rows [:bucket] must never
        reach a beam row)."""
        lowest = min([g.start for g in self._beam_groups], default=self.max_batch)
        if self._beam_waiting:
            start = self._beam_run(self._beam_waiting[0][1].num_beams)
            lowest = min(lowest, start if start is not None else lowest)
        if lowest >= self.max_batch:
            return self.max_batch
        return max([b for b in BATCH_BUCKETS if b <= lowest], default=0)

    def _chain_rows(self) -> int:
        """Slots a step over the running chain rows covers (its batch bucket, within the cache)."""
        n = max([len(self._running)] + [r.slot + 1 for r in self._filling])  # (chunked prefill: `engine.prefill`)
        return 0 if n == 0 else min(next(b for b in BATCH_BUCKETS if b >= n), self.max_batch)

    # ---------------------------------------------------------------------------------- admit, step, end
    def _queue_beams(self, request, beams: BeamParams) -> None:
        """(Under the engine's lock.) A validated beam request waits for its slots."""
        self._beam_waiting.append((request, beams))

    def _beam_aborts(self) -> list[RequestOutput]:
        """Cancelled beam requests leave their queue or slots (the rest of `_aborted` is `_handle_aborts`')."""
        if not self._aborted or not (self._beam_waiting or self._beam_groups):
            return []
        with self._lock:
            ids = {r.request_id for r, _ in self._beam_waiting} | {g.request_id for g in self._beam_groups}
            hit = self._aborted & ids
            if not hit:
                return []
            self._aborted -= hit
            self._known -= hit
            self._beam_waiting = deque(x for x in self._beam_waiting if x[0].request_id not in hit)
        for g in self._beam_groups:
            if g.request_id in hit and g.blocks is not None:
                g.blocks.release()
        self._beam_groups = [g for g in self._beam_groups if g.request_id not in hit]
        return [RequestOutput(rid, [], None, 0, 0, True, "abort") for rid in sorted(hit)]

    def _admit_beams(self, outputs: list[RequestOutput]) -> None:
        """Waiting beam requests, in order, into the highest free run of w slots above the chain rows' bucket."""
        while self._beam_waiting:
            request, beams = self._beam_waiting[0]
            if request.params.max_new_tokens == 0:
                with self._lock:
                    self._beam_waiting.popleft()
                    self._known.discard(request.request_id)
                outputs.append(BeamOutput(request.request_id, [], None, 0, 0, True, "length", request.stats,
                                          beams=((),), beam_scores=(0.0,), beam_stats=BeamStats()))
                continue
            start = self._beam_run(beams.num_beams)
            if start is None or start < self._chain_rows():
                return
            if self.kv_pool is not None and self._beam_stash(request, beams) > self.kv_pool.allocator.num_free_blocks:
                return  # (its blocks come free as requests leave)
            with self._lock:
                self._beam_waiting.popleft()
            self._beam_groups.append(self._start_group(request, beams, start))

    def _start_group(self, request, beams: BeamParams, start: int) -> BeamGroup:
        params, w = request.params, beams.num_beams
        gamma = self._check_beams(params, beams, len(request.prompt))
        u = beams.width
        need = self._beam_positions(len(request.prompt), params.max_new_tokens, u * gamma)
        chunk = self.config.prefill_chunk
        blocks = None
        if self.kv_pool is not None:  # every model's cache lives in the group's blocks
            caches = [self.cache] + ([self.drafter.cache] if self.drafter_cached else [])
            blocks = BeamBlocks(self.kv_pool, caches, start, w, len(request.prompt) - 1, need)
        lm = SlotTreeLM(self.model, self.cache, start, w, need, chunk, blocks)
        draft = SlotTreeLM(self.drafter.model, self.drafter.cache, start, w, need, chunk, blocks, owner=False) \
            if gamma else None
        config = BeamConfig(w, params.max_new_tokens, tuple(params.eos_token_ids), beams.length_penalty,
                            beams.early_stopping)
        search = BeamSearch(lm, draft, config, u, gamma)
        began = time.perf_counter()
        state = search.start([request.prompt])
        request.stats.add_prefill(time.perf_counter() - began, lm.begin_forward_passes)
        return BeamGroup(request.request_id, params, beams, request.arrival, start, search, state, request.stats,
                         blocks)

    def _beam_stash(self, request, beams: BeamParams) -> int:
        """Paged: the blocks a beam group takes at admission (`beam_blocks.group_blocks`)."""
        gamma = self._check_beams(request.params, beams, len(request.prompt))
        need = self._beam_positions(len(request.prompt), request.params.max_new_tokens, beams.width * gamma)
        return group_blocks(len(request.prompt) - 1, need, beams.num_beams, self.kv_pool.block_size)

    def _check_beam_pool(self, request_prompt_length: int, params: SamplingParams, beams: BeamParams) -> None:
        """Paged: a beam request whose group could never get its blocks is refused at `add_request`."""
        gamma = self._check_beams(params, beams, request_prompt_length)
        need = self._beam_positions(request_prompt_length, params.max_new_tokens, beams.width * gamma)
        blocks = group_blocks(request_prompt_length - 1, need, beams.num_beams, self.kv_pool.block_size)
        usable = self.kv_pool.allocator.num_usable_blocks
        if blocks > usable:
            raise ValueError(f"num_beams={beams.num_beams} over prompt length {request_prompt_length} + "
                             f"max_new_tokens {params.max_new_tokens} needs {blocks} KV blocks of "
                             f"{self.kv_pool.block_size} positions; the pool holds {usable} "
                             "(raise kv_cache_memory / --kv-cache-memory)")

    def _step_beams(self) -> list[RequestOutput]:
        """One pass of every running beam group (its own forwards); the groups that finished report and leave."""
        outputs, running = [], []
        for group in self._beam_groups:
            if not bool(group.state.done.all()):
                group.state = group.search.step(group.state)
            if bool(group.state.done.all()):
                outputs.append(self._finish_group(group))
                if group.blocks is not None:
                    group.blocks.release()
            else:
                running.append(group)
        self._beam_groups = running
        return outputs

    def _finish_group(self, group: BeamGroup) -> BeamOutput:
        beams, scores = BeamSearch.hypotheses(group.state, 0)
        best = beams[0]
        eos = set(group.params.eos_token_ids)
        reason = "stop" if best and best[-1] in eos else "length"
        search = group.search.stats
        stats = group.stats
        stats.set_wall_time(time.perf_counter() - group.arrival)
        search.set_wall_time(stats.wall_time_s)
        k = group.beams.num_return_sequences
        with self._lock:
            self._known.discard(group.request_id)
        return BeamOutput(group.request_id, best, None, max(search.beam_steps - search.passes, 0),
                          search.draft_nodes, True, reason, stats, beams=tuple(tuple(b) for b in beams[:k]),
                          beam_scores=tuple(scores[:k]), beam_stats=search)
