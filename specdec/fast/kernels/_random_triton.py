"""Triton kernels of `specdec.rng` (imported lazily by `kernels.random`): the same hash, bit for bit.

The reference chains `lowbias32` on int64 tensors with 16-bit split multiplies; here the words are uint32 and
the multiplies wrap natively, which is the same function mod 2^32. The unit value `((h >> 9) + 0.5) · 2^-23`
is exact in float32; -ln u is taken in float64 and rounded once to float32, as the reference does (see
`rng._neg_log` for why every float64 log gives the same float32 bits). On CUDA the float64 log is libdevice's
`__nv_log`; the interpreter (no libdevice there) takes numpy's, via `tl.log`.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # the backend-dispatching libdevice (Triton >= 3.0)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover
    libdevice = None

__all__ = ["exponentials_kernel", "uniforms_kernel", "race_kernel", "race_combine_kernel", "neg_log_unit_kernel"]


@triton.jit
def _mix(x):
    """lowbias32 on uint32 words."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, position, STREAM: tl.constexpr):
    """int64 seed and position (scalars or blocks) → the 32-bit key of `rng._row_keys`."""
    lo = seed.to(tl.uint32)
    hi = (seed >> 32).to(tl.uint32)
    row = _mix(lo ^ _mix(hi ^ 0x9E3779B9))
    pos = _mix(position.to(tl.uint32) * 4 + STREAM)
    return _mix(row ^ pos ^ ((position >> 30) & 0xFFFF).to(tl.uint32))


@triton.jit
def _unit(h):
    """uint32 hash → U(0, 1) in float32, exact: ((h >> 9) + 0.5) · 2^-23."""
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def _neg_log(u, INTERPRET: tl.constexpr):
    """-ln u for float32 u, computed in float64 and rounded once to float32."""
    if INTERPRET:
        x = tl.log(u.to(tl.float64))
    else:
        x = libdevice.log(u.to(tl.float64))
    return (-x).to(tl.float32)


@triton.jit
def _noise(key, cols, INTERPRET: tl.constexpr):
    """Exp(1) draws of `rng.exponentials` at element indices `cols` (int32 block) for one row key."""
    element = _mix(cols.to(tl.uint32) ^ 0x5BD1E995)
    return _neg_log(_unit(_mix(key ^ element)), INTERPRET)


@triton.jit
def exponentials_kernel(SEED, POS, OUT, s_seed_b, s_seed_n, s_pos_b, s_pos_n, n, size,
                        STREAM: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """Grid (B·n, cdiv(size, BLOCK)); seed and position as [B, n] views (broadcast strides may be 0)."""
    r = tl.program_id(0).to(tl.int64)
    b, i = r // n, r % n
    key = _row_key(tl.load(SEED + b * s_seed_b + i * s_seed_n).to(tl.int64),
                   tl.load(POS + b * s_pos_b + i * s_pos_n).to(tl.int64), STREAM)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + r * size + cols, _noise(key, cols, INTERPRET), mask=cols < size)


@triton.jit
def uniforms_kernel(SEED, POS, OUT, s_seed_b, s_seed_n, s_pos_b, s_pos_n, n, total,
                    STREAM: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (cdiv(B·n, BLOCK),): one uniform per (row, position), written to OUT [B·n]."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = r < total
    b, i = r // n, r % n
    seed = tl.load(SEED + b * s_seed_b + i * s_seed_n, mask=ok, other=0).to(tl.int64)
    position = tl.load(POS + b * s_pos_b + i * s_pos_n, mask=ok, other=0).to(tl.int64)
    tl.store(OUT + r, _unit(_mix(_row_key(seed, position, STREAM))), mask=ok)


@triton.jit
def _better(val, idx, best, best_idx):
    """Per lane, `val` at a later index than `best`: it wins if torch.argmax would take it (the first NaN
    beats everything, else a strictly larger value)."""
    wins = ((val != val) & (best == best)) | (val > best)
    return tl.where(wins, val, best), tl.where(wins, idx, best_idx)


@triton.jit
def _block_best(vals, idxs):
    """The winner of a block as torch.argmax picks it (the first NaN, else the first maximum) → scalars."""
    nan = vals != vals
    any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
    nan_idx = tl.min(tl.where(nan, idxs, 2147483647), axis=0)
    top = tl.max(tl.where(nan, float("-inf"), vals), axis=0)
    top_idx = tl.min(tl.where(vals == top, idxs, 2147483647), axis=0)
    return tl.where(any_nan, float("nan"), top), tl.where(any_nan, nan_idx, top_idx)


@triton.jit
def race_kernel(PROBS, SEED, POS, TOKEN, PART_VAL, PART_IDX, s_probs, s_seed, s_pos, size, chunk,
                STREAM: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr, INTERPRET: tl.constexpr):
    """Grid (B, SPLITS): argmax over the split's columns [split·chunk, (split+1)·chunk) of probs / Exp(1) noise
    (the noise of `exponentials_kernel` at one position). One split writes the token; several write partials."""
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    key = _row_key(tl.load(SEED + b * s_seed).to(tl.int64), tl.load(POS + b * s_pos).to(tl.int64), STREAM)
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, size)
    for start in range(lo, hi, BLOCK):
        cols = start + lanes
        ok = cols < hi
        p = tl.load(PROBS + b * s_probs + cols, mask=ok, other=0.0).to(tl.float32)
        ratio = tl.math.div_rn(p, _noise(key, cols, INTERPRET))
        ratio = tl.where(ok, ratio, float("-inf"))
        best, best_idx = _better(ratio, cols, best, best_idx)
    val, idx = _block_best(best, best_idx)
    if SPLITS == 1:
        tl.store(TOKEN + b, idx.to(tl.int64))
    else:
        tl.store(PART_VAL + b * SPLITS + split, val)
        tl.store(PART_IDX + b * SPLITS + split, idx)


@triton.jit
def race_combine_kernel(PART_VAL, PART_IDX, TOKEN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (B,): the winner among a row's split partials."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK)
    ok = s < SPLITS
    vals = tl.load(PART_VAL + b * SPLITS + s, mask=ok, other=float("-inf"))
    idxs = tl.load(PART_IDX + b * SPLITS + s, mask=ok, other=2147483647)
    _, idx = _block_best(vals, idxs)
    tl.store(TOKEN + b, idx.to(tl.int64))


@triton.jit
def neg_log_unit_kernel(BITS, OUT, total, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """OUT = -ln(unit(h)) for uint32-valued h given as int64 (tests run it over all 2^23 units)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = r < total
    h = tl.load(BITS + r, mask=ok, other=0).to(tl.uint32)
    tl.store(OUT + r, _neg_log(_unit(h), INTERPRET), mask=ok)
