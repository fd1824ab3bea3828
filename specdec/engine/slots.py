"""Per-slot state of the engine: each running request owns one slot (a row) of every tensor here.

Running requests always occupy slots 0..n-1 (a finished request's slot is refilled by moving the last
running request into it), so a decode step over a batch bucket b works on the views `[:b]`: contiguous,
fixed addresses, hence capturable once per shape. Rows n..b-1 of a bucket are idle padding.

  SlotCache  one model's K/V for every slot `[L, max_batch, H_kv, S, D]` and its write positions `[max_batch]`
  SlotState  committed tokens and each request's parameters, on the device, and the running sums of its
             acceptance counters (`step.StepCounts` laid out at the largest γ; read when the request ends);
             for feature drafters also the target's final-normed hidden state at each committed position
             (`features`)
"""

from __future__ import annotations

import functools
import math

import torch

from specdec.core import FILTERS
from specdec.core.processors import (
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    ProcessorRows,
    TokenHistory,
    bias_row,
    words_tensor,
)
from specdec.engine.features import FeatureStore
from specdec.fast.graphs import CapturedStep, new_pool
from specdec.fast.model import FastLlama, KVCache
from specdec.request import SamplingParams

__all__ = ["SlotCache", "SlotState", "MAX_EOS_IDS", "MIN_POSITIONS", "PrefillGraphs", "chunk_shapes", "prefill_rows",
           "prefill_ragged", "positions_bucket", "to_device"]

MAX_EOS_IDS = 16  # EOS ids one request may name
MIN_POSITIONS = 64  # the smallest positions bucket a forward attends over


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class SlotCache:
    """K/V of one model for every slot; a view over the first b slots and S positions is a `KVCache`.

    Sized at construction, allocated by `allocate()` (the engine first checks the bytes of all its caches against
    free memory, `engine.memory`) or at the first use of `keys` / `values`."""

    def __init__(self, model: FastLlama, max_batch: int, num_positions: int):
        s = model.shape
        self.num_positions = _round_up(num_positions, 16)
        self.size = (s.n_layers, max_batch, s.n_kv_heads, self.num_positions, s.head_dim)
        self.model, self._device, self._dtype = model, model.device, model.dtype
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.lengths = torch.zeros(max_batch, dtype=torch.long, device=model.device)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values (allocated or not)."""
        return 2 * math.prod(self.size) * torch.empty((), dtype=self._dtype).element_size()

    def allocate(self) -> None:
        if self._keys is None:
            self._keys = torch.zeros(self.size, device=self._device, dtype=self._dtype)
            self._values = torch.zeros(self.size, device=self._device, dtype=self._dtype)

    @property
    def keys(self) -> torch.Tensor:
        """`[L, max_batch, H_kv, S, D]`."""
        self.allocate()
        return self._keys

    @property
    def values(self) -> torch.Tensor:
        self.allocate()
        return self._values

    def view(self, rows: slice, num_positions: int) -> KVCache:
        """Slots `rows` over the first `num_positions` positions (the last of them is the junk slot)."""
        # (one slice, then unbind: a few host calls instead of three per layer and tensor)
        return KVCache(
            list(self.keys[:, rows, :, :num_positions].unbind(0)),
            list(self.values[:, rows, :, :num_positions].unbind(0)),
            self.lengths[rows],
        )

    def move(self, src: int, dst: int, num_positions: int) -> None:
        self.keys[:, dst, :, :num_positions].copy_(self.keys[:, src, :, :num_positions])
        self.values[:, dst, :, :num_positions].copy_(self.values[:, src, :, :num_positions])
        self.lengths[dst] = self.lengths[src]

    def swap(self, a: int, b: int, num_positions: int) -> None:
        """Exchange slots `a` and `b` over their first `num_positions` positions (a prefilling request and the one
        whose slot it takes, `engine.prefill`)."""
        for tensor in (self.keys, self.values):
            held = tensor[:, a, :, :num_positions].clone()
            tensor[:, a, :, :num_positions].copy_(tensor[:, b, :, :num_positions])
            tensor[:, b, :, :num_positions].copy_(held)
        self.lengths[[a, b]] = self.lengths[[b, a]]


class SlotState:
    """Committed tokens `[max_batch, capacity]`, lengths, budgets and sampling parameters per slot."""

    def __init__(self, max_batch: int, capacity: int, device: torch.device, counter_width: int = 5):
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.tokens = zeros(max_batch, capacity)
        self.lengths = zeros(max_batch).fill_(1)  # idle slots hold one token so every gather stays in range
        self.generated = zeros(max_batch)
        self.max_new = zeros(max_batch)
        self.active = zeros(max_batch, dtype=torch.bool)
        self.temperature = zeros(max_batch, dtype=torch.float32)
        self.leniency = zeros(max_batch, dtype=torch.float32).fill_(1.0)  # l per row (1 = exact; appendix A.5)
        for f in FILTERS:  # one tensor per sampling filter, named after it (state.top_k, state.top_p, …)
            setattr(self, f.name, zeros(max_batch, dtype=torch.long if f.integer else torch.float32).fill_(f.off))
        self.seed = zeros(max_batch)
        self.eos = zeros(max_batch, MAX_EOS_IDS).fill_(-1)
        self.counters = zeros(max_batch, counter_width, dtype=torch.float64)  # Σ over the request's steps
        self.features: torch.Tensor | None = None  # [max_batch, capacity, dim], see `enable_features`
        self._fields = ("tokens", "lengths", "generated", "max_new", "active", "temperature", "leniency",
                        *(f.name for f in FILTERS), "seed", "eos", "counters")
        self.processors: ProcessorRows | None = None  # per-slot processor parameters, see `enable_processors`
        self.history: TokenHistory | None = None

    def enable_processors(self, vocab: int) -> None:
        """Keep per-slot logits-processor state (`core.processors`), allocated when the first request asking for
        processors arrives: parameters (`processors`, stop ids = `eos`) and the committed text's `history`
        (prompt tokens `[max_batch, V]` bool, output counts `[max_batch, V]` float32, generated = `generated`),
        updated by the verify pass with the committed tokens only, so a rejection rolls nothing back."""
        if self.processors is not None:
            return
        batch, device = self.tokens.shape[0], self.tokens.device
        rows = ProcessorRows.uniform(batch, vocab, device)
        self.processors = ProcessorRows(rows.repetition, rows.frequency, rows.presence, rows.min_tokens, self.eos,
                                        torch.zeros(batch, vocab, dtype=torch.float32, device=device),
                                        torch.zeros(batch, dtype=torch.long, device=device),
                                        torch.full((batch, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, dtype=torch.long,
                                                   device=device))
        self.history = TokenHistory(torch.zeros(batch, vocab, dtype=torch.bool, device=device),
                                    torch.zeros(batch, vocab, dtype=torch.float32, device=device), self.generated)

    def _processor_tensors(self) -> list[torch.Tensor]:
        if self.processors is None:
            return []
        p, h = self.processors, self.history
        return [p.repetition, p.frequency, p.presence, p.min_tokens, p.bias, p.ngram, p.words, h.prompt_seen, h.counts]

    def _admit_processors(self, rows: slice, tokens: torch.Tensor, lengths: torch.Tensor,
                          params: list[SamplingParams]) -> None:
        """Write the admitted rows' processor parameters and prompt history (off values for rows without)."""
        p, h = self.processors, self.history
        device = tokens.device
        values = to_device([[q.repetition_penalty, q.frequency_penalty, q.presence_penalty, float(q.min_tokens),
                             float(q.no_repeat_ngram_size)] for q in params], device, torch.float32)
        p.repetition[rows], p.frequency[rows], p.presence[rows] = values[:, 0], values[:, 1], values[:, 2]
        p.min_tokens[rows], p.ngram[rows] = values[:, 3].long(), values[:, 4].long()
        p.words[rows] = words_tensor([q.bad_words_ids for q in params], device, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS)
        vocab = p.bias.shape[1]
        p.bias[rows] = torch.stack([bias_row(vocab, q.logit_bias, q.allowed_token_ids) for q in params]).to(device)
        valid = torch.arange(tokens.shape[1], device=device)[None, :] < lengths[:, None]
        seen = torch.zeros(len(params), vocab + 1, dtype=torch.bool, device=device)
        seen.scatter_(1, torch.where(valid, tokens, torch.full_like(tokens, vocab)), True)
        h.prompt_seen[rows] = seen[:, :vocab]
        h.counts[rows] = 0

    def enable_features(self, dim: int, dtype: torch.dtype, pool=None) -> None:
        """Keep the target's features (`engine.features.FeatureStore`, `feature_store`; static `[max_batch, capacity,
        dim]`, or over a `kv_pool.KVPool`'s blocks): row b holds them at positions [0, lengths[b] − 1) (the last
        committed token's comes with the next verify pass). `features` is the store's tensor."""
        if self.features is None:
            self.feature_store = FeatureStore(*self.tokens.shape, dim, dtype, self.tokens.device, pool)
            self.features = self.feature_store.data
            if pool is None:  # (static: it moves with the slot; paged: the table moves)
                self._fields = (*self._fields, "features")

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def admit(self, slot: int, prompt: list[int], params: SamplingParams, seed: int) -> None:
        self.admit_rows(slot, [prompt], [params], [seed])

    def admit_rows(self, first: int, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int]) -> None:
        """`admit` for slots first, first + 1, ...: the same writes, with two host→device transfers for them all
        (and no host synchronization on CUDA) instead of a dozen small writes and blocking copies per request."""
        n = len(prompts)
        if n == 0:
            return
        rows, device = slice(first, first + n), self.tokens.device
        longest = max(len(p) for p in prompts)
        int_filters = [f.name for f in FILTERS if f.integer]
        float_filters = [f.name for f in FILTERS if not f.integer]
        ints = [p + [0] * (longest - len(p)) + [len(p), q.max_new_tokens, seed]
                + list(q.eos_token_ids) + [-1] * (MAX_EOS_IDS - len(q.eos_token_ids))
                + [getattr(q, name) for name in int_filters]
                for p, q, seed in zip(prompts, params, seeds)]
        ints = to_device(ints, device)  # [n, longest + 3 + MAX_EOS_IDS + integer filters]
        floats = to_device([[float(q.temperature), float(q.leniency)] + [float(getattr(q, name)) for name in float_filters]
                            for q in params], device, torch.float32)
        self.tokens[rows].zero_()
        self.tokens[rows, :longest] = ints[:, :longest]
        self.lengths[rows] = ints[:, longest]
        self.max_new[rows] = ints[:, longest + 1]
        self.seed[rows] = ints[:, longest + 2]
        at = longest + 3 + MAX_EOS_IDS
        self.eos[rows] = ints[:, longest + 3 : at]
        for i, name in enumerate(int_filters):
            getattr(self, name)[rows] = ints[:, at + i]
        self.temperature[rows] = floats[:, 0]
        self.leniency[rows] = floats[:, 1]
        for i, name in enumerate(float_filters):
            getattr(self, name)[rows] = floats[:, 2 + i]
        self.generated[rows] = 0
        self.active[rows] = True
        self.counters[rows] = 0
        if self.processors is not None:
            self._admit_processors(rows, ints[:, :longest], ints[:, longest], params)

    def move(self, src: int, dst: int) -> None:
        for tensor in [getattr(self, name) for name in self._fields] + self._processor_tensors():
            tensor[dst] = tensor[src]

    def swap(self, a: int, b: int) -> None:
        for tensor in [getattr(self, name) for name in self._fields] + self._processor_tensors():
            tensor[[a, b]] = tensor[[b, a]]

    def clear(self, slot: int) -> None:
        self.active[slot] = False
        self.lengths[slot] = 1
        self.generated[slot] = 0


def positions_bucket(end: int, num_positions: int) -> int:
    """The positions a forward attends over when every entry that matters lies below `end`: a power of two ≥ 64
    and > `end` (its last position, the junk slot, lies beyond them all), at most `num_positions`."""
    return min(max(MIN_POSITIONS, 1 << max(end, 0).bit_length()), num_positions)


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list (nested: rectangular) as a tensor on `device`, without a host synchronization on CUDA
    (staged in pinned memory; PyTorch's host allocator keeps the buffer until the copy has run)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class PrefillGraphs:
    """Prefill chunks replayed as CUDA graphs (opt-in, see `prefill_rows`): outside graphs an eager forward costs
    the host one launch per kernel, hundreds per chunk. A chunk — its tensors (cache, state, features, embeds'
    owner) and shape (rows, first column, width bucket, positions span) — seen `after` times runs eagerly; at the
    next sighting it is captured (with its own static copy of the rows' bounds) and every later one replays. The
    rows are not padded to a bucket: a graph runs exactly the GEMM and attention shapes of the eager forward, so
    the same kernels. What `embeds` reads must be static tensors too (the feature drafter's are the engine's).
    One memory pool for all (replayed one at a time); past `limit` graphs, new chunk shapes run eagerly."""

    def __init__(self, after: int = 1, limit: int = 256):
        self.after, self.limit = after, limit
        self.graphs: dict[tuple, tuple] = {}
        self.seen: dict[tuple, int] = {}
        self._pool = None

    def run(self, key: tuple, body, bounds: torch.Tensor, lengths: torch.Tensor) -> None:
        """body(bounds) once, eager or as the graph of `key`; `lengths` (the cache's) is restored around capture."""
        entry = self.graphs.get(key)
        if entry is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= self.after or len(self.graphs) >= self.limit:
                body(bounds)
                return
            if self._pool is None:
                self._pool = new_pool()
            static = bounds.clone()
            entry = self.graphs[key] = (CapturedStep(lambda: body(static), pool=self._pool, restore=[lengths]), static)
        graph, static = entry
        static.copy_(bounds)
        graph.replay()


def _prefill_chunk(model: FastLlama, view: KVCache, state: SlotState, rows: slice, first: int, bucket: int,
                   features: torch.Tensor | None, embeds, causal: bool, bounds: torch.Tensor) -> None:
    """One chunk of `prefill_rows`: columns [first, first + bucket) of the rows, bounds `[2, b]` (starts; ends).
    causal: every row starts at 0 and this is the first chunk (`FastLlama.forward`'s `causal_prefix`)."""
    cols = first + torch.arange(bucket, device=bounds.device)[None, :]
    valid = (cols >= bounds[0][:, None]) & (cols < bounds[1][:, None])
    tokens = None if embeds is not None else state.tokens[rows, first : first + bucket] * valid
    vectors = None if embeds is None else embeds(rows, first, bucket)
    want = features is not None
    # eager forwards on the reference kernels: launched one by one from Python, a fused Triton layer costs the
    # host more than cuBLAS/SDPA do (measured on an H200: ~10 ms per request at batch 1); decode steps, replayed
    # as CUDA graphs, run the fused kernels
    _, hidden = model(tokens, view, valid, embeds=vectors, last_only=not want, return_hidden=True,
                      compute_logits=False, kernels="reference", causal_prefix=causal)
    if want:
        _store(state, features).write(rows, cols.expand(valid.shape[0], -1), hidden, valid)


def _store(state: SlotState, features: torch.Tensor) -> FeatureStore:
    """Where prefill writes `features`: the state's store, or a static one over another tensor (tests)."""
    return state.feature_store if features is state.features else FeatureStore.over(features)


def chunk_shapes(starts: list[int], ends: list[int], chunk: int, extent: int | None, capacity: int,
                 num_positions: int) -> list[tuple[int, int, int]]:
    """The forwards `prefill_rows` runs to feed [starts[i], ends[i]): (first column, width bucket, positions span)
    per chunk that feeds anything (see `prefill_rows` for extent; capacity: the state's columns)."""
    fed = [(s, e) for s, e in zip(starts, ends) if e > s]
    if not fed:
        return []
    lo, hi = min(s for s, _ in fed), max(ends)  # rows that feed nothing (a catch-up's others) do not move lo
    floor = max(max(starts), extent) if extent is not None else None  # positions that must survive lie below
    shapes = []
    for first in range(lo, hi, chunk):
        width = min(chunk, hi - first)
        if not any(s < first + width and e > first for s, e in fed):  # no row feeds a position of this chunk
            continue
        bucket = min(max(16, 1 << (width - 1).bit_length()), chunk, capacity - first)
        span = num_positions if floor is None else positions_bucket(max(floor, first + width), num_positions)
        shapes.append((first, bucket, span))
    return shapes


def prefill_rows(model: FastLlama, cache: SlotCache, state: SlotState, rows: slice, starts: list[int],
                 ends: list[int], chunk: int, *, features: torch.Tensor | None = None, embeds=None,
                 extent: int | None = None, graphs: PrefillGraphs | None = None) -> None:
    """Feed committed positions [starts[i], ends[i]) of the slots in `rows` into `cache` (eager, chunked).

    features (optional: `state.features`): also store the model's final-normed hidden state at each fed position
    in the state's `FeatureStore`. embeds (optional): `embeds(rows, first, width) -> [b, width, dim]`, the input
    vectors of positions [first, first + width) in place of the token embeddings (feature drafters).
    extent (optional): no row of `rows` holds an entry at a position ≥ extent that must survive, beside those
    fed here (0 for freshly admitted rows). Each chunk then attends over a power-of-two bucket of positions
    past everything that matters (`positions_bucket`), whose last position is the chunk's junk slot; None =
    unknown: every chunk attends over the whole cache (its junk slot is the cache's last position). The
    span changes which masked-out positions attention reads, never a result.
    graphs (optional, CUDA): replay chunk shapes seen before as CUDA graphs (`PrefillGraphs`).

    Several requests admitted together prefill in one forward per chunk. Each chunk is padded to a power of
    two (padding goes to the junk slot), so prompts of any length run a handful of shapes: no new kernels
    or allocations for a new prompt length. No host synchronization: the chunks to run are known on the host.
    """
    shapes = chunk_shapes(starts, ends, chunk, extent, state.tokens.shape[1], cache.num_positions)
    if not shapes:
        return
    bounds = to_device([starts, ends], state.tokens.device)  # one transfer: [2, b]
    cache.lengths[rows].copy_(bounds[0])
    fresh = not any(starts)  # every row fed from position 0: its first chunk attends causally, with no mask
    for first, bucket, span in shapes:
        view = cache.view(rows, span)
        causal = fresh and first == 0
        body = functools.partial(_prefill_chunk, model, view, state, rows, first, bucket, features, embeds, causal)
        if graphs is None:
            body(bounds)
        else:
            # the tensors by address (a graph holds them, so no address is reused while it lives) and the shape
            key = (cache.keys.data_ptr(), state.tokens.data_ptr(), 0 if features is None else features.data_ptr(),
                   0 if embeds is None else id(getattr(embeds, "__self__", embeds)), rows.start, rows.stop, first,
                   bucket, span, causal)
            graphs.run(key, body, bounds, cache.lengths)


def prefill_ragged(model: FastLlama, cache: SlotCache, state: SlotState, rows: slice, starts: list[int],
                   ends: list[int], chunk: int, *, features: torch.Tensor | None = None, embeds=None,
                   extent: int | None = None) -> None:
    """`prefill_rows` with each row's columns counted from its own start: chunk c of row i feeds positions
    [starts[i] + c·chunk, ...) up to ends[i], so a forward computes rows × (the longest feed, padded to a power of
    two), not rows × (last end − first start): rows fed at different offsets (chunked prefill's filling requests,
    a catch-up of rows of different lengths) share a forward without computing the columns between them. Eager.
    embeds (optional): `embeds(rows, cols) -> [b, width, dim]`, the input vectors at positions `cols [b, width]`.
    Every chunk attends over a power-of-two span past max(ends) and `extent` (no row holds an entry at or past it
    that must survive; None: past max(ends) alone, which holds when every row's entries lie below its start)."""
    takes = [max(e - s, 0) for s, e in zip(starts, ends)]
    longest = max(takes, default=0)
    if not longest:
        return
    device, capacity = state.tokens.device, state.tokens.shape[1]
    bounds = to_device([starts, ends], device)  # one transfer: [2, b]
    cache.lengths[rows].copy_(bounds[0])
    view = cache.view(rows, positions_bucket(max(max(ends), extent or 0), cache.num_positions))
    tokens = state.tokens[rows]
    for rel in range(0, longest, chunk):
        bucket = min(max(16, 1 << (min(chunk, longest - rel) - 1).bit_length()), chunk)
        cols = bounds[0][:, None] + rel + torch.arange(bucket, device=device)[None, :]  # [b, bucket] per row
        valid = cols < bounds[1][:, None]
        at = cols.clamp(max=capacity - 1)  # (past the state: padding, never valid — ends < capacity)
        vectors = None if embeds is None else embeds(rows, at)
        _, hidden = model(None if embeds is not None else tokens.gather(1, at) * valid, view, valid, embeds=vectors,
                          last_only=features is None, return_hidden=True, compute_logits=False, kernels="reference")
        if features is not None:  # the fed positions take the hidden states
            _store(state, features).write(rows, at, hidden, valid)
