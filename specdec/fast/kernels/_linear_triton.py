"""Triton kernels behind `specdec.fast.kernels.linear` (imported only where Triton is installed).

Program (pid_n, pid_k, pid_m) computes out[m-block, n-block] over K slice pid_k. Tiles are held transposed,
`[BLOCK_N, BLOCK_M]`, so the weight tile is the wide operand of `tl.dot` (Hopper's wgmma wants ≥ 64 rows on
that side) and the few activation rows are the narrow one. The tiles, the split-K books and the epilogue are
`_splitk_triton`'s (shared with the quantized GEMM, `quant_triton`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.fast.kernels._splitk_triton import plan_splits, store_tile, tile_offsets


# M is not specialized (Triton would compile M = 1 and M % 16 == 0 apart): one binary serves every row count.
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr,
                   M, N, K, k_per_split,
                   stride_xm, stride_xk, stride_wn, stride_rm, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT: tl.constexpr, FMA: tl.constexpr,
                   IEEE: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_k, offs_n, offs_m, n_mask, m_mask = tile_offsets(M, N, BLOCK_M, BLOCK_N)
    # Slices are whole tiles (k_per_split is a multiple of BLOCK_K); only K's end needs a mask, and none where
    # EVEN_K (the slices tile K exactly). Tiles of the last slice past K are fully masked (no memory traffic).
    k_start = pid_k * k_per_split
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K], K contiguous
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk  # [BLOCK_M, BLOCK_K]
    if FMA:
        acc3 = tl.zeros((BLOCK_N, BLOCK_M, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # The weight loads are pipelined by the compiler (cp.async, STAGES deep: tl.range's num_stages makes that hold
    # for the FMA variant too); the activation tile of the dot variant is not, so it is prefetched by hand one
    # tile ahead (an L2 hit, but its latency would otherwise stall each step).
    xr = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    for _ in tl.range(0, k_per_split, BLOCK_K, num_stages=STAGES):  # the pointers carry the position
        if EVEN_K:
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K * stride_xk
        offs_k += BLOCK_K
        x_next = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        if FMA:
            acc3 += w.to(tl.float32)[:, None, :] * xr.to(tl.float32)[None, :, :]
        elif IEEE:
            acc = tl.dot(w, tl.trans(xr), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(xr), acc)
        xr = x_next
    if FMA:
        acc = tl.sum(acc3, axis=2)
    mask = n_mask[:, None] & m_mask[None, :]
    store_tile(acc, offs_m, offs_n, M, N, mask, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr, stride_rm, stride_om, HAS_BIAS,
               HAS_RES, SPLIT)  # (SPLIT: `_splitk_triton`'s mode — one slice, the reduce kernel, or fused)


def _block_m(m: int, variant: str) -> int:
    """Rows per program: 16 for tl.dot (its smallest operand side); a power of two ≤ 16 for the FMA variant."""
    if variant == "dot":
        return 16
    return min(16, triton.next_power_of_2(m))


def launch(x: torch.Tensor, weight: torch.Tensor, bias, residual, out: torch.Tensor, config,
           split_reduce: str = "fused") -> None:
    """out `[M, N]` = x `[M, K]` @ weight `[N, K]`ᵀ (+ bias) (+ residual `[M, N]`); all rows K/N-contiguous.

    split_reduce: "fused" (the last K slice of each tile sums the partials: no second launch; falls back to
    "kernel" when the counters cannot be set up) or "kernel" (a second small kernel sums them). Both add the
    partials in the same order, so they give the same bits. Launches on one stream at a time share the counters.
    """
    m, k = x.shape
    block_m = _block_m(m, config.variant)
    sk = plan_splits(x, out, block_m=block_m, block_n=config.block_n, block_k=config.block_k,
                     split_k=config.split_k, fused=split_reduce == "fused")
    dummy = out  # never read where its flag is off
    _linear_kernel[sk.grid](
        x, weight, bias if bias is not None else dummy, residual if residual is not None else dummy, out, sk.partial,
        sk.counters, m, weight.shape[0], k, sk.k_per_split,
        x.stride(0), x.stride(1), weight.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, SPLIT=sk.mode, FMA=config.variant == "fma",
        IEEE=x.dtype == torch.float32, EVEN_K=sk.even_k, STAGES=config.num_stages,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages)
    sk.reduce(bias, residual, out)
