"""Where an engine step's time goes, for benchmarks: the engine's phases timed from the outside.

    with phase_timer(engine, bodies=True) as timer:
        engine.step()
    timer.seconds["admit"], timer.calls["catch_up"], timer.truthy["catch_up"], timer.spans["MODEL verify"]

The engine never calls this; a benchmark wraps one engine's phases for a while and gets them back unwrapped on
exit. Phases (the names a benchmark reads; the engine's methods behind them stay private to the engine):

  aborts       cancelled requests leave            admit        waiting requests join and prefill
  prefill      filling requests' prompts prefilled whole when nothing runs to carry their chunks (the mixed step's
               `prefill.prefill_rest`; truthy: the calls that fed something)
  catch_up     a cached drafter fed what plain steps committed (truthy: the calls that fed something)
  commit       the step record → outputs, statistics, finished requests
  step_shape   the step's runner found (or built: a capture) for its (batch, γ, length, flavor)
  MODEL draft / MODEL verify   (bodies=True) the model bodies of every step runner: graph replays on a GPU

`synchronize` names phases timed between two device synchronizations (the engine itself never waits there).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdec.engine.step_runner import StepRunner

__all__ = ["PHASES", "PhaseTimer", "phase_timer"]

PHASES = {"aborts": "_handle_aborts", "admit": "_admit", "prefill": "_prefill_rest", "catch_up": "_catch_up_drafter",
          "commit": "_commit", "step_shape": "_step_for"}
_BODIES = {"MODEL draft": "draft", "MODEL verify": "verify"}


@dataclass
class PhaseTimer:
    """Per phase name: total seconds, calls, calls that returned True, and the last call's
    (start, end) `time.perf_counter()` stamps. `wrap` times any other callable attribute the same way."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    truthy: dict[str, int] = field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    synchronize: tuple[str, ...] = ()
    _restore: list = field(default_factory=list, repr=False)

    def clear(self) -> None:
        """Forget what was measured (the wrapping stays)."""
        for table in (self.seconds, self.calls, self.truthy, self.spans):
            table.clear()

    def timed(self, fn, name: str):
        """`fn`, timed under `name`."""
        sync = name in self.synchronize and torch.cuda.is_available()

        def run(*args, **kwargs):
            if sync:
                torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                if sync:
                    torch.cuda.synchronize()
                end = time.perf_counter()
                self.seconds[name] = self.seconds.get(name, 0.0) + end - start
                self.calls[name] = self.calls.get(name, 0) + 1
                self.spans[name] = (start, end)
            if result is True:
                self.truthy[name] = self.truthy.get(name, 0) + 1
            return result
        return run

    def wrap(self, owner, attribute: str, name: str | None = None) -> None:
        """Time `owner.attribute` (a bound method or a class's function) until the timer's context ends."""
        name = name or attribute
        had_own = attribute in vars(owner)
        original = vars(owner)[attribute] if had_own else None
        setattr(owner, attribute, self.timed(getattr(owner, attribute), name))
        self._restore.append((owner, attribute, had_own, original))

    def unwrap(self) -> None:
        for owner, attribute, had_own, original in reversed(self._restore):
            if had_own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)
        self._restore.clear()


@contextmanager
def phase_timer(engine, phases=tuple(PHASES), *, bodies: bool = False,
                synchronize: tuple[str, ...] = (), present_only: bool = False) -> Iterator[PhaseTimer]:
    """Time `phases` (names of `PHASES`) of `engine`, and with `bodies` the model bodies of every step runner
    (`MODEL draft`, `MODEL verify`), while the context lasts; see the module doc. present_only: skip the phases
    `engine` does not have (a stand-in engine in a test) instead of failing."""
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown phases {unknown}; the engine's phases: {', '.join(PHASES)}")
    timer = PhaseTimer(synchronize=tuple(synchronize))
    try:
        for name in phases:
            if not present_only or hasattr(engine, PHASES[name]):
                timer.wrap(engine, PHASES[name], name)
        if bodies:
            for name, method in _BODIES.items():
                timer.wrap(StepRunner, method, name)
        yield timer
    finally:
        timer.unwrap()
