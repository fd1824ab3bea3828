"""bench.stalls: the per-step read-out of admissions and garbage collections (no device)."""

import gc
import time

from specdec.bench.stalls import GcWatch, StallLog


class _Engine:
    """A stand-in with the engine's `_admit` phase: step 2 admits (sleeps 20 ms inside `_admit`), step 3 collects."""

    num_running = 3

    def __init__(self):
        self.calls = self.num_admissions = 0

    def _admit(self, outputs):
        time.sleep(0.02)
        self.num_admissions += 1

    def step(self):
        self.calls += 1
        if self.calls == 2:
            self._admit([])
        if self.calls == 3:
            gc.collect()
        return [self.calls]


def test_gc_watch_sees_a_full_collection_and_stops_watching_on_exit():
    with GcWatch() as watch:
        gc.collect()
    assert any(generation == 2 and seconds >= 0 for generation, seconds in watch.pauses)
    seen = len(watch.pauses)
    gc.collect()
    assert len(watch.pauses) == seen  # (the callback is gone)


def test_stall_log_splits_each_step_into_admission_and_gc():
    engine = _Engine()
    start = time.perf_counter()
    with StallLog(engine) as log:
        assert [log.step() for _ in range(4)] == [[1], [2], [3], [4]]
    summary = log.summary(time.perf_counter() - start)
    assert summary["steps"] == 4 and summary["gc_full"] >= 1 and summary["admissions"] == 1
    assert summary["admit_ms_mean"] >= 20 and [s["admissions"] for s in log.steps] == [0, 1, 0, 0]
    assert summary["admit_s"] >= 0.02 and summary["step_s"] >= summary["admit_s"]
    assert log.steps[1]["admit_ms"] >= 20 and log.steps[1]["wall_ms"] >= log.steps[1]["admit_ms"]
    walls = [s["wall_ms"] for s in summary["slowest"]]
    assert walls == sorted(walls, reverse=True) and len(walls) == 4
    assert log.steps[2]["gc_ms"] > 0 and log.steps[0]["gc_ms"] == 0 and log.steps[0]["admit_ms"] == 0
    assert summary["driver_s"] >= 0 and "_admit" not in vars(engine)  # (unwrapped on exit)
