"""`specdec.engine.profile.phase_timer`: times the engine's phases and model bodies from the outside, hands the
engine back unwrapped, and refuses an unknown phase by name."""

import pytest

from specdec.engine import Engine, EngineConfig
from specdec.engine.profile import PHASES, phase_timer
from specdec.engine.step_runner import StepRunner
from specdec.request import SamplingParams


def test_phases_are_timed_then_unwrapped(llama, llama_draft):
    engine = Engine(llama, llama_draft, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2,
                                                     cuda_graphs=False))
    draft, verify = StepRunner.draft, StepRunner.verify
    engine.add_request([1, 2, 3, 4], SamplingParams(max_new_tokens=5))
    with phase_timer(engine, bodies=True) as timer:
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
    assert timer.calls["admit"] == timer.calls["commit"] == timer.calls["MODEL verify"] == steps
    assert timer.truthy.get("catch_up", 0) == 0  # γ = 2 every step: nothing to catch up
    assert all(timer.seconds[name] > 0 for name in ("admit", "commit", "MODEL draft", "MODEL verify"))
    start, end = timer.spans["MODEL verify"]
    assert start <= end
    assert not set(PHASES.values()) & set(vars(engine))  # the engine's own methods again
    assert (StepRunner.draft, StepRunner.verify) == (draft, verify)
    assert engine.num_step_shapes == 1


def test_an_unknown_phase_is_refused(llama):
    engine = Engine(llama, None, EngineConfig(max_batch_size=1, max_seq_len=32, cuda_graphs=False))
    with pytest.raises(ValueError, match=r"unknown phases \['warp'\]"):
        with phase_timer(engine, ("admit", "warp")):
            pass
