"""Where a traffic run's wall time goes outside the decode steps, step by step: the engine's admissions and
catch-ups, garbage collections, the driver's own work (a read-out for `bench.traffic.drive` and
scripts/profile_admission.py; nothing here waits on the device).

    with StallLog(engine) as log:
        while ...:
            outputs = log.step()              # engine.step(), timed with its admission, catch-up and GC parts
    log.summary(run_seconds)                  # → JSON-ready totals and the slowest steps
"""

from __future__ import annotations

import gc
import time

import torch

from specdec.engine.profile import phase_timer

__all__ = ["GcWatch", "StallLog", "policy_report"]


class GcWatch:
    """Every garbage collection while the context lasts: `pauses` = [(generation, seconds)] (gc.callbacks)."""

    def __init__(self):
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((int(info.get("generation", 2)), time.perf_counter() - self._started))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def seconds(self) -> float:
        return sum(s for _, s in self.pauses)


class StallLog:
    """Times each `step()` of `engine`: its wall time, the admission (`_admit`: prefill of the admitted prompts,
    target and drafter) and catch-up parts inside it, and the garbage collections that ran inside it and between
    steps. `summary(seconds)`: totals, the share of a run of `seconds` each took, the five slowest steps."""

    def __init__(self, engine):
        self.engine = engine
        self.steps: list[dict] = []
        self._gc = GcWatch()
        self._timer = None
        self._context = None
        self._allocs = 0

    def _device_allocs(self) -> int:
        """cudaMalloc calls of the caching allocator so far (0 off CUDA): growth while traffic runs."""
        device = getattr(self.engine, "device", None)
        if getattr(device, "type", None) != "cuda":
            return 0
        return int(torch.cuda.memory_stats(device).get("num_device_alloc", 0))

    def __enter__(self) -> StallLog:
        self._allocs = self._device_allocs()
        self._context = phase_timer(self.engine, phases=("admit", "catch_up"), present_only=True)
        self._timer = self._context.__enter__()
        self._gc.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._gc.__exit__(*exc)
        self._context.__exit__(*exc)
        self._allocs = self._device_allocs() - self._allocs

    def step(self) -> list:
        timer, gc_before = self._timer, len(self._gc.pauses)
        admissions = getattr(self.engine, "num_admissions", 0)
        timer.clear()
        start = time.perf_counter()
        outputs = self.engine.step()
        wall = time.perf_counter() - start
        gc_inside = sum(s for _, s in self._gc.pauses[gc_before:])
        self.steps.append({"wall_ms": 1e3 * wall, "admit_ms": 1e3 * timer.seconds.get("admit", 0.0),
                           "catch_up_ms": 1e3 * timer.seconds.get("catch_up", 0.0), "gc_ms": 1e3 * gc_inside,
                           "rows": self.engine.num_running,
                           "admissions": getattr(self.engine, "num_admissions", 0) - admissions})
        return outputs

    def summary(self, seconds: float) -> dict:
        total = lambda key: sum(s[key] for s in self.steps) / 1e3  # noqa: E731
        steps, admit, catch_up = total("wall_ms"), total("admit_ms"), total("catch_up_ms")
        gc_all = self._gc.seconds()
        share = lambda part: round(part / seconds, 4) if seconds > 0 else None  # noqa: E731
        admissions = sum(s["admissions"] for s in self.steps)
        return {"steps": len(self.steps), "step_s": round(steps, 4), "admit_s": round(admit, 4),
                "admissions": admissions, "admit_ms_mean": round(1e3 * admit / admissions, 3) if admissions else None,
                "catch_up_s": round(catch_up, 4), "gc_s": round(gc_all, 4), "gc_count": len(self._gc.pauses),
                "gc_full": sum(1 for g, _ in self._gc.pauses if g == 2),
                "gc_max_ms": round(1e3 * max((s for _, s in self._gc.pauses), default=0.0), 3),
                "device_allocs": self._allocs, "driver_s": round(seconds - steps, 4), "admit_share": share(admit), "gc_share": share(gc_all),
                "decode_share": share(steps - admit - catch_up),
                "slowest": [{k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}
                            for s in sorted(self.steps, key=lambda s: -s["wall_ms"])[:5]]}


def policy_report(engine, clock: float, seconds: float) -> dict:
    """The γ policy's read-out after a run (`GammaPolicy.report`; only the share for a policy that keeps none) and the
    share of the run's wall time its timed steps cover (the rest: admission, catch-up excess, the driver)."""
    report = engine.policy.report() if hasattr(engine.policy, "report") else {"clock_s": 0.0}
    report["step_share"] = (report["clock_s"] - clock) / seconds if seconds > 0 else None
    return report
