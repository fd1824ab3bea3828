"""The Triton kernel of `ragged_attention` (imported lazily): varlen causal attention over block tables.

One program per (tile, KV head). Tile t is (row b, tile i of that row): the row's G·count query rows (token q's
head g at row q·G + g) in tiles of BLOCK_M; the program walks row b's slots from its first visible one (0, or the
tile's smallest position − W + 1 under a window) to its largest position + 1 in blocks of BLOCK_N, each slot's
address read through the block table (block table[b, j // PAGE], offset j % PAGE), online softmax in fp32 with
scores prescaled into base 2 (a softcap c first maps s·scale to c·tanh(s·scale / c)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.fast.kernels.ragged_attention import block_m_for

__all__ = ["attention"]


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit(do_not_specialize=["window", "sqn", "sqh", "son", "soh", "stb"])
def _ragged_attention(Q, K, V, OUT, POS, QSTART, TABLE, TILES,
                      sqn, sqh, son, soh, skb, skp, skh, stb,
                      scale_log2, window, softcap, scale,
                      KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                      WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(TILES + 2 * tile).to(tl.int64)
    part = tl.load(TILES + 2 * tile + 1)
    first_token = tl.load(QSTART + b)
    count = tl.load(QSTART + b + 1) - first_token
    rows = part * BLOCK_M + tl.arange(0, BLOCK_M)  # tile row r = token · GROUP + head in group
    row_ok = rows < GROUP * count
    token = (first_token + rows // GROUP).to(tl.int64)
    head = kvh * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    pos = tl.load(POS + token, mask=row_ok, other=-1).to(tl.int32)
    live = tl.max(pos, axis=0) + 1
    if WINDOWED:
        lo = tl.maximum(tl.min(tl.where(row_ok, pos, live), axis=0) - window + 1, 0)
    else:
        lo = 0
    q = tl.load(Q + token[:, None] * sqn + head[:, None] * sqh + d[None, :], mask=row_ok[:, None], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(lo, live, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        j_ok = j < live
        block = tl.load(TABLE + b * stb + j // PAGE, mask=j_ok, other=0).to(tl.int64)
        at = block * skb + (j % PAGE) * skp + kvh * skh  # (keys and values: one pool layout)
        keys = tl.load(K + at[:, None] + d[None, :], mask=j_ok[:, None], other=0.0)
        if SOFTCAP:
            s = softcap * _tanh(_dot(q, tl.trans(keys), IEEE) * (scale / softcap)) * 1.4426950408889634
        else:
            s = _dot(q, tl.trans(keys), IEEE) * scale_log2
        seen = (j[None, :] <= pos[:, None]) & j_ok[None, :]
        if WINDOWED:
            seen = seen & (j[None, :] > pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        vals = tl.load(V + at[:, None] + d[None, :], mask=j_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(vals.dtype), vals, IEEE)
        m = m_new
    out = acc / tl.where(lsum == 0.0, 1.0, lsum)[:, None]
    tl.store(OUT + token[:, None] * son + head[:, None] * soh + d[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None])


SHORT_ROWS = 32  # query rows (G · count) up to which a row is launched in small tiles (decode / verify rows)


def _launches(layout, group: int, dim: int, fp32: bool) -> list:
    """(tiles, BLOCK_M) of the short rows and of the long ones, from the batch's counts (rows of count 0: none)."""
    short = tuple(r for r, c in enumerate(layout.counts) if 0 < c * group <= SHORT_ROWS)
    long = tuple(r for r, c in enumerate(layout.counts) if c * group > SHORT_ROWS)
    out = []
    for rows in (short, long):
        if rows:
            block_m = block_m_for(max(layout.counts[r] for r in rows) * group, dim, fp32)
            out.append((layout.tiles(block_m, group, rows), block_m))
    return out


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layout, scale: float, *,
              window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q `[N, H, D]` (unit stride on D), pools `[num_blocks, PAGE, H_kv, D]` (contiguous), a `RaggedLayout` →
    `[N, H, D]`; arguments checked by `ragged_attention`. Short rows and long rows take a launch each, with tiles
    sized to them (a decode row's G query rows would leave most of a prefill-sized tile empty)."""
    heads, dim = q.shape[1:]
    page, kv_heads = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    fp32 = q.dtype == torch.float32
    q = q if q.stride(-1) == 1 else q.contiguous()
    keys, values = keys.contiguous(), values.contiguous()
    table = layout.block_table if layout.block_table.stride(-1) == 1 else layout.block_table.contiguous()
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    block_n = (16 if dim > 128 else 32) if fp32 else (32 if dim > 128 else 64)
    for tiles, block_m in layout.launches or _launches(layout, group, dim, fp32):
        _ragged_attention[(tiles.shape[0], kv_heads)](
            q, keys, values, out, layout.positions, layout.query_start, table, tiles,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
            table.stride(0), scale * 1.4426950408889634, window or 0, float(softcap or 1.0), scale,
            KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=dim, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n, IEEE=fp32,
            WINDOWED=window is not None, SOFTCAP=softcap is not None,
            num_warps=8 if block_m * dim >= 64 * 128 else 4, num_stages=2,
        )
    return out
