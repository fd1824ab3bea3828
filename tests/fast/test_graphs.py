"""`fast.graphs.graph_time_us`, the library's one CUDA-graph clock: its checks on any machine, its timing on a GPU."""

import pytest
import torch

from specdec.fast.graphs import graph_time_us


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_graph_time_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        graph_time_us(lambda: None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_time_counts_per_call_and_keeps_warmup_outside():
    x = torch.zeros(1 << 24, device="cuda")
    seen = []

    def fn():
        seen.append(torch.cuda.is_current_stream_capturing())
        x.add_(1.0)

    one = graph_time_us(fn, calls=1, reps=5, warmup=2)
    assert seen == [False, False, True]  # two warm-up calls, then one captured call (replays do not call fn)
    many = graph_time_us(fn, calls=8, reps=5)
    assert one > 0 and many > 0 and 0.5 * one < many < 2.0 * one  # per call, not per replay of 8 calls
    with pytest.raises(ValueError, match="calls must be an integer >= 1"):
        graph_time_us(fn, calls=0)
