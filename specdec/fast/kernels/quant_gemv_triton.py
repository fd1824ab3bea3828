"""Triton kernel behind `specdec.fast.kernels.quant_gemv`: the decode-shape GEMV y = x @ Wᵀ for M = 1–8 activation
rows, W read quantized (imported only where Triton is installed).

Weight formats (FORMAT, compile-time), the layouts of `fast.quant.int4` / `fast.quant.fp8` exactly:
  0  int4  words int32, k = 8i + j in bits 4j..4j+3 of word i, read through two strides: the "nk" layout is
           `Int4Weight.qweight` `[N, K/8]` (stride_qn = K/8, stride_qk = 1), "kn" GPTQ's own `[K/8, N]` (stride_qn =
           1, stride_qk = N: each load row-contiguous along N); zeros uint8 and scales `[K/G, N]`:
           w[n, k] = (q − z) · s per group of G
  1  fp8   e4m3 `[N, K]`, one float32 scale per output column `[N]` (per-tensor scales broadcast to it)
  2  fp8   e4m3 `[N, K]`, float32 scales per 128 × 128 block `[⌈N/128⌉, ⌈K/128⌉]`

Program (pid_n, pid_k) owns BLOCK_N output columns over K slice pid_k and reads each weight tile `[BLOCK_N,
BLOCK_K]` once for all M rows (M ≤ M_PAD, the rows padded to a power of two; tensor-core variant: ≥ 16). A tile lies
inside one int4 group / one FP8 128-block (BLOCK_K divides G, resp. 128), so its scale multiplies the tile's fp32
partial: the integers (q − z) and the e4m3 values are exact in fp32 and in bf16 / fp16, the sums are fp32.
Products (DOT, compile-time; `_tile`'s MODE):
  "dot"  the tile in x's dtype, `tl.dot` against xᵀ `[BLOCK_K, M_PAD]` (tensor cores; fp32 x: IEEE); int4 with
         MAGIC: the bits 0x4300 | q are the bf16 128 + q (0x6400 | q the fp16 1024 + q), fed as they are, and
         (128 + z) · Σ_k x taken off the tile's fp32 partial (no subtraction an element; the offset's fp32
         accumulation errs by ≲ 2⁻¹⁷ of Σ|x| a tile, far inside the bf16 / fp16 output's rounding; fp32 x: q − z)
  "fma"  int4: each word unpacked in its own registers, nibble j at a time (no reshape of the tile), (q − z) as an
         exact fp32 (MAGIC: the bits 0x4B000000 | q are 2²³ + q, minus 2²³ + z, no conversion instruction) times
         x's column 8i + j (x `[M_PAD, BLOCK_K/8, 8]` split along its last axis), the products kept per word column
         `[BLOCK_N, M_PAD, BLOCK_K/8]` and summed across threads once, after the loop; FP8 of one row: the widened
         tile times x kept `[BLOCK_N, BLOCK_K]`, summed after the loop; FP8 of more rows: summed per tile
PREFETCH: the next tile's weight loads issued by hand before this tile's math (else the compiler's pipeline,
num_stages). Split-K: `_splitk_triton.store_tile` (SPLIT 0: one slice, stored with bias / residual; 1: each slice's
fp32 partial `[S, M, N]` written, summed in slice order by `split_reduce_kernel` — no atomics; 2: summed by the tile's
last slice to arrive, its arrival counter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.fast.kernels._splitk_triton import plan_splits, store_tile

__all__ = ["launch"]


@triton.jit
def _load_tile(q_ptr, offs_n, n_mask, k0, k_end, K, stride_qn, stride_qk, FORMAT: tl.constexpr,
               EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The raw weight tile at K offset k0 (nothing past k_end): int32 words `[BLOCK_N, BLOCK_K/8]` or e4m3
    `[BLOCK_N, BLOCK_K]`, masked-out entries 0."""
    live = n_mask & (offs_n * 0 + k0 < k_end)
    rows = offs_n[:, None].to(tl.int64) * stride_qn
    if FORMAT == 0:  # (K is a multiple of G and BLOCK_K divides G: whole tiles)
        words = (k0 // 8 + tl.arange(0, BLOCK_K // 8)).to(tl.int64)
        raw = tl.load(q_ptr + rows + words[None, :] * stride_qk, mask=live[:, None], other=0)
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            raw = tl.load(q_ptr + rows + offs_k[None, :], mask=live[:, None], other=0.0)
        else:
            raw = tl.load(q_ptr + rows + offs_k[None, :], mask=live[:, None] & (offs_k[None, :] < K), other=0.0)
    return raw


@triton.jit
def _load_x(x_rows, m_mask, k0, K, NIBBLES: tl.constexpr, BLOCK_K: tl.constexpr):
    """The activation tile at K offset k0: `[M_PAD, BLOCK_K]`, or (NIBBLES) `[M_PAD, BLOCK_K/8, 8]` (k = 8i + j);
    padded rows and columns past K (a prefetch past the end included) 0."""
    if NIBBLES:
        offs_k = k0 + 8 * tl.arange(0, BLOCK_K // 8)[:, None] + tl.arange(0, 8)[None, :]
        xr = tl.load(x_rows[:, :, None] + offs_k[None, :, :],
                     mask=m_mask[:, None, None] & (offs_k[None, :, :] < K), other=0.0)
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xr = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    return xr


@triton.jit
def _dot_tile(raw, z, dtype: tl.constexpr, FORMAT: tl.constexpr, MAGIC: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """The dot's weight tile `[BLOCK_N, BLOCK_K]` in dtype and the offset it carries per column `[BLOCK_N]` (fp32):
    int4 with MAGIC 128 + q (the bf16 bits 0x4300 | q; 2: the fp16 1024 + q) and 128 + z (1024 + z), else q − z
    and 0; e4m3 widened, 0. Exact either way."""
    if FORMAT == 0:
        q = (raw[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF  # [BLOCK_N, BLOCK_K/8, 8]: k = 8i + j
        q = tl.reshape(q, (BLOCK_N, BLOCK_K))
        if MAGIC == 1:
            w = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
            off = (z + 128).to(tl.float32)
        elif MAGIC == 2:
            w = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
            off = (z + 1024).to(tl.float32)
        else:
            w = q - z[:, None]
            off = z.to(tl.float32) * 0.0
    else:
        w = raw
        off = z.to(tl.float32) * 0.0
    return w.to(dtype), off


@triton.jit
def _nibble(part, words, j: tl.constexpr, z, xj, MAGIC: tl.constexpr):
    """part + (q_j − z) · x_j `[BLOCK_N, M_PAD, BLOCK_K/8]` (one FMA each): nibble j of each word (uint32 `[BLOCK_N,
    BLOCK_K/8]`) as an exact fp32 (MAGIC 3: the bits 0x4B000000 | q are 2²³ + q, minus 2²³ + z), times its rows' x
    `[M_PAD, BLOCK_K/8]`."""
    if MAGIC == 3:
        q = ((words >> (4 * j)) & 0xF) | 0x4B000000
        w = q.to(tl.float32, bitcast=True) - (z + 8388608).to(tl.float32)[:, None]
    else:
        w = (((words >> (4 * j)) & 0xF).to(tl.int32) - z[:, None]).to(tl.float32)
    return part + w[:, None, :] * xj[None, :, :]


@triton.jit
def _int4_fma(raw, xt, z, MAGIC: tl.constexpr, M_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ_j (q − z) · x over each word's 8 nibbles, fp32 `[BLOCK_N, M_PAD, BLOCK_K/8]`: the words unpacked in their
    own registers (no reshape), x `[M_PAD, BLOCK_K/8, 8]` split into its 8 nibble columns."""
    xb = tl.reshape(xt.to(tl.float32), (M_PAD, BLOCK_K // 8, 2, 2, 2))  # j = 4 b2 + 2 b1 + b0
    x_even, x_odd = tl.split(xb)  # b0
    x04, x26 = tl.split(x_even)
    x15, x37 = tl.split(x_odd)
    x0, x4 = tl.split(x04)
    x2, x6 = tl.split(x26)
    x1, x5 = tl.split(x15)
    x3, x7 = tl.split(x37)
    words = raw.to(tl.uint32, bitcast=True)  # (logical shifts)
    part = _nibble(tl.zeros((raw.shape[0], M_PAD, BLOCK_K // 8), tl.float32), words, 0, z, x0, MAGIC)
    part = _nibble(part, words, 1, z, x1, MAGIC)
    part = _nibble(part, words, 2, z, x2, MAGIC)
    part = _nibble(part, words, 3, z, x3, MAGIC)
    part = _nibble(part, words, 4, z, x4, MAGIC)
    part = _nibble(part, words, 5, z, x5, MAGIC)
    part = _nibble(part, words, 6, z, x6, MAGIC)
    return _nibble(part, words, 7, z, x7, MAGIC)


@triton.jit
def _tile(acc, raw, xr, z, s, FORMAT: tl.constexpr, MODE: tl.constexpr, MAGIC: tl.constexpr, IEEE: tl.constexpr,
          M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc plus this tile's products times its scale s `[BLOCK_N]` (per-column FP8: 1, scaled at the end), by
    MODE: 0 dot (acc `[BLOCK_N, M_PAD]`), 1 int4 FMA (acc `[BLOCK_N, M_PAD, BLOCK_K/8]`), 2 FP8 FMA of one row
    (acc `[BLOCK_N, BLOCK_K]`), 3 FP8 FMA summed per tile (acc `[BLOCK_N, M_PAD]`)."""
    if MODE == 0:
        w, off = _dot_tile(raw, z, xr.dtype, FORMAT, MAGIC, BLOCK_N, BLOCK_K)
        if IEEE:
            part = tl.dot(w, tl.trans(xr), input_precision="ieee")
        else:
            part = tl.dot(w, tl.trans(xr))
        if FORMAT == 0 and MAGIC != 0:  # (the offset's products: (128 + z) · Σ_k x, off the fp32 partial)
            part -= off[:, None] * tl.sum(xr.to(tl.float32), axis=1)[None, :]
        acc += part * s[:, None]
    elif MODE == 1:
        acc += _int4_fma(raw, xr, z, MAGIC, M_PAD, BLOCK_K) * s[:, None, None]
    elif MODE == 2:
        x1 = tl.sum(xr.to(tl.float32), axis=0)  # (one row: [BLOCK_K])
        acc += raw.to(tl.float32) * s[:, None] * x1[None, :]
    else:
        part = tl.sum(raw.to(tl.float32)[:, None, :] * xr.to(tl.float32)[None, :, :], axis=2)
        acc += part * s[:, None]
    return acc


# M and the slice length are not specialized: one binary serves every row count ≤ M_PAD and every split.
@triton.jit(do_not_specialize=["M", "k_per_split"])
def _gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr,
                 M, N, K, k_per_split, stride_xm, stride_qn, stride_qk, stride_s, stride_rm, stride_om,
                 FORMAT: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr, DOT: tl.constexpr,
                 MAGIC: tl.constexpr, IEEE: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
                 EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                 M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    MODE: tl.constexpr = 0 if DOT else (1 if FORMAT == 0 else (2 if M_PAD == 1 else 3))
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if MODE == 1:
        acc = tl.zeros((BLOCK_N, M_PAD, BLOCK_K // 8), dtype=tl.float32)
    elif MODE == 2:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    ones = tl.full((BLOCK_N,), 1.0, tl.float32)
    if PREFETCH:  # the first tiles, ahead of the loop
        raw = _load_tile(q_ptr, offs_n, n_mask, k_start, k_end, K, stride_qn, stride_qk, FORMAT, EVEN_K, BLOCK_K)
        xr = _load_x(x_rows, m_mask, k_start, K, MODE == 1, BLOCK_K)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        if PREFETCH:  # the next tiles' loads issued before this tile's math
            raw_next = _load_tile(q_ptr, offs_n, n_mask, k0 + BLOCK_K, k_end, K, stride_qn, stride_qk, FORMAT,
                                  EVEN_K, BLOCK_K)
            x_next = _load_x(x_rows, m_mask, k0 + BLOCK_K, K, MODE == 1, BLOCK_K)
        else:
            raw = _load_tile(q_ptr, offs_n, n_mask, k0, k_end, K, stride_qn, stride_qk, FORMAT, EVEN_K, BLOCK_K)
            xr = _load_x(x_rows, m_mask, k0, K, MODE == 1, BLOCK_K)
        if FORMAT == 0:  # one group per tile: its zeros and scales `[BLOCK_N]`
            zs = (k0 // GROUP) * stride_s + offs_n
            z = tl.load(z_ptr + zs, mask=n_mask, other=0).to(tl.int32)
            s = tl.load(s_ptr + zs, mask=n_mask, other=0.0).to(tl.float32)
        elif FORMAT == 2:  # one 128-block of K per tile; the block row varies along N
            z = offs_n * 0
            s = tl.load(s_ptr + (offs_n // 128) * stride_s + k0 // 128, mask=n_mask, other=0.0)
        else:
            z = offs_n * 0
            s = ones
        acc = _tile(acc, raw, xr, z, s, FORMAT, MODE, MAGIC, IEEE, M_PAD, BLOCK_N, BLOCK_K)
        if PREFETCH:
            raw = raw_next
            xr = x_next
    if MODE == 1:
        acc = tl.sum(acc, axis=2)
    elif MODE == 2:
        acc = tl.sum(acc, axis=1)[:, None]
    if FORMAT == 1:  # (per-column scales: once, on the slice's sum)
        acc = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    store_tile(acc, offs_m, offs_n, M, N, mask, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr, stride_rm, stride_om, HAS_BIAS,
               HAS_RES, SPLIT)


def _magic(config, dtype) -> int:
    """The int4 bit trick (config.unpack "magic"): 3 fp32 (fma), 1 bf16 / 2 fp16 (dot), 0 none."""
    if config.unpack != "magic":
        return 0
    if config.variant == "fma":
        return 3
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


def launch(x: torch.Tensor, fmt: int, q: torch.Tensor, stride_qn: int, stride_qk: int, zeros, scales: torch.Tensor,
           group: int, n: int, bias, residual, out: torch.Tensor, config, split_k: int) -> None:
    """out `[M, N]` = x `[M, K]` @ Wᵀ (+ bias) (+ residual `[M, N]`), M ≤ 8, W given by (fmt, q and its two strides,
    zeros, scales) as the module doc lays out; x, residual and out row-contiguous. config: `quant_gemv.GemvConfig`
    (block_k already fitted to the format), split_k: the K slices asked for."""
    m, k = x.shape
    dot = config.variant == "dot"
    m_pad = max(16 if dot else 1, triton.next_power_of_2(m))
    sk = plan_splits(x, out, block_m=m_pad, block_n=config.block_n, block_k=config.block_k, split_k=split_k,
                     fused=config.reduce == "fused")
    dummy = out
    _gemv_kernel[sk.grid[:2]](
        x, q, zeros if zeros is not None else dummy, scales, bias if bias is not None else dummy,
        residual if residual is not None else dummy, out, sk.partial, sk.counters,
        m, n, k, sk.k_per_split, x.stride(0), stride_qn, stride_qk, scales.stride(0) if scales.dim() == 2 else 0,
        residual.stride(0) if residual is not None else 0, out.stride(0),
        FORMAT=fmt, GROUP=group, SPLIT=sk.mode, DOT=dot, MAGIC=_magic(config, x.dtype),
        IEEE=x.dtype == torch.float32, PREFETCH=config.prefetch, STAGES=config.num_stages,
        EVEN_K=k % config.block_k == 0, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        M_PAD=m_pad, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages)
    sk.reduce(bias, residual, out)
