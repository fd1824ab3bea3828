"""The bitwise mode's attention kernel (Triton; re-exported by `_invariant_triton`, behind
`specdec.fast.kernels.invariant.invariant_attention`).

program (row b · KV head, split, row tile): the G·k query rows of one KV head, BLOCK_M at a time, over
the slots [split · SPLIT_SLOTS, (split + 1) · SPLIT_SLOTS) ∩ [window start, live) in KEY_BLOCK blocks
aligned at slot 0, online softmax in fp32 (base 2). Splits are fixed slot ranges, not shares of the
live length, and are merged one after the other in split order (`_merge`); a split past a query's
position (or before its window) adds nothing, exactly, so a query's result does not depend on the
tile's other queries, the batch or the span (which only changes how many empty splits run). With one
split (a span of at most SPLIT_SLOTS) the program stores acc / sum itself — the merge of a single split
gives exactly that. (Different SPLIT_SLOTS give different bits: it is a constant.) The query rows, visibility and
online-softmax step are `_softmax_triton`'s, inlined: the same program as when they were spelled out here.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specdec.fast.kernels._softmax_triton import dot, online_step, query_rows, visible

__all__ = ["SPLIT_SLOTS", "BLOCK_M", "key_block", "attention"]

SPLIT_SLOTS = 512  # slots per split, aligned at slot 0 (a multiple of every `key_block`); a constant


@triton.jit(do_not_specialize=["spb", "k_len", "num_slots", "rows_pad", "window", "num_splits"])
def _attention_kernel(Q, K, V, POS, OUT, PART_ACC, PART_M, PART_L,
                      sqb, sqk, sqh, sqd, skb, skh, sks, skd, svb, svh, svs, svd, spb, spk, sob, sok, soh, sod,
                      k_len, num_slots, rows_pad, scale_log2, window, num_splits,
                      KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, ONE_SPLIT: tl.constexpr, IEEE: tl.constexpr,
                      WINDOWED: tl.constexpr):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)
    b, kvh, rows, row_ok, qi, head = query_rows(pid_bh, tile, k_len, KV_HEADS, GROUP, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    pos = tl.load(POS + b * spb + qi * spk, mask=row_ok, other=-1).to(tl.int32)
    pos = tl.minimum(pos, num_slots - 2)  # never the junk slot
    live = tl.max(pos, axis=0) + 1
    lo = split * SPLIT
    if WINDOWED:  # start at the block holding the tile's earliest visible slot (aligned: the blocks stay the same)
        first = tl.maximum(tl.min(tl.where(row_ok, pos, num_slots), axis=0) - window + 1, 0)
        lo = tl.maximum(lo, (first // BLOCK_N) * BLOCK_N)
    hi = tl.minimum(split * SPLIT + SPLIT, live)

    q = tl.load(Q + b * sqb + qi[:, None] * sqk + head[:, None] * sqh + d[None, :] * sqd, mask=row_ok[:, None],
                other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        j_ok = j < hi
        keys = tl.load(k_base + j[:, None] * sks + d[None, :] * skd, mask=j_ok[:, None], other=0.0)
        s = dot(q, tl.trans(keys), IEEE) * scale_log2
        seen = visible(j, j_ok, pos, window, WINDOWED)
        p, alpha, m_new, lsum = online_step(s, seen, m, lsum)  # (alpha exactly 1 where a block adds nothing)
        vals = tl.load(v_base + j[:, None] * svs + d[None, :] * svd, mask=j_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(vals.dtype), vals, IEEE)
        m = m_new

    if ONE_SPLIT:  # what `_merge` makes of one split, bit for bit
        out = acc / tl.where(lsum == 0.0, 1.0, lsum)[:, None]
        tl.store(OUT + b * sob + qi[:, None] * sok + head[:, None] * soh + d[None, :] * sod,
                 out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (pid_bh.to(tl.int64) * num_splits + split) * rows_pad  # [B·H_kv, splits, rows_pad(, D)]
        tl.store(PART_M + part + rows, m)
        tl.store(PART_L + part + rows, lsum)
        tl.store(PART_ACC + part * HEAD_DIM + rows[:, None] * HEAD_DIM + d[None, :], acc)


@triton.jit(do_not_specialize=["rows_pad", "num_splits"])
def _merge(PART_ACC, PART_M, PART_L, OUT, sob, sok, soh, sod, rows_pad, num_splits,
           KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One query row: the splits' partial softmaxes merged one after the other, in split order. A split that saw
    nothing (m = −inf, sum 0, acc 0) leaves the running values exactly as they were."""
    pid_bh = tl.program_id(0)
    row = tl.program_id(1)
    b = (pid_bh // KV_HEADS).to(tl.int64)
    kvh = pid_bh % KV_HEADS
    d = tl.arange(0, HEAD_DIM)
    m = tl.full([1], float("-inf"), tl.float32)
    lsum = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s in range(0, num_splits):
        part = (pid_bh.to(tl.int64) * num_splits + s) * rows_pad + row
        m_s = tl.load(PART_M + part)
        m_new = tl.maximum(m, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m - m_safe)
        w = tl.exp2(m_s - m_safe)
        lsum = lsum * a + tl.load(PART_L + part) * w
        acc = acc * a + tl.load(PART_ACC + part * HEAD_DIM + d) * w
        m = m_new
    out = acc / tl.where(lsum == 0.0, 1.0, lsum)
    head = kvh * GROUP + row % GROUP
    tl.store(OUT + b * sob + (row // GROUP) * sok + head * soh + d * sod, out.to(OUT.dtype.element_ty))


BLOCK_M = 16  # query rows per attention program, for every k


def key_block(dim: int, dtype: torch.dtype) -> int:
    """Slots per attention block: fixed per (head dim, dtype), i.e. per model."""
    return 32 if dtype == torch.float32 or dim > 128 else 64


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
              scale: float | None = None, window: int | None = None) -> torch.Tensor:
    """q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, positions `[B, k]` → `[B, k, H, D]` (checked by the
    caller)."""
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    rows = group * k
    row_tiles = triton.cdiv(rows, BLOCK_M)
    rows_pad = row_tiles * BLOCK_M
    splits = triton.cdiv(num_slots, SPLIT_SLOTS)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    fp32 = q.dtype == torch.float32
    block_n = key_block(dim, q.dtype)
    out = torch.empty(batch, k, heads, dim, device=q.device, dtype=q.dtype)
    if splits > 1:
        part_acc = torch.empty(batch * kv_heads, splits, rows_pad, dim, device=q.device, dtype=torch.float32)
        part_m = torch.empty(batch * kv_heads, splits, rows_pad, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused
    _attention_kernel[(batch * kv_heads, splits, row_tiles)](
        q, keys, values, positions, out, part_acc, part_m, part_l,
        *q.stride(), *keys.stride(), *values.stride(), *positions.stride(), *out.stride(),
        k, num_slots, rows_pad, scale * math.log2(math.e), window or 0, splits,
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=dim, BLOCK_M=BLOCK_M, BLOCK_N=block_n, SPLIT=SPLIT_SLOTS,
        ONE_SPLIT=splits == 1, IEEE=fp32, WINDOWED=window is not None,
        num_warps=4 if dim <= 64 else 8, num_stages=2 if fp32 else 3)
    if splits > 1:
        _merge[(batch * kv_heads, rows)](part_acc, part_m, part_l, out, *out.stride(), rows_pad, splits,
                                         KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=dim,
                                         num_warps=4 if dim >= 128 else 2)
    return out
