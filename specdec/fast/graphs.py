"""CUDA-graph capture of a static-shape step: static inputs are copied in, the graph replays, outputs are read.

A step function may mutate state (it writes KV slots and moves `lengths`); warm-up runs happen before the
capture on a side stream, so `capture` saves and restores the tensors named in `restore`. Graphs of one
owner share a memory pool (they are replayed one at a time).

`graph_time_us` is the one "time a function inside a CUDA graph" clock of the library and its benchmarks (the
kernel choice in `kernels.linear_choice`, `bench.device.time_call`, the bitwise kernels' script): no host launch
cost, the device's own time per call.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import torch


class CapturedStep:
    """`fn()` captured once; `replay()` re-runs it on whatever the static input tensors hold."""

    def __init__(self, fn: Callable[[], object], *, pool=None, restore: Sequence[torch.Tensor] = (), warmup: int = 2):
        saved = [t.clone() for t in restore]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # first calls allocate, pick kernels, fill lazy tables
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        for t, s in zip(restore, saved):
            t.copy_(s)
        self.graph = torch.cuda.CUDAGraph()
        # No garbage collection while capturing: a collected cycle that holds CUDA graphs (an engine dropped
        # earlier) would destroy them mid-capture, which CUDA forbids and which invalidates this capture.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = fn()
        finally:
            if collecting:
                gc.enable()
        for t, s in zip(restore, saved):  # capture records kernels without running them; be safe anyway
            t.copy_(s)

    def replay(self):
        self.graph.replay()
        return self.outputs


def graph_time_us(fn: Callable[[], object], *, calls: int = 1, reps: int = 20, warmup: int = 2) -> float:
    """µs per call of `fn` on the device: `calls` calls captured in one CUDA graph (after `warmup` calls on a side
    stream, so compiles, kernel picks and allocations stay outside the capture), replayed once untimed, then `reps`
    replays each timed with CUDA events; the median replay / `calls`. `fn` must be capturable (no host sync)."""
    if not torch.cuda.is_available():
        raise ValueError("graph_time_us needs a CUDA device")
    for name, value, least in (("calls", calls, 1), ("reps", reps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    times.sort()
    return times[len(times) // 2]


def graph_options(device: torch.device, max_draft_tokens, cuda_graphs) -> tuple[int, bool]:
    """The fast wrappers' two options, checked: (max_draft_tokens ≥ 1, whether to capture graphs: None = on CUDA)."""
    if isinstance(max_draft_tokens, bool) or not isinstance(max_draft_tokens, int) or max_draft_tokens < 1:
        raise ValueError(f"max_draft_tokens must be an integer >= 1, got {max_draft_tokens!r}")
    on_cuda = device.type == "cuda"
    if cuda_graphs and not on_cuda:
        raise ValueError("cuda_graphs=True needs the model on a CUDA device")
    return max_draft_tokens, on_cuda if cuda_graphs is None else bool(cuda_graphs)


def new_pool():
    return torch.cuda.graph_pool_handle()
