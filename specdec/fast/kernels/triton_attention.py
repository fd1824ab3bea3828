"""Triton split-K decode attention over a slot cache (imported lazily by `attention.slot_attention`).

One program per (row b, KV head, split, row tile). It holds the G·k queries that read its KV head (G = H / H_kv,
query i's head g at tile row r = i·G + g, padded to a power of two ≥ 16 so `tl.dot` runs on tensor cores) and
walks its share of the row's live slots [0, max position + 1) in blocks of BLOCK_N, with an online softmax in
fp32 (base-2: scores are prescaled by scale·log2 e). Blocks past the row's largest position are never read, so
the cost follows the live length, not the cache size, and barely depends on k. With a sliding window W the
tile starts at its smallest position − W + 1 instead of slot 0: a windowed layer reads about W + k slots
whatever the row's length. A softcap c (Gemma 2) maps each score s to c·tanh(s / c) before the softmax.
A token tree (`attention.TreeMask`) also hides, of the slots from the row's tree base on, those whose bit is
not set in the query's ancestor mask (an int64 per query: bit t = tree slot base + t). A paged cache (`block_table`)
is the same walk with each slot's address read through the row's block table (`_slot_offsets`).

With one split the program writes the output; with several, each writes its unnormalized accumulator and its
(max, sum) to fp32 scratch and `_combine` merges the splits. The split count comes from shapes only, so one
CUDA graph captures a fixed launch whatever the lengths. The query rows, scores, visibility and online-softmax step
are `_softmax_triton`'s (the bitwise kernel's too).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specdec.fast.kernels._softmax_triton import dot, online_step, query_rows, scores, visible
from specdec.fast.kernels.select import NUM_SMS, sm_count

__all__ = ["attention", "plan", "choose_splits", "sm_count", "LaunchPlan", "NUM_SMS"]

MIN_SLOTS_PER_SPLIT = 256  # of the cache size S: about 128 live slots per split at half-full caches
MAX_SPLITS = 32


@triton.jit
def _slot_offsets(TABLE, b, j, j_ok, sab, stride_row, stride_slot, PAGED: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of slots j of row b: b·stride_row + j·stride_slot; paged (K/V a pool `[N, PAGE, H_kv, D]`),
    block table[b, j // PAGE] · stride_row + (j % PAGE) · stride_slot."""
    if PAGED:
        block = tl.load(TABLE + b * sab + j // PAGE, mask=j_ok, other=0).to(tl.int64)
        return block * stride_row + (j % PAGE) * stride_slot
    return b * stride_row + j * stride_slot


@triton.jit(do_not_specialize=["spb", "k_len", "num_slots", "rows_pad", "window", "stb", "stk", "sab"])  # no recompile per k or length
def _split_attention(Q, K, V, POS, OUT, PART_ACC, PART_M, PART_L, TREE_BASE, TREE_BITS, TABLE, SINKS,
                     sqb, sqk, sqh, sqd, skb, skh, sks, skd, svb, svh, svs, svd, spb, spk, sob, sok, soh, sod,
                     stb, stk, sab, k_len, num_slots, rows_pad, scale_log2, window, softcap, scale,
                     KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr,
                     WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, TREE: tl.constexpr, PAGED: tl.constexpr,
                     PAGE: tl.constexpr, HAS_SINKS: tl.constexpr = False):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)
    b, kvh, rows, row_ok, qi, head = query_rows(pid_bh, tile, k_len, KV_HEADS, GROUP, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)

    # Query i sees slots j <= positions[b, i] (and j > positions[b, i] - window), never the junk slot S-1;
    # padding rows see nothing.
    pos = tl.load(POS + b * spb + qi * spk, mask=row_ok, other=-1).to(tl.int32)
    pos = tl.minimum(pos, num_slots - 2)
    if TREE:  # the row's tree starts at slot base; each query's ancestors (itself included) as bits from there
        base = tl.load(TREE_BASE + b).to(tl.int32)
        bits = tl.load(TREE_BITS + b * stb + qi * stk, mask=row_ok, other=0).to(tl.int64)
    live = tl.max(pos, axis=0) + 1  # this tile reads slots [first, live)
    if WINDOWED:
        first = tl.maximum(tl.min(tl.where(row_ok, pos, num_slots), axis=0) - window + 1, 0)
    else:
        first = 0
    chunk = tl.cdiv(tl.cdiv(live - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, live)

    q = tl.load(Q + b * sqb + qi[:, None] * sqk + head[:, None] * sqh + d[None, :] * sqd,
                mask=row_ok[:, None], other=0.0)
    k_base = K + kvh * skh
    v_base = V + kvh * svh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        j_ok = j < hi
        k_at = _slot_offsets(TABLE, b, j, j_ok, sab, skb, sks, PAGED, PAGE)
        keys = tl.load(k_base + k_at[:, None] + d[None, :] * skd, mask=j_ok[:, None], other=0.0)
        s = scores(q, keys, scale_log2, softcap, scale, SOFTCAP, IEEE)  # [BLOCK_M, BLOCK_N] fp32, base 2
        seen = visible(j, j_ok, pos, window, WINDOWED)
        if TREE:
            rel = tl.minimum(tl.maximum(j - base, 0), 63).to(tl.int64)
            ancestor = ((bits[:, None] >> rel[None, :]) & 1) != 0
            seen = seen & ((j[None, :] < base) | ancestor)
        p, alpha, m_new, lsum = online_step(s, seen, m, lsum)
        v_at = k_at if PAGED else b * svb + j * svs  # (a pool's keys and values share one layout)
        vals = tl.load(v_base + v_at[:, None] + d[None, :] * svd, mask=j_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(vals.dtype), vals, IEEE)
        m = m_new

    if NUM_SPLITS == 1:
        if HAS_SINKS:  # one more logit per head in the denominator (base 2, against the row maximum m)
            sink = tl.load(SINKS + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
            lsum = lsum + tl.exp2(sink - tl.where(m == float("-inf"), sink, m))
        out = acc / tl.where(lsum == 0.0, 1.0, lsum)[:, None]  # padding rows (not stored) saw nothing
        tl.store(OUT + b * sob + qi[:, None] * sok + head[:, None] * soh + d[None, :] * sod,
                 out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (pid_bh.to(tl.int64) * NUM_SPLITS + split) * rows_pad  # [B·H_kv, splits, rows_pad(, D)]
        tl.store(PART_M + part + rows, m)
        tl.store(PART_L + part + rows, lsum)
        tl.store(PART_ACC + part * HEAD_DIM + rows[:, None] * HEAD_DIM + d[None, :], acc)


@triton.jit
def _combine(PART_ACC, PART_M, PART_L, OUT, SINKS, sob, sok, soh, sod, rows_pad,
             KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
             NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HAS_SINKS: tl.constexpr = False):
    pid_bh = tl.program_id(0)
    row = tl.program_id(1)
    b = (pid_bh // KV_HEADS).to(tl.int64)
    kvh = pid_bh % KV_HEADS
    sp = tl.arange(0, SPLITS_P2)
    sp_ok = sp < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM)
    part = (pid_bh.to(tl.int64) * NUM_SPLITS + sp) * rows_pad + row
    m = tl.load(PART_M + part, mask=sp_ok, other=float("-inf"))
    lsum = tl.load(PART_L + part, mask=sp_ok, other=0.0)
    acc = tl.load(PART_ACC + part[:, None] * HEAD_DIM + d[None, :], mask=sp_ok[:, None], other=0.0)
    top = tl.max(m, axis=0)
    w = tl.exp2(m - top)  # splits that saw nothing (m = -inf) weigh 0
    head = kvh * GROUP + row % GROUP
    total = tl.sum(w * lsum, axis=0)
    if HAS_SINKS:  # one more logit per head in the denominator (base 2, against the row maximum)
        total = total + tl.exp2(tl.load(SINKS + head).to(tl.float32) * 1.4426950408889634 - top)
    out = tl.sum(acc * w[:, None], axis=0) / total
    tl.store(OUT + b * sob + (row // GROUP) * sok + head * soh + d * sod, out.to(OUT.dtype.element_ty))


def choose_splits(batch: int, kv_heads: int, num_slots: int, row_tiles: int = 1, num_sms: int = NUM_SMS) -> int:
    """Splits of each row's live slots, from shapes only: enough programs for ~2 waves over the SMs, each split
    owning at least MIN_SLOTS_PER_SPLIT of the S slots (the live part is what it reads)."""
    programs = batch * kv_heads * row_tiles
    want = triton.cdiv(2 * num_sms, programs)
    return max(1, min(want, triton.cdiv(num_slots, MIN_SLOTS_PER_SPLIT), MAX_SPLITS))


@dataclass(frozen=True)
class LaunchPlan:
    """Tile sizes and grid of one call: G·k query rows per KV head in row_tiles tiles of block_m rows, slots in
    blocks of block_n, each row's live slots in `splits` parts."""

    block_m: int
    block_n: int
    row_tiles: int
    splits: int
    num_warps: int
    num_stages: int


@functools.cache  # called per layer per step: the arithmetic once per shape
def plan(batch: int, k: int, heads: int, kv_heads: int, dim: int, num_slots: int, num_sms: int = NUM_SMS,
         num_splits: int | None = None, fp32: bool = False) -> LaunchPlan:
    """The launch for these shapes (never for these lengths: a CUDA graph replays it for any positions).

    Tiles were sized so sm_90 compiles keep to registers (ptxas resource usage, Triton 3.9); fp32 inputs (full
    fp32 dots, not the target) take narrower slot blocks and two pipeline stages to fit shared memory.
    """
    rows = heads // kv_heads * k
    block_m = min(max(16, triton.next_power_of_2(rows)), 64 if dim > 128 or fp32 else 128)
    row_tiles = triton.cdiv(rows, block_m)
    splits = choose_splits(batch, kv_heads, num_slots, row_tiles, num_sms) if num_splits is None else num_splits
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if fp32:
        block_n, warps, stages = (16 if dim > 128 else 32), (8 if block_m * dim >= 64 * 64 else 4), 2
    else:
        block_n, warps, stages = (32 if dim > 128 else 64), (8 if block_m * dim >= 64 * 128 else 4), 3
    return LaunchPlan(block_m=block_m, block_n=block_n, row_tiles=row_tiles, splits=int(splits), num_warps=warps,
                      num_stages=stages)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
              scale: float | None = None, num_splits: int | None = None, window: int | None = None,
              softcap: float | None = None, tree_base: torch.Tensor | None = None,
              tree_bits: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`slot_attention_reference` by the split-K kernel; shapes and arguments are checked by the caller.

    q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]` (any strides), positions `[B, k]` → `[B, k, H, D]` in q's dtype;
    a token tree: tree_base `[B]` (contiguous) and tree_bits `[B, k]` int64 (any strides; see `attention.TreeMask`).
    block_table `[B, max_blocks]` int32 (contiguous rows): keys/values are a block pool `[N, page, H_kv, D]` of one
    layout (`fast.cache.PagedKVCache`) and row b's slot j is pool entry (table[b, j // page], j % page); S =
    max_blocks · page. The plan (splits, tiles) is the static cache's of the same S: one launch per shape.
    sinks `[H]` (contiguous, optional): attention sinks, one more logit per head in each softmax denominator.
    """
    batch, k, heads, dim = q.shape
    paged = block_table is not None
    if paged:
        page, kv_heads = keys.shape[1], keys.shape[2]
        num_slots = block_table.shape[1] * page
        k_strides = (keys.stride(0), keys.stride(2), keys.stride(1), keys.stride(3))  # as (row, head, slot, dim)
        v_strides = (values.stride(0), values.stride(2), values.stride(1), values.stride(3))
    else:
        page, kv_heads, num_slots = 1, keys.shape[1], keys.shape[2]
        k_strides, v_strides = keys.stride(), values.stride()
    group = heads // kv_heads
    p = plan(batch, k, heads, kv_heads, dim, num_slots, sm_count(q.device), num_splits, q.dtype == torch.float32)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    out = torch.empty(batch, k, heads, dim, device=q.device, dtype=q.dtype)
    rows_pad = p.row_tiles * p.block_m
    if p.splits > 1:  # fp32 scratch [B·H_kv, splits, rows_pad(, D)]: unnormalized outputs, row maxima, row sums
        part_acc = torch.empty(batch * kv_heads, p.splits, rows_pad, dim, device=q.device, dtype=torch.float32)
        part_m = torch.empty(batch * kv_heads, p.splits, rows_pad, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused
    tree = tree_base is not None
    _split_attention[(batch * kv_heads, p.splits, p.row_tiles)](
        q, keys, values, positions, out, part_acc, part_m, part_l, tree_base if tree else positions,
        tree_bits if tree else positions, block_table if paged else positions,
        positions if sinks is None else sinks, *q.stride(), *k_strides, *v_strides, *positions.stride(), *out.stride(),
        *(tree_bits.stride() if tree else (0, 0)), block_table.stride(0) if paged else 0,
        k, num_slots, rows_pad, scale * math.log2(math.e), window or 0, float(softcap or 1.0), scale,
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=dim, BLOCK_M=p.block_m, BLOCK_N=p.block_n, NUM_SPLITS=p.splits,
        IEEE=q.dtype == torch.float32, WINDOWED=window is not None, SOFTCAP=softcap is not None, TREE=tree,
        PAGED=paged, PAGE=page, HAS_SINKS=sinks is not None, num_warps=p.num_warps, num_stages=p.num_stages,
    )
    if p.splits > 1:
        _combine[(batch * kv_heads, group * k)](
            part_acc, part_m, part_l, out, positions if sinks is None else sinks, *out.stride(), rows_pad,
            KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=dim, NUM_SPLITS=p.splits,
            SPLITS_P2=triton.next_power_of_2(p.splits), HAS_SINKS=sinks is not None,
            num_warps=4 if dim >= 128 else 2,
        )
    return out
