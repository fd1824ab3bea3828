"""A device timeline read from torch.profiler's trace: where a window of decode steps spent the GPU's time.

    with device_trace(steps=16) as trace:       # torch.profiler, CUDA activity only (no CPU-op overhead)
        for _ in range(16):
            engine.step()
    trace.summary                               # a `Timeline`; `.per_step()` → a dict of µs per step

Read from the trace's events (Chrome trace format, `profile.export_chrome_trace`):

  device events   kernels ("kernel"), copies ("gpu_memcpy") and fills ("gpu_memset") on the GPU's timeline
  host API calls  "cuda_runtime" / "cuda_driver" events: cudaGraphLaunch, cudaLaunchKernel, cuLaunchKernel (Triton),
                  cudaMemcpyAsync, the synchronizations (cudaStreamSynchronize, cudaEventSynchronize, ...)
  launcher        a device event's host call, through their shared `correlation` id: a kernel launched by
                  cudaGraphLaunch ran inside a CUDA graph; one launched by any other call ran outside any graph
  window          from the window's first host call to its last event's end (host or device)
  busy / idle     the union of the device events' intervals inside the window, and the rest: the GPU waiting
                  (on the host's bookkeeping, a synchronization, a launch)
  gaps            idle stretches between two consecutive device events, each named by the events around it

Every figure is per step (the window's total / `steps`). On a machine without CUDA there is no device timeline:
`device_trace` then yields a trace whose summary is None (callers report that, not zeros).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Timeline", "NamedTime", "Gap", "summarize", "device_trace", "DeviceTrace", "added_events"]

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
SYNC_CALLS = ("Synchronize", "cudaMemcpy", "cudaStreamQuery", "cudaEventQuery")  # host calls that may wait
GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")


@dataclass(frozen=True)
class NamedTime:
    """Events of one name in the window: how many, their total µs (device time, or host time for API calls)."""

    name: str
    count: int
    us: float


@dataclass(frozen=True)
class Gap:
    """An idle stretch of the device between two consecutive device events."""

    us: float
    before: str  # the device event that ended it started after
    after: str  # the device event it preceded


@dataclass(frozen=True)
class Timeline:
    """A window of `steps` steps on the device (see the module doc); totals over the window, µs."""

    steps: int
    window_us: float
    busy_us: float
    kernel_us: float
    kernels: int
    graph_launches: int
    outside_graph: tuple[NamedTime, ...]  # device events launched by anything but a graph launch, by name
    copies: tuple[NamedTime, ...]  # gpu_memcpy / gpu_memset events by name ("Memcpy DtoH (Device -> Pageable)")
    syncs: tuple[NamedTime, ...]  # host calls that may wait for the device, by name (host µs)
    host_calls: tuple[NamedTime, ...]  # every CUDA runtime / driver call, by name (host µs)
    by_name: tuple[NamedTime, ...] = field(default=())  # every device event by name (to diff two timelines)
    gaps: tuple[Gap, ...] = field(default=())  # the largest idle stretches, largest first
    idle_between_launches_us: float = 0.0  # idle between events of different host calls (e.g. two graph replays)
    launched_by: tuple[NamedTime, ...] = field(default=())  # device events by the host call that launched them

    @property
    def idle_us(self) -> float:
        return self.window_us - self.busy_us

    def per_step(self, top: int = 12) -> dict:
        """The JSON-ready figures per step (µs and counts divided by `steps`), the top `top` of each list."""
        n = max(self.steps, 1)

        def listed(items: Iterable[NamedTime]) -> list[dict]:
            rows = sorted(items, key=lambda t: -t.us)[:top]
            return [{"name": t.name[:120], "count": round(t.count / n, 2), "us": round(t.us / n, 2)} for t in rows]

        outside = sum(t.us for t in self.outside_graph)
        return {"steps": self.steps, "wall_us": round(self.window_us / n, 1), "busy_us": round(self.busy_us / n, 1),
                "idle_us": round(self.idle_us / n, 1),
                "idle_between_launches_us": round(self.idle_between_launches_us / n, 1),
                "kernel_us": round(self.kernel_us / n, 1), "kernels": round(self.kernels / n, 2),
                "graph_launches": round(self.graph_launches / n, 2),
                "outside_graph_us": round(outside / n, 1),
                "outside_graph_events": round(sum(t.count for t in self.outside_graph) / n, 2),
                "outside_graph": listed(self.outside_graph), "copies": listed(self.copies),
                "syncs": listed(self.syncs), "host_calls": listed(self.host_calls),
                "launched_by": listed(self.launched_by),
                "largest_gaps": [{"us": round(g.us, 1), "before": g.before[:80], "after": g.after[:80]}
                                 for g in self.gaps[:top]]}


def _tally(events: Iterable[dict]) -> tuple[NamedTime, ...]:
    table: dict[str, list[float]] = {}
    for e in events:
        table.setdefault(e["name"], []).append(float(e.get("dur", 0.0)))
    return tuple(NamedTime(name, len(d), sum(d)) for name, d in table.items())


def _correlation(event: dict):
    args = event.get("args") or {}
    return args.get("correlation", args.get("correlationId"))


def summarize(events: list[dict], steps: int, keep_gaps: int = 16) -> Timeline | None:
    """The `Timeline` of a trace's events (Chrome trace dicts) covering `steps` steps; None when the trace holds
    no device event (no CUDA activity: a CPU run)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    device = sorted((e for e in complete if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: float(e["ts"]))
    host = [e for e in complete if e.get("cat") in HOST_CATEGORIES]
    if not device:
        return None
    starts = [float(e["ts"]) for e in device + host]
    ends = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in device + host]
    start, end = min(starts), max(ends)
    launcher = {_correlation(e): e["name"] for e in host if _correlation(e) is not None}
    # busy: the union of the device intervals (streams may overlap); gaps between consecutive device events
    busy, cursor, last = 0.0, start, None
    gaps, between = [], 0.0
    for e in device:
        s, d = float(e["ts"]), float(e.get("dur", 0.0))
        if s > cursor and last is not None:
            gaps.append(Gap(s - cursor, last["name"], e["name"]))
            if _correlation(last) != _correlation(e):
                between += s - cursor
        busy += max(0.0, s + d - max(s, cursor))
        if s + d >= cursor:
            cursor, last = s + d, e
    kernels = [e for e in device if e.get("cat") == "kernel"]
    outside = [e for e in device if not str(launcher.get(_correlation(e), "")).startswith(GRAPH_LAUNCH)]
    return Timeline(
        steps=steps, window_us=end - start, busy_us=busy, kernel_us=sum(float(e.get("dur", 0.0)) for e in kernels),
        kernels=len(kernels), graph_launches=sum(e["name"].startswith(GRAPH_LAUNCH) for e in host),
        outside_graph=_tally(outside), copies=_tally(e for e in device if e.get("cat") != "kernel"),
        syncs=_tally(e for e in host if any(s in e["name"] for s in SYNC_CALLS)), host_calls=_tally(host),
        by_name=_tally(device),
        launched_by=_tally({"name": launcher.get(_correlation(e), "(no host call in the trace)"),
                            "dur": e.get("dur", 0.0)} for e in device),
        gaps=tuple(sorted(gaps, key=lambda g: -g.us)[:keep_gaps]), idle_between_launches_us=between)


def added_events(base: Timeline, other: Timeline, top: int = 16) -> list[dict]:
    """Device events `other` runs per step beyond `base` (by name: extra count and µs per step), largest µs first —
    what a step adds to a bare one."""
    have = {t.name: t for t in base.by_name}
    rows = []
    for t in other.by_name:
        b = have.get(t.name)
        count = t.count / other.steps - (b.count / base.steps if b else 0.0)
        us = t.us / other.steps - (b.us / base.steps if b else 0.0)
        if count > 0.01 or us > 0.5:
            rows.append({"name": t.name[:120], "count": round(count, 2), "us": round(us, 2)})
    return sorted(rows, key=lambda r: -r["us"])[:top]


@dataclass
class DeviceTrace:
    """What `device_trace` yields: `summary` is set when the context exits (None without a CUDA timeline)."""

    steps: int
    summary: Timeline | None = None
    why_none: str | None = None


@contextmanager
def device_trace(steps: int, *, cuda: bool | None = None) -> Iterator[DeviceTrace]:
    """Profile the block (CUDA activity only: kernels, copies and the host's CUDA calls; no CPU-op recording, so
    the host runs at nearly its own speed) and summarize it as `steps` steps; the device is synchronized at the
    end, inside the window. Without CUDA the block runs unprofiled and `summary` stays None."""
    import torch

    trace = DeviceTrace(steps)
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda:
        trace.why_none = "no CUDA device: no device timeline"
        yield trace
        return
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield trace
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    trace.summary = summarize(events, steps)
    if trace.summary is None:
        trace.why_none = "the trace holds no device event (CUPTI unavailable?)"
