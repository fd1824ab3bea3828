"""One background thread steps the runners; requests come and go from any thread.

Model steps never run on the caller's thread (nor on a server's event loop): `submit` queues a request with a
sink, the thread calls `runner.step()` while any runner has work and hands each output to its request's sink
(the server's sinks collect a step's outputs for its event loop). Listeners see every output first (the
server's metrics); step listeners are called once per step, after its outputs, with its `StepTiming` (the
server wakes its event loop there, once for the whole step). A step that raises fails every request of that
runner with the error. Work on this thread delays the next step (on a GPU the device idles meanwhile), so
sinks and listeners must be cheap: hand the outputs over, count, and return.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["Driver", "StepTiming"]

Sink = Callable[[object], None]  # receives RequestOutputs, then possibly an Exception


@dataclass(frozen=True)
class StepTiming:
    """One step on the driver thread."""

    runner: object
    step_s: float  # in `runner.step()`: admission and prefill, the decode step, any graph capture
    deliver_s: float  # handing its outputs to the listeners and sinks
    num_outputs: int
    admitted: bool = False  # the step admitted (and prefilled) requests, or prefilled a budget of their prompts


class Driver:
    def __init__(self, name: str = "specdec-driver"):
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._runners: list = []
        self._sinks: dict[str, tuple[object, Sink]] = {}  # request id -> (runner, sink)
        self._listeners: list[Callable[[object, object], None]] = []
        self._step_listeners: list[Callable[[StepTiming], None]] = []
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.failed: set = set()  # runners whose step raised (their owner replaces them)

    # --- any thread -------------------------------------------------------------------------------
    def submit(self, runner, prompt_ids: list[int], params, sink: Sink, request_id: str) -> str:
        """Queue a request on `runner`; its outputs go to `sink` (called on the driver thread)."""
        if self._stopped:
            raise RuntimeError("this model has been closed")
        with self._lock:
            if request_id in self._sinks:
                raise ValueError(f"request_id {request_id!r} is already running")
            self._sinks[request_id] = (runner, sink)
            if runner not in self._runners:
                self._runners.append(runner)
        try:
            runner.add_request(list(prompt_ids), params, request_id=request_id)
        except BaseException:
            with self._lock:
                self._sinks.pop(request_id, None)
            raise
        self._ensure_thread()
        self._wake.set()
        return request_id

    def abort(self, request_id: str) -> None:
        """Cancel a request; its sink still gets a final output (finish_reason "abort")."""
        with self._lock:
            entry = self._sinks.get(request_id)
        if entry is not None:
            entry[0].abort(request_id)
            self._wake.set()

    def add_listener(self, listener: Callable[[object, object], None]) -> None:
        """`listener(runner, output)` is called on the driver thread for every output, before its sink."""
        self._listeners.append(listener)

    def add_step_listener(self, listener: Callable[["StepTiming"], None]) -> None:
        """`listener(StepTiming)` is called on the driver thread after each step's outputs reached their sinks
        (after a step that raised too): a server hands the step's outputs to its event loop here, in one go."""
        self._step_listeners.append(listener)

    @property
    def num_requests(self) -> int:
        return len(self._sinks)

    def close(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # --- the driver thread ------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        import torch

        with torch.inference_mode():
            while not self._stopped:
                self._wake.clear()  # before looking for work, so a submit after the look wakes us
                busy = [r for r in list(self._runners) if r.has_unfinished()]
                if not busy:
                    self._wake.wait()
                    continue
                for runner in busy:
                    self._step(runner)

    def _step(self, runner) -> None:
        admissions = getattr(runner, "num_admissions", None)  # (the engine admits in groups: waiting ≠ admitting)
        admitting = bool(getattr(runner, "num_waiting", 0))
        fed = getattr(runner, "prefill_tokens", None)  # (chunked prefill: prompts fed over later steps)
        start = time.perf_counter()
        try:
            outputs = runner.step()
        except Exception as err:  # noqa: BLE001 - delivered to the requests, which raise it
            logger.exception("runner step failed; failing its requests")
            self._fail(runner, err)
            self._after_step(StepTiming(runner, time.perf_counter() - start, 0.0, 0, admitting))
            return
        stepped = time.perf_counter()
        if admissions is not None:
            admitting = runner.num_admissions != admissions
        if fed is not None:
            admitting = admitting or runner.prefill_tokens != fed
        for out in outputs:
            with self._lock:
                entry = self._sinks.get(out.request_id)
                if entry is not None and out.finished:
                    del self._sinks[out.request_id]
            for listener in self._listeners:
                try:
                    listener(runner, out)
                except Exception:  # noqa: BLE001 - a metrics bug must not stop generation
                    logger.exception("output listener failed")
            if entry is not None:
                entry[1](out)
        self._after_step(StepTiming(runner, stepped - start, time.perf_counter() - stepped, len(outputs), admitting))

    def _after_step(self, timing: "StepTiming") -> None:
        for listener in self._step_listeners:
            try:
                listener(timing)
            except Exception:  # noqa: BLE001 - a metrics bug must not stop generation
                logger.exception("step listener failed")

    def _fail(self, runner, err: Exception) -> None:
        with self._lock:
            failed = [(rid, sink) for rid, (r, sink) in self._sinks.items() if r is runner]
            for rid, _ in failed:
                del self._sinks[rid]
            self._runners.remove(runner)
            self.failed.add(runner)
        for rid, sink in failed:
            try:
                runner.abort(rid)
            except Exception:  # noqa: BLE001
                pass
            sink(err)
