"""Triton kernel behind `specdec.fast.kernels.quant_linear`: y = x @ Wᵀ with W read quantized (imported only where
Triton is installed).

One kernel, three weight formats (FORMAT, a compile-time constant):
  0  int4  qweight int32 `[N, K/8]` (k = 8i + j in bits 4j..4j+3 of word i of row n: GPTQ's words, transposed so a
           row's words are contiguous), zeros uint8 and scales `[K/G, N]`: w[n, k] = (q − z) · s per group of G
  1  fp8   weight e4m3 `[N, K]`, one float32 scale per output column `[N]` (per-tensor scales are broadcast)
  2  fp8   weight e4m3 `[N, K]`, float32 scales per 128 × 128 block `[⌈N/128⌉, ⌈K/128⌉]`

int4 unpacking (config.unpack): "reshape" loads each packed int32 once and spreads its 8 nibbles along K in
registers; "gather" loads it once per nibble (the repeats are L1 hits) and shifts each by its own amount; a
"-magic" suffix turns a nibble into bf16 / fp16 / fp32 without a conversion instruction (the bits 0x4300 | q are the
bf16 128 + q, 0x6400 | q the fp16 1024 + q, 0x4B000000 | q the fp32 2²³ + q; minus the same + z: exact).

Variants (config.variant): "dot" (tensor cores, rows padded to 16) or "fma" (a row or a few: the dequantized fp32 weight
times x summed in registers, rows padded to a power of two ≤ block_m).

Program (pid_n, pid_k, pid_m) computes out[m-block, n-block] over K slice pid_k, tiles held transposed
`[BLOCK_N, BLOCK_M]` (the weight is the wide operand of `tl.dot`, the few activation rows the narrow one), so every
weight byte is read once per call for up to BLOCK_M rows. Dequantization stays exact: the integers (q − z) and e4m3
values are exact in bf16/fp16, the dot accumulates them in fp32 against x, and the group / block scale multiplies
the fp32 partial of its tile (int4 and block tiles are one group / block deep: BLOCK_K = G, resp. 128;
per-channel scales multiply the sum at the end, so BLOCK_K may be any power of two dividing K there).
The loop follows `_linear_triton`'s: pointers advanced per tile, the activation tile `[BLOCK_M, BLOCK_K]` fetched
by hand one tile ahead (an L2 hit whose latency would otherwise stall each step), the weight loads pipelined by the
compiler (STAGES) or, config.prefetch, also fetched one tile ahead by hand.
Split-K, the tiles and the epilogue are `_splitk_triton`'s, the dense kernel's too: each slice writes an fp32
partial `[S, M, N]`, summed in slice order (deterministic) by the tile's last slice to arrive (config.split_reduce
"fused": no second launch) or by the reduce kernel ("kernel"; also when the counters cannot be set up inside a graph
capture). Launches on one stream at a time share the counters with the dense kernel's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.fast.kernels._splitk_triton import plan_splits, store_tile, tile_offsets


@triton.jit
def _load_raw(ptrs, mask, FORMAT: tl.constexpr):
    """A weight tile, masked-out entries 0 (int4 words) or 0.0 (e4m3)."""
    if FORMAT == 0:
        raw = tl.load(ptrs, mask=mask, other=0)
    else:
        raw = tl.load(ptrs, mask=mask, other=0.0)
    return raw


@triton.jit
def _decode(raw, z, s, dtype: tl.constexpr, FORMAT: tl.constexpr, GATHER: tl.constexpr, MAGIC: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """w `[BLOCK_N, BLOCK_K]` in `dtype` from the raw tile: int4 (q − z) (GATHER: raw holds each word once per
    nibble), or the e4m3 values widened (both exact)."""
    if FORMAT == 0:
        if GATHER:
            q = (raw >> ((tl.arange(0, BLOCK_K) % 8) * 4)[None, :]) & 0xF
        else:  # the 8 nibbles of each word spread along a new axis, then merged into K (k = 8 i + j)
            q = (raw[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
            q = tl.reshape(q, (BLOCK_N, BLOCK_K))
        if MAGIC == 1:  # bf16: the bits 0x4300 | q are 128 + q (no int → float conversion), minus 128 + z
            w = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - (z + 128).to(tl.bfloat16)[:, None]
        elif MAGIC == 2:  # fp16: 0x6400 | q is 1024 + q
            w = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - (z + 1024).to(tl.float16)[:, None]
        elif MAGIC == 3:  # fp32: 0x4B000000 | q is 2²³ + q
            w = (q | 0x4B000000).to(tl.float32, bitcast=True) - (z + 8388608).to(tl.float32)[:, None]
        else:
            w = q - z[:, None]
    else:
        w = raw
    return w.to(dtype)


# M is not specialized (Triton would compile M = 1 and M % 16 == 0 apart): one binary serves every row count.
@triton.jit(do_not_specialize=["M"])
def _quant_kernel(x_ptr, q_ptr, z_ptr, s_ptr, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr,
                  M, N, K, k_per_split, stride_xm, stride_q, stride_s, stride_rm, stride_om,
                  FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT: tl.constexpr,
                  IEEE: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr, GATHER: tl.constexpr,
                  MAGIC: tl.constexpr, FMA: tl.constexpr, PREFETCH: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_k, offs_n, offs_m, n_mask, m_mask = tile_offsets(M, N, BLOCK_M, BLOCK_N)
    k_start = pid_k * k_per_split  # (a multiple of BLOCK_K; tiles of the last slice past K are fully masked)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    rows = offs_n[:, None].to(tl.int64) * stride_q
    if FORMAT == 0:  # int4: the packed words, once (or once per nibble: GATHER); one group per tile
        if GATHER:
            w_ptrs = q_ptr + rows + (k_start // 8 + tl.arange(0, BLOCK_K) // 8)[None, :]
        else:
            w_ptrs = q_ptr + rows + (k_start // 8 + tl.arange(0, BLOCK_K // 8))[None, :]
        w_step = BLOCK_K // 8
        zs_off = (k_start // BLOCK_K) * stride_s + offs_n  # zeros and scales `[K/G, N]`
        zs_step = stride_s
    else:
        w_ptrs = q_ptr + rows + offs_k[None, :]
        w_step = BLOCK_K
        zs_off = (offs_n // 128) * stride_s + k_start // 128  # block scales (FORMAT 2): one block per tile
        zs_step = 1
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    if FMA:  # few rows: products summed in fp32 registers, no tensor cores
        acc3 = tl.zeros((BLOCK_N, BLOCK_M, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    xr = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    k0 = k_start
    if PREFETCH:
        raw = _load_raw(w_ptrs, (n_mask & (offs_n * 0 + k0 < K))[:, None], FORMAT)
    for _ in tl.range(0, k_per_split, BLOCK_K, num_stages=STAGES):
        live = n_mask & (offs_n * 0 + k0 < K)  # (EVEN_K: n_mask; else the last slice's tiles past K load nothing)
        if not PREFETCH:
            if EVEN_K:
                raw = _load_raw(w_ptrs, n_mask[:, None], FORMAT)
            else:
                raw = _load_raw(w_ptrs, live[:, None], FORMAT)
        if FORMAT == 0:
            z = tl.load(z_ptr + zs_off, mask=live, other=0).to(tl.int32)
            s = tl.load(s_ptr + zs_off, mask=live, other=0.0).to(tl.float32)
        elif FORMAT == 2:
            z = offs_n * 0
            s = tl.load(s_ptr + zs_off, mask=live, other=0.0)
        else:
            z = offs_n * 0
            s = tl.full((BLOCK_N,), 1.0, tl.float32)
        w_ptrs += w_step
        zs_off += zs_step
        x_ptrs += BLOCK_K
        offs_k += BLOCK_K
        k0 += BLOCK_K
        if PREFETCH:  # the next weight tile's loads issued before this tile's math
            raw_next = _load_raw(w_ptrs, (n_mask & (offs_n * 0 + k0 < K))[:, None], FORMAT)
        x_next = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        if FMA:
            w = _decode(raw, z, s, tl.float32, FORMAT, GATHER, MAGIC, BLOCK_N, BLOCK_K)
            if FORMAT != 1:
                w = w * s[:, None]  # the dequantized fp32 weight (exact: a small integer or e4m3 times the scale)
            acc3 += w[:, None, :] * xr.to(tl.float32)[None, :, :]
        else:
            w = _decode(raw, z, s, x_ptr.dtype.element_ty, FORMAT, GATHER, MAGIC, BLOCK_N, BLOCK_K)
            if FORMAT == 1:  # (one scale per column: the products accumulate in the dot, scaled at the end)
                if IEEE:
                    acc = tl.dot(w, tl.trans(xr), acc, input_precision="ieee")
                else:
                    acc = tl.dot(w, tl.trans(xr), acc)
            else:
                if IEEE:
                    part = tl.dot(w, tl.trans(xr), input_precision="ieee")
                else:
                    part = tl.dot(w, tl.trans(xr))
                acc += part * s[:, None]
        xr = x_next
        if PREFETCH:
            raw = raw_next
    if FMA:
        acc = tl.sum(acc3, axis=2)
    if FORMAT == 1:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    store_tile(acc, offs_m, offs_n, M, N, mask, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr, stride_rm, stride_om, HAS_BIAS,
               HAS_RES, SPLIT)


def _magic(config, dtype) -> int:
    """Which bit trick turns a nibble into a float ("-magic" unpackings): 1 bf16, 2 fp16, 3 fp32, 0 none."""
    if not config.unpack.endswith("magic"):
        return 0
    if config.variant == "fma":
        return 3
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


def launch(x: torch.Tensor, fmt: int, q: torch.Tensor, zeros, scales: torch.Tensor, group: int, n: int, bias,
           residual, out: torch.Tensor, config) -> None:
    """out `[M, N]` = x `[M, K]` @ Wᵀ (+ bias) (+ residual `[M, N]`), W given by (fmt, q, zeros, scales) as the
    module doc lays out; x, residual and out row-contiguous. config: `quant_linear.QuantConfig`."""
    m, k = x.shape
    block_k = config.block_k
    if (fmt == 0 and block_k != group) or (fmt == 2 and block_k != 128) or k % block_k:
        raise ValueError(f"block_k {block_k}: int4 tiles are one group deep ({group}), block-scaled FP8 tiles 128, "
                         f"and K = {k} must be a multiple")
    block_m = config.block_m if config.variant == "dot" else min(config.block_m, triton.next_power_of_2(m))
    sk = plan_splits(x, out, block_m=block_m, block_n=config.block_n, block_k=block_k, split_k=config.split_k,
                     fused=config.split_reduce == "fused")
    dummy = out
    _quant_kernel[sk.grid](
        x, q, zeros if zeros is not None else dummy, scales, bias if bias is not None else dummy,
        residual if residual is not None else dummy, out, sk.partial, sk.counters,
        m, n, k, sk.k_per_split, x.stride(0), q.stride(0), scales.stride(0) if scales.dim() == 2 else 0,
        residual.stride(0) if residual is not None else 0, out.stride(0),
        FORMAT=fmt, HAS_BIAS=bias is not None, HAS_RES=residual is not None, SPLIT=sk.mode,
        IEEE=x.dtype == torch.float32, EVEN_K=sk.even_k, STAGES=config.num_stages,
        GATHER=config.unpack.startswith("gather"),
        MAGIC=_magic(config, x.dtype), FMA=config.variant == "fma", PREFETCH=config.prefetch,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k, num_warps=config.num_warps,
        num_stages=config.num_stages)
    sk.reduce(bias, residual, out)
