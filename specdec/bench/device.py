"""The device side of a benchmark: peak bandwidth (measured and documented), memory meters, MBU.

MBU (model bandwidth utilization) of plain decoding = weight bytes × target forwards per second ÷ peak
memory bandwidth: the fraction of the card's bandwidth a batch-1 decode step turns into reading weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from specdec.analysis import median_timed
from specdec.fast.graphs import graph_time_us

# Vendor datasheets (SXM parts): bytes per second.
DOCUMENTED_PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.039e12}


def documented_peak_bandwidth(name: str) -> float | None:
    for key, value in DOCUMENTED_PEAK_BANDWIDTH.items():
        if key in name.upper():
            return value
    return None


def measure_copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Device-to-device copy: (bytes read + bytes written) / median time."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) / 1000.0)
    del src, dst
    torch.cuda.empty_cache()
    times.sort()
    return 2 * nbytes / times[len(times) // 2]


def device_info(device: torch.device, measure: bool = True) -> dict:
    """Name, memory, documented and (on CUDA) measured peak bandwidth of `device`."""
    if device.type != "cuda":
        import platform

        return {"device": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(device)
    info = {
        "device": str(device),
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "documented_peak_bandwidth_tbs": (documented_peak_bandwidth(props.name) or 0) / 1e12 or None,
    }
    if measure:
        info["measured_copy_bandwidth_tbs"] = round(measure_copy_bandwidth(device) / 1e12, 3)
    return info


@contextlib.contextmanager
def peak_memory(device: torch.device, result: dict) -> Iterator[None]:
    """Sets result['peak_extra_bytes']: the most memory allocated above what was live on entry (CUDA)."""
    if device.type != "cuda":
        yield
        result["peak_extra_bytes"] = None
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    yield
    torch.cuda.synchronize(device)
    result["peak_extra_bytes"] = torch.cuda.max_memory_allocated(device) - base


def mbu(weight_bytes: int, forwards_per_second: float, peak_bandwidth: float | None) -> float | None:
    if not peak_bandwidth:
        return None
    return weight_bytes * forwards_per_second / peak_bandwidth


def time_call(fn: Callable[[], object], *, cuda: bool, calls: int, reps: int) -> float:
    """Median milliseconds per call of fn: on CUDA one graph of `calls` calls, replayed `reps` times
    (`fast.graphs.graph_time_us`); on CPU `analysis.median_timed`."""
    if not cuda:
        return median_timed(lambda _: fn(), torch.device("cpu"), reps)[0] * 1e3
    return graph_time_us(fn, calls=calls, reps=reps) / 1e3
