"""What the weight-streaming GEMMs (`_linear_triton`, dense; `quant_triton`, int4 / FP8) share: their output tiles,
the split-K books and the epilogue (imported only where Triton is installed).

Program (pid_n, pid_k, pid_m) computes out[m-block, n-block] over K slice pid_k, its tile held transposed
`[BLOCK_N, BLOCK_M]` (`tile_offsets`). With one slice it adds bias / residual and stores (`epilogue`); with several,
each slice writes an fp32 partial `[S, M, N]`, summed in slice order (deterministic, the same bits either way) by
the tile's last slice to arrive (an int32 arrival counter per tile: no second launch, mode 2) or by
`split_reduce_kernel` (mode 1; also when the counters cannot be set up inside a graph capture): `store_tile`.
`plan_splits` sizes the slices and scratch of one launch, `SplitK.reduce` runs the second kernel where mode 1 needs
it. Launches on one stream at a time share the per-device counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["SplitK", "plan_splits", "tile_offsets", "store_tile", "epilogue", "split_reduce_kernel", "counters"]


@triton.jit
def tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's K slice pid_k, its output columns `[BLOCK_N]` and rows `[BLOCK_M]`, with their in-bounds
    masks."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    return pid_k, offs_n, offs_m, offs_n < N, offs_m < M


@triton.jit
def epilogue(acc, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om,
             HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """out[m, n] = acc[n, m] (+ bias[n]) (+ residual[m, n]) in fp32, cast to out's dtype."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
    if HAS_RES:
        acc += tl.load(r_ptr + offs_m[None, :] * stride_rm + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_tile(acc, offs_m, offs_n, M, N, mask, b_ptr, r_ptr, o_ptr, p_ptr, c_ptr, stride_rm, stride_om,
               HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT: tl.constexpr):
    """The tile's fp32 sum acc `[BLOCK_N, BLOCK_M]` of this program's K slice, finished as `SPLIT` (the module doc's
    mode) says: stored (0), or its partial p[pid_k, m, n] written and summed over the slices in slice order by the
    reduce kernel (1) or by the tile's last slice to arrive (2)."""
    if SPLIT == 0:
        epilogue(acc, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)
    else:
        p_tile = p_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(p_tile + tl.program_id(1) * M * N, acc, mask=mask)
        if SPLIT == 2:
            num_splits = tl.num_programs(1)
            counter = c_ptr + tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
            tl.debug_barrier()  # every thread's partial stores precede the release below
            arrived = tl.atomic_add(counter, 1, sem="acq_rel")
            if arrived == num_splits - 1:
                total = tl.zeros_like(acc)
                for s in range(0, num_splits):
                    total += tl.load(p_tile + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                epilogue(total, offs_m, offs_n, N, mask, b_ptr, r_ptr, o_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)
                tl.atomic_xchg(counter, 0)  # zero again for the next launch


@triton.jit(do_not_specialize=["M", "num_splits"])
def split_reduce_kernel(p_ptr, b_ptr, r_ptr, o_ptr, M, N, num_splits, stride_rm, stride_om,
                        HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """Row m, BLOCK columns: the partials `[S, M, N]` summed in slice order (fp32), + bias, + residual, stored."""
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


_COUNTERS: dict[torch.device, torch.Tensor] = {}  # per device: one int32 arrival counter per output tile, all 0
_OUTGROWN: list[torch.Tensor] = []  # replaced counter buffers stay alive: captured graphs may still point at them


def counters(device: torch.device, size: int) -> torch.Tensor | None:
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


@dataclass(frozen=True)
class SplitK:
    """One launch's K slicing: grid (column blocks, slices, row blocks), K per slice (whole tiles), the mode
    `store_tile` finishes by (0 one slice, 1 the reduce kernel, 2 the last slice to arrive), the fp32 partials
    `[S, M, N]` and the arrival counters (both `out` itself where unused: never read then), and whether the slices
    tile K exactly (even_k: no mask along K)."""

    grid: tuple[int, int, int]
    k_per_split: int
    splits: int
    mode: int
    partial: torch.Tensor
    counters: torch.Tensor
    even_k: bool

    def reduce(self, bias, residual, out: torch.Tensor) -> None:
        """Mode 1: sum the partials into out (+ bias) (+ residual) with the second kernel; otherwise nothing."""
        if self.mode != 1:
            return
        m, n = out.shape
        block = min(1024, triton.next_power_of_2(n))
        split_reduce_kernel[(triton.cdiv(n, block), m)](
            self.partial, bias if bias is not None else out, residual if residual is not None else out, out,
            m, n, self.splits, residual.stride(0) if residual is not None else 0, out.stride(0),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, BLOCK=block, num_warps=4)


def plan_splits(x: torch.Tensor, out: torch.Tensor, *, block_m: int, block_n: int, block_k: int, split_k: int,
                fused: bool) -> SplitK:
    """The slicing of out `[M, N]` = x `[M, K]` @ Wᵀ into tiles of block_m rows and block_n columns and about
    `split_k` slices of K (each a whole number of block_k tiles); fused: the last slice sums (mode 2) where the
    counters can be had, else the reduce kernel (mode 1)."""
    (m, k), n = x.shape, out.shape[1]
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, block_m))
    partial, arrivals, mode = out, out, 0
    if splits > 1:
        partial = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
        ready = counters(x.device, grid[0] * grid[2]) if fused else None
        mode, arrivals = (1, out) if ready is None else (2, ready)
    return SplitK(grid, k_per_split, splits, mode, partial, arrivals, splits * k_per_split == k)
