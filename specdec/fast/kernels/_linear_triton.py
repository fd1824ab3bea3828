"""Triton kernels behind `specdec.fast.kernels.linear` (imported only where Triton is installed).

Program (pid_n, pid_k, pid_m) computes out[m-block, n-block] over K slice pid_k. Tiles are held transposed,
`[BLOCK_N, BLOCK_M]`, so the weight tile is the wide operand of `tl.dot` (Hopper's wgmma wants ≥ 64 rows on
that side) and the few activation rows are the narrow one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# M is not specialized (Triton would compile M = 1 and M % 16 == 0 apart): one binary serves every row count.
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr,
                   M, N, K, k_per_split,
                   stride_xm, stride_xk, stride_wn, stride_rm, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT: tl.constexpr, FMA: tl.constexpr,
                   IEEE: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
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
    if SPLIT == 0:
        _epilogue(acc, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)
    else:
        # Partial product of this K slice: p[pid_k, m, n], summed over the slices in a fixed order (deterministic)
        # by _split_reduce_kernel (SPLIT == 1) or here by the tile's last slice to finish (SPLIT == 2).
        p_tile = p_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(p_tile + pid_k * M * N, acc, mask=mask)
        if SPLIT == 2:
            num_splits = tl.num_programs(1)
            counter = c_ptr + pid_m * tl.num_programs(0) + pid_n
            tl.debug_barrier()  # every thread's partial stores precede the release below
            arrived = tl.atomic_add(counter, 1, sem="acq_rel")
            if arrived == num_splits - 1:
                total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for s in range(0, num_splits):
                    total += tl.load(p_tile + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(total, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)
                tl.atomic_xchg(counter, 0)  # zero again for the next launch


@triton.jit
def _epilogue(acc, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """out[m, n] = acc[n, m] (+ bias[n]) (+ residual[m, n]) in fp32, cast to out's dtype."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
    if HAS_RES:
        acc += tl.load(r_ptr + offs_m[None, :] * stride_rm + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "num_splits"])
def _split_reduce_kernel(p_ptr, b_ptr, r_ptr, o_ptr, M, N, num_splits, stride_rm, stride_om,
                         HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    offs = pid_n * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, num_splits):
        acc += tl.load(p_ptr + s * M * N + m * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(r_ptr + m * stride_rm + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + offs, acc.to(o_ptr.dtype.element_ty), mask=mask)


def _block_m(m: int, variant: str) -> int:
    """Rows per program: 16 for tl.dot (its smallest operand side); a power of two ≤ 16 for the FMA variant."""
    if variant == "dot":
        return 16
    return min(16, triton.next_power_of_2(m))


_COUNTERS: dict[torch.device, torch.Tensor] = {}  # per device: one int32 arrival counter per output tile, all 0
_OUTGROWN: list[torch.Tensor] = []  # replaced counter buffers stay alive: captured graphs may still point at them


def _counters(device: torch.device, size: int) -> torch.Tensor | None:
    """Zeroed arrival counters for `size` tiles (the kernel leaves them zero), or None while a CUDA graph is being
    captured and none are ready: an allocation made during capture is zeroed only when the graph replays."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < size:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = _COUNTERS[device] = torch.zeros(max(size, 4096), dtype=torch.int32, device=device)
    return buf


def launch(x: torch.Tensor, weight: torch.Tensor, bias, residual, out: torch.Tensor, config,
           split_reduce: str = "fused") -> None:
    """out `[M, N]` = x `[M, K]` @ weight `[N, K]`ᵀ (+ bias) (+ residual `[M, N]`); all rows K/N-contiguous.

    split_reduce: "fused" (the last K slice of each tile sums the partials: no second launch; falls back to
    "kernel" when the counters cannot be set up) or "kernel" (a second small kernel sums them). Both add the
    partials in the same order, so they give the same bits. Launches on one stream at a time share the counters.
    """
    m, k = x.shape
    n = weight.shape[0]
    block_k = config.block_k
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    block_m = _block_m(m, config.variant)
    grid = (triton.cdiv(n, config.block_n), splits, triton.cdiv(m, block_m))
    dummy = out  # never read where its flag is off
    partial, counters, mode = dummy, dummy, 0
    if splits > 1:
        partial = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
        counters = _counters(x.device, grid[0] * grid[2]) if split_reduce == "fused" else None
        mode = 1 if counters is None else 2
        counters = dummy if counters is None else counters
    _linear_kernel[grid](
        x, weight, bias if bias is not None else dummy, residual if residual is not None else dummy, out, partial,
        counters, m, n, k, k_per_split,
        x.stride(0), x.stride(1), weight.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, SPLIT=mode, FMA=config.variant == "fma",
        IEEE=x.dtype == torch.float32, EVEN_K=k % block_k == 0 and splits * k_per_split == k, STAGES=config.num_stages,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k,
        num_warps=config.num_warps, num_stages=config.num_stages)
    if mode == 1:
        block = min(1024, triton.next_power_of_2(n))
        _split_reduce_kernel[(triton.cdiv(n, block), m)](
            partial, bias if bias is not None else dummy, residual if residual is not None else dummy, out,
            m, n, splits, residual.stride(0) if residual is not None else 0, out.stride(0),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, BLOCK=block, num_warps=4)
