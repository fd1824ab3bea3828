"""Choosing cuBLAS or `kernels.linear`'s weight-streaming kernel per weight shape by measuring both on this device.

`linear.FASTER_THAN_CUBLAS` is a fixed table from one H200 run; this measures instead (at warm-up, or in
scripts/profile_decode.py's A/B). Each shape is timed over a group of weights of that shape (e.g. every layer's
q|k|v), one call per weight replayed from a CUDA graph, so that the pass streams the weights from HBM as a decode
step does (one matrix called repeatedly would sit in L2) and no host launch cost is counted.

    timings = [time_gemms(group, rows=m) for group in groups for m in (1, 5)]
    shapes = faster_shapes(timings)          # → FastLlama.triton_linear_shapes
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from specdec.fast.graphs import graph_time_us
from specdec.fast.kernels.linear import linear

__all__ = ["GemmTiming", "time_gemms", "faster_shapes"]


@dataclass(frozen=True)
class GemmTiming:
    """µs per call of each GEMM kind for one weight shape `[n, k]` at `rows` activation rows (over `weights`
    matrices), and the bandwidth each reaches on the weight bytes."""

    n: int
    k: int
    rows: int
    weights: int
    cublas_us: float
    triton_us: float
    weight_bytes: int

    @property
    def cublas_GBps(self) -> float:
        return self.weight_bytes / (self.cublas_us * 1e3)

    @property
    def triton_GBps(self) -> float:
        return self.weight_bytes / (self.triton_us * 1e3)


def time_gemms(weights: Sequence[torch.Tensor], rows: int = 1, reps: int = 20) -> GemmTiming:
    """Time `x [rows, k] @ wᵀ` for every w of `weights` (CUDA tensors `[n, k]` of one shape and dtype) with
    cuBLAS (`torch.mm`, as `F.linear` calls it) and with `linear(kernel="triton")`; µs per call."""
    if not weights:
        raise ValueError("time_gemms needs at least one weight")
    first = weights[0]
    if not first.is_cuda or any(w.shape != first.shape or w.dtype != first.dtype for w in weights):
        raise ValueError("time_gemms needs CUDA weights of one shape and dtype")
    if not 1 <= rows <= 16:
        raise ValueError(f"rows must be in [1, 16] (the kernel's range), got {rows}")
    n, k = first.shape
    x = torch.randn(rows, k, device=first.device, dtype=first.dtype)
    outs = [torch.empty(rows, n, device=first.device, dtype=first.dtype) for _ in range(2)]

    def cublas():
        for i, w in enumerate(weights):
            torch.mm(x, w.t(), out=outs[i % 2])

    def triton():
        for i, w in enumerate(weights):
            linear(x, w, out=outs[i % 2], kernel="triton")

    per = len(weights)
    return GemmTiming(n, k, rows, per, graph_time_us(cublas, reps=reps) / per, graph_time_us(triton, reps=reps) / per,
                      first.numel() * first.element_size())


def faster_shapes(timings: Iterable[GemmTiming], margin: float = 0.0) -> frozenset[tuple[int, int]]:
    """The (n, k) shapes whose Triton time beat cuBLAS's by more than `margin` (a fraction) at every row count
    timed."""
    by_shape: dict[tuple[int, int], bool] = {}
    for t in timings:
        wins = t.triton_us < t.cublas_us * (1.0 - margin)
        by_shape[(t.n, t.k)] = by_shape.get((t.n, t.k), True) and wins
    return frozenset(shape for shape, wins in by_shape.items() if wins)
