"""Triton kernels behind `specdec.fast.kernels.invariant` (imported only where Triton is installed).

matmul     program (m tile, n tile, k split) computes out[m-block, n-block] = Σ_k x·wᵀ over its split's K range in
           BLOCK_K steps with one `tl.dot` shape. The summation order — BLOCK_K and the number of K splits — is a
           function of the weight's (N, K) alone (`_invariant_config.fixed_config`), never of M. With one split the
           program adds bias/residual and stores; with several, each split stores its fp32 partial `[splits, M,
           N]` and `_reduce` sums them one after the other in split order (then bias, then residual) — or, fused
           (`fuse_splits`, for large M), one program computes each split's sum from zero and adds them in the same
           order itself. The tile (block_m × block_n, warps, stages) may follow M's range (`config_for(n, k, m)`)
           where `tile_probe`'s device check (once per process, dtype and base tile) finds the bits unchanged;
           else the fixed config runs for every M. Tiles are held transposed, `[BLOCK_N, BLOCK_M]` (weights as the
           wide operand, as in `_linear_triton`); the grid runs the m tiles of one weight block next to each other.
attention  program (row b · KV head, split, row tile): the G·k query rows of one KV head, BLOCK_M at a time, over
           the slots [split · SPLIT_SLOTS, (split + 1) · SPLIT_SLOTS) ∩ [window start, live) in KEY_BLOCK blocks
           aligned at slot 0, online softmax in fp32 (base 2). Splits are fixed slot ranges, not shares of the
           live length, and are merged one after the other in split order (`_merge`); a split past a query's
           position (or before its window) adds nothing, exactly, so a query's result does not depend on the
           tile's other queries, the batch or the span (which only changes how many empty splits run). With one
           split (a span of at most SPLIT_SLOTS) the program stores acc / sum itself — the merge of a single split
           gives exactly that. (Different SPLIT_SLOTS give different bits: it is a constant.)
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from specdec.fast.kernels._invariant_config import (MATMUL, MatmulConfig, Tile, candidates_for,  # noqa: F401
                                                    config_for, fixed_config, range_tiles)

__all__ = ["MatmulConfig", "MATMUL", "SPLIT_SLOTS", "Tile", "TileProbe", "config_for", "fixed_config", "launch_config",
           "tile_probe", "probe_tiles", "matmul", "attention"]

logger = logging.getLogger(__name__)

SPLIT_SLOTS = 512  # attention: slots per split, aligned at slot 0 (a multiple of every `key_block`); a constant


TILES_ENV = "SPECDEC_BITWISE_TILES"  # "probe" (default), "by_m" (no device check), "fixed"
TILES_BY_M: bool | None = None  # True / False override the environment; None: the environment, else the probe


@dataclass(frozen=True)
class TileProbe:
    """The device check behind `launch_config` for one (device, dtype, base tile): the base's block_k with 2 K
    splits, 160 × 256 outputs over K = 8 · block_k of wide-range random inputs, stored in fp32 (the accumulators'
    own bits), computed by the base tile and by every candidate M-range tile, splits stored and fused. checked /
    differs: those configs' names, and the ones whose bits differed from the base's (or that did not compile or
    fit: `errors` says why); reason: why the check did not run (then the fixed config is kept)."""

    dtype: str
    base: str
    checked: tuple[str, ...]
    differs: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    reason: str = ""

    @property
    def same(self) -> bool:
        """Every candidate tile gave the base's bits."""
        return bool(self.checked) and not self.differs and not self.reason

    def agrees(self, config: MatmulConfig) -> bool:
        """Whether config's tile (its splits fused or stored as config's) gave the base's bits."""
        name = replace(config, split_k=2).name()
        return not self.reason and name in self.checked and name not in self.differs


_PROBES: dict[tuple, TileProbe] = {}
_LAUNCH: dict[tuple, MatmulConfig] = {}  # launch_config's answers (the host cost of a Triton launch is enough)
PROBE_SHAPE = (160, 256, 8)  # the probe's M, N and K steps (K = steps · block_k, in 2 splits)


def _tiles_mode() -> str:
    if TILES_BY_M is not None:
        return "by_m" if TILES_BY_M else "fixed"
    mode = os.environ.get(TILES_ENV, "probe") or "probe"
    if mode not in ("probe", "by_m", "fixed"):
        raise ValueError(f"{TILES_ENV} must be 'probe', 'by_m' or 'fixed', got {mode!r}")
    return mode


def probe_tiles(base: MatmulConfig, dtype: torch.dtype, device) -> TileProbe:
    """Run the check `TileProbe` describes (syncs the device; never under graph capture)."""
    ref = replace(base, split_k=2, fuse_splits=False)
    m, n, steps = PROBE_SHAPE
    k = steps * base.block_k
    gen = torch.Generator().manual_seed(0)

    def draw(rows: int, cols: int) -> torch.Tensor:  # magnitudes over 2^-6..2^6: the order shows in the low bits
        v = torch.randn(rows, cols, generator=gen) * torch.exp2(torch.randint(-6, 7, (rows, cols), generator=gen))
        return v.to(device=device, dtype=dtype)

    x, w = draw(m, k), draw(n, k)
    want = torch.empty(m, n, device=device, dtype=torch.float32)
    matmul(x, w, None, None, want, ref)
    checked, differs, errors = [], [], []
    for _, tiles in range_tiles(base):
        for tile in tiles:
            for fuse in (False, True):
                cfg = ref.with_tile(tile, fuse)
                if cfg == ref or cfg.name() in checked:
                    continue
                got = torch.empty_like(want)
                checked.append(cfg.name())
                try:
                    matmul(x, w, None, None, got, cfg)
                except Exception as exc:  # noqa: BLE001  a tile the device cannot compile or hold: not used
                    kind = "does not fit" if isinstance(exc, OutOfResources) else type(exc).__name__
                    differs.append(cfg.name())
                    errors.append(f"{cfg.name()}: {kind}: {str(exc)[:80]}")
                    continue
                if not torch.equal(got, want):
                    differs.append(cfg.name())
    return TileProbe(str(dtype), ref.name(), tuple(checked), tuple(differs), tuple(errors))


def tile_probe(base: MatmulConfig, dtype: torch.dtype, device) -> TileProbe | None:
    """The device check for weights whose fixed config is `base`, run once per process, device, dtype and base
    tile, logged; None where it does not apply: fp32 (its IEEE FMA tiles would outgrow shared memory) and outside
    CUDA (Triton's interpreter), where the fixed config runs. Under CUDA graph capture (no sync allowed) an
    unchecked base keeps the fixed config for the rest of the process."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    key = (device, dtype, base.tile, base.block_k)
    result = _PROBES.get(key)
    if result is None:
        if torch.cuda.is_current_stream_capturing():
            result = TileProbe(str(dtype), base.name(), (), reason="first used under CUDA graph capture")
        else:
            result = probe_tiles(base, dtype, device)
        _PROBES[key] = result
        agree = [c for c in result.checked if c not in result.differs]
        log = logger.info if result.same else logger.warning
        log("bitwise GEMM tiles for %s %s base %s: same bits %s; differ %s%s", device, dtype, result.base,
            agree or "none", list(result.differs) or "none", f" ({result.reason})" if result.reason else "")
    return result


def launch_config(n: int, k: int, m: int, dtype: torch.dtype, device) -> MatmulConfig:
    """The config `matmul` runs for M rows of an [N, K] weight: `fixed_config(n, k)` up to SMALL_M rows; above,
    per TILES_BY_M / $SPECDEC_BITWISE_TILES: "fixed" that config, "by_m" the preferred M-range config
    (`config_for(n, k, m)`, no check), "probe" (the default) the first candidate of m's range whose tile
    `tile_probe` found bit-identical to the fixed config, else the fixed config."""
    mode = _tiles_mode()
    key = (n, k, m, dtype, device, mode)
    config = _LAUNCH.get(key)
    if config is None:
        base = fixed_config(n, k)
        candidates = candidates_for(base, n, m)
        if candidates[0] == base or mode == "fixed":
            config = base
        elif mode == "by_m":
            config = candidates[0]
        else:
            probe = tile_probe(base, dtype, device)
            config = next((c for c in candidates if probe is not None and probe.agrees(c)), base)
        if len(_LAUNCH) >= 4096:  # (prefill chunks of many lengths)
            _LAUNCH.clear()
        _LAUNCH[key] = config
    return config


@triton.jit
def _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, k_lo, k_hi, stride_xm, stride_wn, IEEE: tl.constexpr,
             STAGES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ over k in [k_lo, k_hi) of w[n, k] · x[m, k] in fp32 `[BLOCK_N, BLOCK_M]`, from zero, one `tl.dot` per
    BLOCK_K step in K order."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_lo + offs_k)[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        k_ok = (k0 + offs_k) < k_hi
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


# M and the row strides are not specialized: one binary per config for every M in its range.
@triton.jit(do_not_specialize=["M", "stride_xm", "stride_rm", "stride_om"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr, part_ptr, M, N, K, K_RANGE, stride_xm, stride_wn, stride_rm,
                   stride_om, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, IEEE: tl.constexpr,
                   STAGES: tl.constexpr, SPLIT: tl.constexpr, SERIAL: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = pid_k * K_RANGE
    acc = _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, k_lo, tl.minimum(k_lo + K_RANGE, K), stride_xm,
                   stride_wn, IEEE, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    for s in tl.static_range(1, SERIAL):  # fused splits: split s's own sum, added in split order (as `_reduce`)
        acc += _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, s * K_RANGE, tl.minimum(s * K_RANGE + K_RANGE, K),
                        stride_xm, stride_wn, IEEE, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT:  # partial [splits, M, N] in fp32; `_reduce` finishes
        part = part_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
        tl.store(part, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        if HAS_RES:
            acc += tl.load(r_ptr + offs_m[None, :].to(tl.int64) * stride_rm + offs_n[:, None], mask=mask,
                           other=0.0).to(tl.float32)
        tl.store(o_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None],
                 acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "stride_rm", "stride_om"])
def _reduce(part_ptr, b_ptr, r_ptr, o_ptr, M, N, stride_rm, stride_om, SPLITS: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """Row m of the output, BLOCK columns: Σ over splits in split order (fp32), + bias, + residual, stored."""
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.load(part_ptr + m * N + cols, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + (s * M + m) * N + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(r_ptr + m * stride_rm + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + cols, acc.to(o_ptr.dtype.element_ty), mask=ok)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias, residual, out: torch.Tensor,
           config: MatmulConfig | None = None) -> None:
    """out `[M, N]` = x `[M, K]` @ weight `[N, K]`ᵀ (+ bias) (+ residual `[M, N]`); rows K/N-contiguous. out may be
    residual itself (each element is read and written by one program). config: `launch_config(N, K, M, ...)`
    unless given (benchmarks, probes and tests; a config of another order gives other bits)."""
    m, k = x.shape
    n = weight.shape[0]
    c = launch_config(n, k, m, x.dtype, x.device) if config is None else config
    k_range = c.k_range(k)
    splits = -(-k // k_range) if k else 1
    stored = splits > 1 and not c.fuse_splits
    part = torch.empty(splits, m, n, device=x.device, dtype=torch.float32) if stored else out
    bias_arg = bias if bias is not None else out
    res_arg = residual if residual is not None else out
    stride_rm = residual.stride(0) if residual is not None else 0
    grid = (triton.cdiv(m, c.block_m), triton.cdiv(n, c.block_n), splits if stored else 1)
    _matmul_kernel[grid](
        x, weight, bias_arg, res_arg, out, part, m, n, k, k_range, x.stride(0), weight.stride(0), stride_rm,
        out.stride(0), HAS_BIAS=bias is not None, HAS_RES=residual is not None, IEEE=x.dtype == torch.float32,
        STAGES=c.num_stages, SPLIT=stored, SERIAL=1 if stored else splits, BLOCK_M=c.block_m,
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, num_warps=c.num_warps, num_stages=c.num_stages)
    if stored:
        block = 1024 if n >= 1024 else triton.next_power_of_2(max(n, 16))
        _reduce[(m, triton.cdiv(n, block))](part, bias_arg, res_arg, out, m, n, stride_rm, out.stride(0),
                                            SPLITS=splits, HAS_BIAS=bias is not None,
                                            HAS_RES=residual is not None, BLOCK=block, num_warps=4)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


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
    b = (pid_bh // KV_HEADS).to(tl.int64)
    kvh = pid_bh % KV_HEADS
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # tile row r = query i · GROUP + head-in-group g
    row_ok = rows < GROUP * k_len
    qi = rows // GROUP
    head = kvh * GROUP + rows % GROUP
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
        s = _dot(q, tl.trans(keys), IEEE) * scale_log2
        seen = (j[None, :] <= pos[:, None]) & j_ok[None, :]
        if WINDOWED:
            seen = seen & (j[None, :] > pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at zero weight
        alpha = tl.exp2(m - m_safe)  # exactly 1 where this block adds nothing to a row that saw something
        p = tl.exp2(s - m_safe[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        vals = tl.load(v_base + j[:, None] * svs + d[None, :] * svd, mask=j_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(vals.dtype), vals, IEEE)
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
