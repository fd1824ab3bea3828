"""CUDA-graph capture of a static-shape step: static inputs are copied in, the graph replays, outputs are read.

A step function may mutate state (it writes KV slots and moves `lengths`); warm-up runs happen before the
capture on a side stream, so `capture` saves and restores the tensors named in `restore`. Graphs of one
owner share a memory pool (they are replayed one at a time).
"""

from __future__ import annotations

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
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()
        for t, s in zip(restore, saved):  # capture records kernels without running them; be safe anyway
            t.copy_(s)

    def replay(self):
        self.graph.replay()
        return self.outputs


def new_pool():
    return torch.cuda.graph_pool_handle()
