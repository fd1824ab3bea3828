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

import torch

from specdec.fast.model import FastLlama, KVCache
from specdec.request import SamplingParams

__all__ = ["SlotCache", "SlotState", "MAX_EOS_IDS", "prefill_rows"]

MAX_EOS_IDS = 16  # EOS ids one request may name


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class SlotCache:
    """K/V of one model for every slot; a view over the first b slots and S positions is a `KVCache`."""

    def __init__(self, model: FastLlama, max_batch: int, num_positions: int):
        s = model.shape
        self.num_positions = _round_up(num_positions, 16)
        size = (s.n_layers, max_batch, s.n_kv_heads, self.num_positions, s.head_dim)
        self.keys = torch.zeros(size, device=model.device, dtype=model.dtype)
        self.values = torch.zeros(size, device=model.device, dtype=model.dtype)
        self.lengths = torch.zeros(max_batch, dtype=torch.long, device=model.device)

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def view(self, rows: slice, num_positions: int) -> KVCache:
        """Slots `rows` over the first `num_positions` positions (the last of them is the junk slot)."""
        layers = range(self.keys.shape[0])
        return KVCache(
            [self.keys[i, rows, :, :num_positions] for i in layers],
            [self.values[i, rows, :, :num_positions] for i in layers],
            self.lengths[rows],
        )

    def move(self, src: int, dst: int, num_positions: int) -> None:
        self.keys[:, dst, :, :num_positions].copy_(self.keys[:, src, :, :num_positions])
        self.values[:, dst, :, :num_positions].copy_(self.values[:, src, :, :num_positions])
        self.lengths[dst] = self.lengths[src]


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
        self.top_k = zeros(max_batch)
        self.top_p = zeros(max_batch, dtype=torch.float32).fill_(1.0)
        self.seed = zeros(max_batch)
        self.eos = zeros(max_batch, MAX_EOS_IDS).fill_(-1)
        self.counters = zeros(max_batch, counter_width, dtype=torch.float64)  # Σ over the request's steps
        self.features: torch.Tensor | None = None  # [max_batch, capacity, dim], see `enable_features`
        self._fields = ("tokens", "lengths", "generated", "max_new", "active", "temperature", "top_k", "top_p",
                        "seed", "eos", "counters")

    def enable_features(self, dim: int, dtype: torch.dtype) -> None:
        """Keep the target's features `[max_batch, capacity, dim]`: row b holds them at positions
        [0, lengths[b] − 1) (the last committed token's comes with the next verify pass)."""
        if self.features is None:
            self.features = torch.zeros(*self.tokens.shape, dim, dtype=dtype, device=self.tokens.device)
            self._fields = (*self._fields, "features")

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def admit(self, slot: int, prompt: list[int], params: SamplingParams, seed: int) -> None:
        device = self.tokens.device
        self.tokens[slot].zero_()
        self.tokens[slot, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
        self.lengths[slot] = len(prompt)
        self.generated[slot] = 0
        self.max_new[slot] = params.max_new_tokens
        self.active[slot] = True
        self.temperature[slot] = float(params.temperature)
        self.top_k[slot] = params.top_k
        self.top_p[slot] = float(params.top_p)
        self.seed[slot] = seed
        self.eos[slot] = -1
        self.counters[slot] = 0
        if params.eos_token_ids:
            self.eos[slot, : len(params.eos_token_ids)] = torch.tensor(params.eos_token_ids, device=device)

    def move(self, src: int, dst: int) -> None:
        for name in self._fields:
            tensor = getattr(self, name)
            tensor[dst] = tensor[src]

    def clear(self, slot: int) -> None:
        self.active[slot] = False
        self.lengths[slot] = 1
        self.generated[slot] = 0


def prefill_rows(model: FastLlama, cache: SlotCache, state: SlotState, rows: slice, starts: list[int],
                 ends: list[int], chunk: int, *, features: torch.Tensor | None = None, embeds=None) -> None:
    """Feed committed positions [starts[i], ends[i]) of the slots in `rows` into `cache` (eager, chunked).

    features `[max_batch, capacity, dim]` (optional): also store the model's final-normed hidden state at
    each fed position there. embeds (optional): `embeds(rows, first, width) -> [b, width, dim]`, the input
    vectors of positions [first, first + width) in place of the token embeddings (feature drafters).

    Several requests admitted together prefill in one forward per chunk. Each chunk is padded to a power of
    two (padding goes to the junk slot), so prompts of any length run a handful of shapes: no new kernels
    or allocations for a new prompt length.
    """
    if max(e - s for s, e in zip(starts, ends)) <= 0:
        return
    view = cache.view(rows, cache.num_positions)
    device = state.tokens.device
    start_t = torch.tensor(starts, device=device)[:, None]
    end_t = torch.tensor(ends, device=device)[:, None]
    view.lengths.copy_(start_t[:, 0])
    capacity = state.tokens.shape[1]
    lo, hi = min(starts), max(ends)
    for first in range(lo, hi, chunk):
        width = min(chunk, hi - first)
        bucket = min(max(16, 1 << (width - 1).bit_length()), chunk, capacity - first)
        cols = first + torch.arange(bucket, device=device)[None, :]
        valid = (cols >= start_t) & (cols < end_t)
        if not bool(valid.any()):
            continue
        tokens = None if embeds is not None else state.tokens[rows, first : first + bucket] * valid
        vectors = None if embeds is None else embeds(rows, first, bucket)
        want = features is not None
        # eager forwards on the reference kernels: launched one by one from Python, a fused Triton layer costs the
        # host more than cuBLAS/SDPA do (measured on an H200: ~10 ms per request at batch 1); decode steps, replayed
        # as CUDA graphs, run the fused kernels
        _, hidden = model(tokens, view, valid, embeds=vectors, last_only=not want, return_hidden=True,
                          compute_logits=False, kernels="reference")
        if want:
            block = features[rows, first : first + bucket]
            block.copy_(torch.where(valid[..., None], hidden.to(block.dtype), block))
