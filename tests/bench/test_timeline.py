"""The device timeline read from a torch.profiler trace (`specdec.bench.timeline`): on hand-made traces whose
answer is known (busy/idle, graph vs outside launches, copies, syncs, gaps), and on a real CPU run (no timeline)."""

from __future__ import annotations

import pytest
import torch

from specdec.bench.timeline import added_events, device_trace, summarize


def _host(name, ts, dur, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _dev(name, ts, dur, corr, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr, "stream": 7}}


def _two_engine_steps():
    """Two steps: a graph replay of two kernels (a 1 µs gap inside), a D→H copy and its sync, an eager kernel, and
    the host's bookkeeping (the GPU idle) before the next step."""
    events = []
    for step, t0 in enumerate((0.0, 100.0)):
        g, c, k = 10 * step + 1, 10 * step + 2, 10 * step + 3
        events += [_host("cudaGraphLaunch", t0, 5.0, g), _dev("gemm", t0 + 6, 40.0, g), _dev("argmax", t0 + 47, 3.0, g),
                   _host("cudaLaunchKernel", t0 + 6, 2.0, k), _dev("fill", t0 + 50, 2.0, k),
                   _host("cudaMemcpyAsync", t0 + 8, 50.0, c),
                   _dev("Memcpy DtoH (Device -> Pageable)", t0 + 53, 2.0, c, cat="gpu_memcpy"),
                   _host("cudaStreamSynchronize", t0 + 56, 1.0, 0),
                   {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": t0 + 60, "dur": 5.0}]  # not a CUDA event
    return events


def test_summary_of_a_known_trace():
    t = summarize(_two_engine_steps(), steps=2)
    # window: first host call (0) to the last end (the second step's copy call returns at 158)
    assert t.window_us == pytest.approx(158.0)
    assert t.busy_us == pytest.approx(2 * (40 + 3 + 2 + 2))
    assert t.idle_us == pytest.approx(158.0 - 94.0)
    assert t.kernels == 6 and t.kernel_us == pytest.approx(2 * 45.0) and t.graph_launches == 2
    assert {(o.name, o.count) for o in t.outside_graph} == {("fill", 2), ("Memcpy DtoH (Device -> Pageable)", 2)}
    assert [(c.name, c.count, c.us) for c in t.copies] == [("Memcpy DtoH (Device -> Pageable)", 2, 4.0)]
    assert {(b.name, b.count) for b in t.launched_by} == {("cudaGraphLaunch", 4), ("cudaLaunchKernel", 2),
                                                         ("cudaMemcpyAsync", 2)}
    assert {s.name for s in t.syncs} == {"cudaStreamSynchronize", "cudaMemcpyAsync"}  # both may wait
    step = t.per_step()
    assert step["wall_us"] == pytest.approx(79.0) and step["graph_launches"] == 1 and step["kernels"] == 3
    assert step["outside_graph_us"] == pytest.approx(4.0) and step["outside_graph_events"] == 2
    # gaps: inside the graph (1 µs: gemm → argmax), between launches (argmax → fill 0, copy → next graph 51)
    largest = step["largest_gaps"][0]
    assert largest == {"us": 51.0, "before": "Memcpy DtoH (Device -> Pageable)", "after": "gemm"}
    assert t.idle_between_launches_us == pytest.approx(51.0 + 2 * 1.0)  # fill → copy: 1 µs each step
    assert step["idle_us"] == pytest.approx((158.0 - 94.0) / 2)


def test_overlapping_streams_are_counted_once_and_added_events_diff():
    events = [_host("cudaGraphLaunch", 0.0, 1.0, 1), _dev("a", 1.0, 10.0, 1), _dev("b", 5.0, 10.0, 1)]
    t = summarize(events, steps=1)
    assert t.busy_us == pytest.approx(14.0) and t.window_us == pytest.approx(15.0) and t.outside_graph == ()
    base = summarize([_host("cudaGraphLaunch", 0.0, 1.0, 1), _dev("a", 1.0, 10.0, 1)], steps=1)
    assert added_events(base, t) == [{"name": "b", "count": 1.0, "us": 10.0}]
    assert added_events(t, t) == []  # nothing added to itself (the control)


def test_no_device_event_is_no_timeline():
    assert summarize([_host("cudaGraphLaunch", 0.0, 1.0, 1)], steps=1) is None
    with pytest.raises(ValueError, match="steps must be >= 1"):
        summarize(_two_engine_steps(), steps=0)


def test_cpu_trace_has_no_timeline():
    with device_trace(steps=2, cuda=False) as trace:
        torch.ones(4).add_(1)
    assert trace.summary is None and "no CUDA device" in trace.why_none
