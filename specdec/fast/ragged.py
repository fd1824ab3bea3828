"""One forward over a ragged batch: rows with different numbers of new tokens (prefill chunks, decode and verify
rows) in one pass of a `FastLlama` over the paged KV pool — the runner's half of the mixed prefill/decode step.

Terms (`kernels.ragged_attention` has the attention's):
  row          one request's share of the pass: `tokens` (its new tokens, ≥ 1: a prefill chunk, or a decode /
               verify row's last committed token + γ drafts), `start` (positions already in its cache: its new
               token i sits at position start + i), `blocks` (its block table: position t in pool block
               blocks[t // block_size], offset t % block_size; `engine.kv_pool.KVPool.blocks[row]`) and
               `num_logits` (how many of its last positions the pass scores: a verify row all 1 + γ, a final
               prefill chunk 1, a middle chunk 0)
  flat tokens  the rows' tokens in row order, `[N]`; `query_start [B + 1]` their prefix sum (cu_seqlens)
  slot_mapping `[N]`: each token's flat pool entry (block · block_size + offset), where its K/V are written
  logits_index `[M]`: the flat tokens scored, row by row; `logits_start [B + 1]` (host) splits `[M, V]` into rows

`forward_ragged(model, batch, cache)` runs the model's own eager layers (`LlamaLayers._eager_layers`: embedding
scale, learned positions, norms, the GEMM path incl. the bitwise one, RoPE at each token's own position, MLP,
sandwich norms, parallel residuals) over the `[N, dim]` tokens; each layer writes its K/V through the slot mapping
and attends by `ragged_attention` (the Triton varlen kernel on CUDA, torch by groups of rows on CPU; windows and
soft-caps per layer). Only the wanted positions reach the final norm and the LM head. The pass never reads or
moves the cache's `lengths` (a `PagedKVCache`'s table and lengths are the static-shape forward's; here the batch
carries both): the scheduler commits what the pass accepted. No host sync once the batch is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from specdec.fast.kernels.ragged_attention import RaggedLayout, ragged_attention
from specdec.fast.kernels.select import check_kernel
from specdec.fast.model import FastLlama
from specdec.fast.quant.weight import embedding

__all__ = ["RaggedRow", "RaggedBatch", "forward_ragged", "covers"]


@dataclass(frozen=True)
class RaggedRow:
    """One row of a ragged pass (see the module doc): tokens, start, blocks, num_logits."""

    tokens: Sequence[int]
    start: int
    blocks: Sequence[int]
    num_logits: int


def _int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (
            isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if int(value) < low:
        raise ValueError(f"{name} must be >= {low}, got {int(value)}")
    return int(value)


def _ids(values: list, where) -> torch.Tensor:
    """Non-negative ints as a CPU long tensor (one conversion for the whole batch), or an error naming the argument:
    `where(i)` names entry i's row."""
    try:
        ids = torch.tensor(values)
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is None or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        entries = [v for row in values for v in row] if values and isinstance(values[0], list) else values
        bad = next((i for i, v in enumerate(entries) if isinstance(v, bool) or not isinstance(v, int)), 0)
        raise TypeError(f"{where(bad)} must hold ints, got {entries[bad]!r}")
    ids = ids.long().flatten()
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"{where(int((ids < 0).nonzero()[0]))} holds a negative id ({int(ids.min())})")
    return ids


@dataclass(frozen=True)
class RaggedBatch:
    """A ragged pass's inputs on the device, built by `from_rows` (which checks them). Shapes: B rows, N tokens, M
    scored positions, W = table width.

    tokens        `[N]` long         query_start  `[B + 1]` int32     starts  `[B]` long (cached lengths)
    positions     `[N]` long         block_table  `[B, W]` int32 (null block 0 past a row's blocks)
    slot_mapping  `[N]` long         logits_index `[M]` long
    counts, start_positions, num_logits, logits_start: the same on the host (tuples); block_size; max_block
    (the largest block id named, for the pool's check); layout: what the attention reads; hidden_index
    (optional): the flat tokens whose hidden states `forward_ragged(return_hidden=True)` returns.
    """

    tokens: torch.Tensor
    query_start: torch.Tensor
    starts: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    logits_index: torch.Tensor
    counts: tuple[int, ...]
    start_positions: tuple[int, ...]
    num_logits: tuple[int, ...]
    logits_start: tuple[int, ...]
    block_size: int
    max_block: int
    max_token: int
    layout: RaggedLayout
    hidden_index: torch.Tensor | None = None  # `[H]` long: the flat tokens whose hidden states `return_hidden`
    # gives (None: the scored ones, logits_index) — a mixed step's prefill chunks feed a feature head's store

    @property
    def num_rows(self) -> int:
        return len(self.counts)

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    def row_logits(self, logits: torch.Tensor, row: int) -> torch.Tensor:
        """Row `row`'s share `[num_logits[row], V]` of the pass's logits `[M, V]`."""
        return logits[self.logits_start[row] : self.logits_start[row + 1]]

    @classmethod
    def from_rows(cls, rows: Sequence[RaggedRow], *, block_size: int, device: torch.device | str = "cpu",
                  table_width: int | None = None) -> "RaggedBatch":
        """The batch of `rows` (each a `RaggedRow`) over blocks of `block_size` positions; table_width: the block
        table's columns (default: the most blocks a row names; a CUDA graph's bucket later). Every position a row
        writes must have a block, no two rows may write one pool entry, the null block 0 is never written."""
        block_size = _int(block_size, "block_size", 1)
        if isinstance(rows, RaggedRow) or not isinstance(rows, Sequence) or not rows:
            raise ValueError("rows must be a non-empty sequence of RaggedRow")
        counts, starts, wants, tables, flat, row_of = [], [], [], [], [], []
        for b, row in enumerate(rows):
            if not isinstance(row, RaggedRow):
                raise TypeError(f"rows[{b}] must be a RaggedRow, got {type(row).__name__}")
            tokens, blocks = list(row.tokens), list(row.blocks)
            if not tokens:
                raise ValueError(f"rows[{b}].tokens is empty: a row brings at least one new token")
            start = _int(row.start, f"rows[{b}].start", 0)
            want = _int(row.num_logits, f"rows[{b}].num_logits", 0)
            if want > len(tokens):
                raise ValueError(f"rows[{b}].num_logits ({want}) exceeds its {len(tokens)} tokens")
            if len(blocks) * block_size < start + len(tokens):
                raise ValueError(f"rows[{b}].blocks: {len(blocks)} blocks of {block_size} hold "
                                 f"{len(blocks) * block_size} positions, the row writes up to position "
                                 f"{start + len(tokens) - 1}")
            counts.append(len(tokens)), starts.append(start), wants.append(want), tables.append(blocks)
            flat.extend(tokens), row_of.extend([b] * len(tokens))
        most = max(len(t) for t in tables)
        width = most if table_width is None else _int(table_width, "table_width", 1)
        if width < most:
            raise ValueError(f"table_width ({width}) is narrower than a row's {most} blocks")
        # one tensor per kind, checked at once (a bad entry's row named from where it sits)
        flat = _ids(flat, lambda i: f"rows[{row_of[i]}].tokens")
        table = _ids([t + [0] * (width - len(t)) for t in tables],
                     lambda i: f"rows[{i // width}].blocks").view(len(rows), width)
        query_start, logits_start, index = [0], [0], []
        for c, want in zip(counts, wants):
            query_start.append(query_start[-1] + c)
            index.extend(range(query_start[-1] - want, query_start[-1]))
            logits_start.append(logits_start[-1] + want)
        row_ids, n = torch.tensor(row_of), len(row_of)
        first = torch.tensor(query_start[:-1]) - torch.tensor(starts)  # token i of row b: position i − first[b]
        positions = torch.arange(n) - first[row_ids]
        slots = table[row_ids, positions // block_size] * block_size + positions % block_size
        null = (slots < block_size).nonzero()
        if null.numel():
            raise ValueError(f"rows[{row_of[int(null[0])]}].blocks: a position the row writes maps to the null block 0")
        if torch.unique(slots).numel() != n:
            raise ValueError("rows: two rows write the same pool entry (their blocks overlap where they write)")
        # two host → device copies: the long vectors in one buffer, the int32 ones in another
        longs = torch.cat([flat, positions, slots, torch.tensor(index, dtype=torch.long),
                           torch.tensor(starts, dtype=torch.long)]).to(device)
        tokens, pos, slot_mapping, logits_index, row_starts = longs.split([n, n, n, len(index), len(rows)])
        ints = torch.cat([torch.tensor(query_start, dtype=torch.int32), table.view(-1).int()]).to(device)
        qs, tab = ints[: len(rows) + 1], ints[len(rows) + 1 :].view(len(rows), width)
        return cls(
            tokens=tokens, query_start=qs, starts=row_starts, positions=pos, block_table=tab,
            slot_mapping=slot_mapping, logits_index=logits_index, counts=tuple(counts), start_positions=tuple(starts),
            num_logits=tuple(wants), logits_start=tuple(logits_start), block_size=block_size,
            max_block=int(table.max()), max_token=int(flat.max()),
            layout=RaggedLayout(tuple(counts), tuple(starts), qs, pos, tab))


def covers(model) -> bool:
    """Whether `forward_ragged` runs `model`: a `FastLlama` whose eager layers are FastLlama's own. A subclass that
    overrides only the GEMM helpers and the head (`distributed.ShardedFastLlama`: its row-parallel products
    all-reduced, its vocab-parallel logits gathered) is covered; one with layers of its own (EAGLE's) is not."""
    return isinstance(model, FastLlama) and type(model)._eager_layers is FastLlama._eager_layers


def _check(model, batch: RaggedBatch, cache) -> None:
    if not covers(model):
        raise TypeError(f"model must be a FastLlama (its own eager body), got {type(model).__name__}: subclasses "
                        "with layers of their own (EAGLE layers) are not covered")
    s = model.shape
    if not isinstance(batch, RaggedBatch):
        raise TypeError(f"batch must be a RaggedBatch (RaggedBatch.from_rows), got {type(batch).__name__}")
    if batch.max_token >= s.vocab_size:
        raise ValueError(f"batch.tokens: token id {batch.max_token} is past the vocabulary ({s.vocab_size})")
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != s.n_layers or len(values) != s.n_layers:
        raise ValueError(f"cache must hold keys and values as lists of {s.n_layers} per-layer pools (a PagedKVCache)")
    want = (s.n_kv_heads, s.head_dim)
    pool = keys[0]
    if pool.dim() != 4 or tuple(pool.shape[2:]) != want or pool.shape[1] != batch.block_size:
        raise ValueError(f"cache pools must be [num_blocks, {batch.block_size}, {want[0]}, {want[1]}] (the batch's "
                         f"block_size), got {tuple(pool.shape)}")
    if pool.dtype != model.dtype or pool.device != model.device:
        raise ValueError(f"cache pools ({pool.dtype}, {pool.device}) must match the model ({model.dtype}, "
                         f"{model.device})")
    if batch.max_block >= pool.shape[0]:
        raise ValueError(f"batch.block_table names block {batch.max_block}; the pool has {pool.shape[0]} blocks")
    if model.bitwise and model.device.type != "cpu":  # (the fused layer's per-row Triton norms are not in this body)
        raise ValueError("forward_ragged with bitwise=True runs on CPU only: on CUDA the eager body's norms are torch's, "
                         "whose reductions may follow the row count")
    if batch.tokens.device != model.device:
        raise ValueError(f"batch is on {batch.tokens.device}, the model on {model.device}")


def forward_ragged(model, batch: RaggedBatch, cache, *, return_hidden: bool = False, compute_logits: bool = True,
                   kernels: str | None = None):
    """One pass of `model` (a `FastLlama`) over `batch`, writing each token's K/V into `cache`'s pools (a
    `PagedKVCache`, or anything with per-layer `keys` / `values` pools `[num_blocks, block_size, H_kv, D]`) →
    logits `[M, V]` float32 of the wanted positions (`batch.logits_index`, row by row).

    return_hidden: `(logits, hidden)`, hidden `[M, dim]` the final-normed states of those positions (of
    `batch.hidden_index` `[H]` instead where the batch has one), or with `model.feature_layers` set the states
    entering those layers `[M, len·dim]` (feature heads).
    compute_logits=False: logits None. kernels: the attention's kernel ("auto" | "triton" | "reference"; default
    the model's `kernels`); under `model.bitwise` the batch-invariant GEMMs and attention run (torch on CPU).
    The eager layers always (the fused layer writes the static layout).

    Exactness: a row's logits are what `FastLlama.forward` computes for it alone on a static cache — the same bits
    under `bitwise` (CPU: every GEMM and attention batch-invariant), otherwise equal to fp32 rounding (the CPU GEMMs
    pick their blocking by row count, SDPA by shape: `tests/fast/test_ragged.py`)."""
    _check(model, batch, cache)
    s, a = model.shape, model.shape.arch
    mode = model.kernels if kernels is None else check_kernel(kernels, "kernels")
    n = batch.num_tokens
    positions = batch.positions
    x = embedding(batch.tokens, model.embed)  # [N, dim] (as FastLlama.forward embeds)
    if a.embed_scale is not None:
        x = x * (torch.tensor(a.embed_scale, dtype=model.dtype) if a.round_embed_scale else a.embed_scale)
    if a.learned_positions:
        x = x + F.embedding(positions.clamp(max=s.max_positions - 1), model.pos_embed)
    tables = model._tables(batch.block_table.shape[1] * batch.block_size)
    heads, kv_heads, dim = s.n_heads, s.n_kv_heads, s.head_dim

    def attend(i: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int | None):
        pool_k, pool_v = cache.keys[i], cache.values[i]
        pool_k.view(-1, kv_heads, dim).index_copy_(0, batch.slot_mapping, key.reshape(n, kv_heads, dim))
        pool_v.view(-1, kv_heads, dim).index_copy_(0, batch.slot_mapping, value.reshape(n, kv_heads, dim))
        out = ragged_attention(q.reshape(n, heads, dim), pool_k, pool_v, batch.layout, a.attn_scale, window=window,
                               softcap=a.attn_softcap, kernel=mode, invariant=model.bitwise)
        return out.view(1, n, heads, dim)

    capture = [] if return_hidden and model.feature_layers else None
    x = model._eager_layers(x.view(1, n, s.dim), None, positions.view(1, n), None, tables, capture, attend=attend)
    states = x[0]
    x = states.index_select(0, batch.logits_index)  # [M, dim]: only the scored positions reach the head
    if model.normed_output:
        x = model._norm(x, model.final_norm, model.final_norm_bias)
    logits = model._logits(x, "bitwise" if model.bitwise else "reference") if compute_logits else None
    if not return_hidden:
        return logits
    index = batch.logits_index if batch.hidden_index is None else batch.hidden_index
    if capture is not None:
        x = torch.cat([c[0].index_select(0, index) for c in capture], -1)
    elif batch.hidden_index is not None:
        x = states.index_select(0, index)
        if model.normed_output:
            x = model._norm(x, model.final_norm, model.final_norm_bias)
    return logits, x
