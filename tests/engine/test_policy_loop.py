"""Draft-length policies (`specdec.policy`) on the engine (`engine/policy_loop.py`): `specdec.generate(...,
num_draft_tokens=<a name or a DraftLengthPolicy>)` runs on the engine; greedy output = the loop's = plain decoding's for
every policy kind; the policy is asked and told what the loop asks and tells it (its γ sequence and the per-row
accepted / drafted counts, at batch 1 exactly; at batch 2 until a row nears its budget, where the engine's row drafts
only what it can commit — the documented per-row definition); a negative control feeds the policy the way the "auto"
policy's timing is fed (first runs of a step shape skipped), which the comparison catches."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

import specdec
from specdec.decoding import route
from specdec.engine import policy_loop
from specdec.engine.policy_loop import LoopChoice, declared_max
from specdec.policy import (POLICY_NAMES, DraftLengthPolicy, FixedPolicy, GuardedPolicy, HeuristicPolicy,
                            OnlineEstimates, OptimalPolicy, ThresholdPolicy)

PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


@pytest.fixture(scope="module")
def pair(make_llama):
    """A tiny target and a noisy copy of it as the draft: some drafts accepted, some rejected (greedy)."""
    target = make_llama(0)
    draft = copy.deepcopy(target)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.5 * p.std() * torch.randn_like(p))
    return target, draft


def run(pair, prompts, policy, engine="auto", max_new_tokens=24, drafter=True):
    target, draft = pair
    return specdec.generate(target, prompts, draft if drafter else None, max_new_tokens=max_new_tokens,
                            temperature=0, num_draft_tokens=policy, eos_token_id=[], engine=engine)


def told(base: type, **kwargs) -> DraftLengthPolicy:
    """A `base` policy that logs every outcome it is told: (γ, accepted per row, drafted per row)."""

    class Told(base):
        def reset(self):
            super().reset()
            self.log = []

        def update(self, outcome):
            self.log.append((outcome.num_draft_tokens, outcome.num_accepted.tolist(), outcome.draft_lengths.tolist()))
            super().update(outcome)

    return Told(**kwargs)


@pytest.fixture
def fixed_cost(monkeypatch):
    """ĉ pinned (timings are not deterministic; α̂ is): the optimal and guarded policies' γ then depend only on the
    accepted counts, the same on both runners."""
    monkeypatch.setattr(OnlineEstimates, "cost_ratio", property(lambda self: 0.05 if self.spec_steps else None))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_runs_on_the_engine_with_greedy_output_of_the_loop_and_of_plain(pair, name):
    target, draft = pair
    assert route.runner_for("auto", target, draft, name) == "fast"
    plain = run(pair, PROMPTS, 0, drafter=False).sequences
    engine = run(pair, PROMPTS, name)
    assert engine.sequences == run(pair, PROMPTS, name, engine="hf").sequences == plain
    assert engine.stats.accepted_tokens > 0  # it speculated (an exactness that speculation cannot break is no test)


@pytest.mark.parametrize("make", [
    lambda: told(FixedPolicy, num_draft_tokens=3),
    lambda: told(HeuristicPolicy),
    lambda: told(OptimalPolicy, initial=2, max_draft_tokens=6, warmup_steps=2),
    lambda: told(GuardedPolicy, inner=OptimalPolicy(initial=3, max_draft_tokens=6, warmup_steps=1),
                 min_speedup=1.2, warmup_steps=2, probe_every=2, probe_steps=1),
], ids=["fixed", "heuristic", "optimal", "guarded"])
def test_the_policy_is_asked_and_told_on_the_engine_what_the_loop_asks_and_tells_it(pair, fixed_cost, make):
    loop, engine = make(), make()
    out_loop, out_engine = run(pair, PROMPTS[:1], loop, engine="hf"), run(pair, PROMPTS[:1], engine)
    assert out_engine.sequences == out_loop.sequences
    assert engine.log == loop.log and len(engine.log) > 5
    assert len({g for g, _, _ in engine.log}) > 1 or isinstance(engine, FixedPolicy)  # (a γ that moves)
    if isinstance(engine, GuardedPolicy):
        assert 0 in [g for g, _, _ in engine.log]  # the guard switched speculation off, and back on by its probes


def test_a_threshold_policy_drafts_its_whole_gamma_on_the_engine(pair):
    """The engine's drafters have no host stop: `confidence_threshold()` is not honoured, so each step drafts the
    policy's γ on every row (the loop's model drafter stops a row early, and the loop tells the policy the cut width
    of the proposal as the step's γ). Greedy output is the same."""
    loop, engine = told(ThresholdPolicy, max_draft_tokens=4, threshold=0.9), \
        told(ThresholdPolicy, max_draft_tokens=4, threshold=0.9)
    assert run(pair, PROMPTS[:1], engine).sequences == run(pair, PROMPTS[:1], loop, engine="hf").sequences
    assert {g for g, _, lengths in engine.log[:-3]} == {4} and all(lengths == [g] for g, _, lengths in engine.log)
    assert any(lengths[0] < 4 for _, _, lengths in loop.log)  # the loop's model drafter did stop early


def test_at_batch_two_the_engine_tells_each_rows_own_draft_near_its_budget(pair):
    """Per row: a row with r tokens to go drafts min(γ, r − 1) on the engine; the loop drafts the step's γ on every
    row (clamped by the row with the most to go). Until that differs, both tell the policy the same."""
    loop, engine = told(HeuristicPolicy), told(HeuristicPolicy)
    assert run(pair, PROMPTS, engine).sequences == run(pair, PROMPTS, loop, engine="hf").sequences
    first = next((i for i, (a, b) in enumerate(zip(engine.log, loop.log)) if a != b), None)
    assert first is not None and first > 5  # (this toy case reaches a row's budget before the other's)
    gamma, _, lengths = engine.log[first]
    assert min(lengths) < gamma and loop.log[first][2] == [gamma] * len(lengths)


def test_negative_control_feedback_that_skips_a_shapes_first_run_is_caught(pair, monkeypatch):
    """Fed like the "auto" policy's timing (`record_step` skips a step shape's first run), the heuristic's γ
    sequence leaves the loop's: the comparison above can fail."""
    real, seen = LoopChoice.observe, set()

    def skipping(self, record):
        if record.gamma in seen:
            return real(self, record)
        seen.add(record.gamma)
        self._pending = None

    loop, engine = told(HeuristicPolicy), told(HeuristicPolicy)
    run(pair, PROMPTS[:1], loop, engine="hf")
    monkeypatch.setattr(LoopChoice, "observe", skipping)
    run(pair, PROMPTS[:1], engine)
    assert engine.log != loop.log


def _row(max_new_tokens, generated, cap=None):
    params = SimpleNamespace(max_new_tokens=max_new_tokens, num_draft_tokens=cap)
    return SimpleNamespace(params=params, prompt=[1, 2], length=2 + generated, generated_before=0)


class _Asks(DraftLengthPolicy):
    def __init__(self, gamma):
        self.gamma_asked = gamma

    def num_draft_tokens(self):
        return self.gamma_asked


def test_the_choice_clamps_as_the_loop_does_and_keeps_fixed_caps():
    choice = LoopChoice(_Asks(50), max_draft_tokens=8)
    assert choice.choose([_row(100, 0)]) == (8, (8,))  # the engine's size (the loop: its drafter's limit)
    assert choice.choose([_row(10, 7), _row(10, 5)]) == (4, (4, 4))  # the row with the most to go: 5 − 1
    assert choice.choose([_row(10, 0), _row(10, 0)], caps=[None, 0]) == (8, (8, 0))  # a plain row stays plain
    assert choice.choose([_row(100, 0)], ready=lambda g: g == 8) == (8, (8,))
    choice = LoopChoice(_Asks(3), max_draft_tokens=8)
    assert choice.choose([_row(100, 0)], ready=lambda g: g in (4, 8)) == (4, (3,))  # a built shape, the row at 3
    assert choice.choose([_row(100, 0), _row(100, 0)], caps=[None, 6]) == (6, (3, 6))  # its own cap: exactly that
    with pytest.raises(ValueError, match="num_draft_tokens"):
        LoopChoice(_Asks(-1), 8).choose([_row(100, 0)])


def test_the_engine_is_sized_to_the_policys_own_bound():
    assert declared_max(FixedPolicy(5)) == 5 and declared_max(HeuristicPolicy()) == 32
    assert declared_max(GuardedPolicy(OptimalPolicy(max_draft_tokens=12))) == 12
    assert declared_max(_Asks(3)) == policy_loop._DEFAULT_MAX
    assert policy_loop.loop_choice(4, 8) is None and policy_loop.loop_choice("auto", 8) is None
    assert isinstance(policy_loop.loop_choice("heuristic", 8).policy, HeuristicPolicy)
    with pytest.raises(ValueError, match="unknown draft-length policy"):
        policy_loop.loop_choice("bogus", 8)


def test_with_continuous_batching_the_policy_sees_each_steps_rows(pair):
    """More requests than slots on an `Engine` told a policy directly: rows join as others leave, every step tells
    the policy its own rows, and the greedy tokens are plain decoding's."""
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    target, draft = pair
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 8], [4, 4, 2, 7, 1]]
    budgets = [6, 14, 9, 12]
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=64, cuda_graphs=False))
    policy = told(HeuristicPolicy)
    engine.policy.set_fixed(policy)
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, eos_token_ids=())): i
           for i, (p, n) in enumerate(zip(prompts, budgets))}
    out = [[] for _ in prompts]
    while engine.has_unfinished():
        for o in engine.step():
            out[ids[o.request_id]].extend(o.new_token_ids)
    plain = [specdec.generate(target, [p], None, max_new_tokens=n, temperature=0, eos_token_id=[]).sequences[0]
             for p, n in zip(prompts, budgets)]
    assert out == plain
    assert {len(accepted) for _, accepted, _ in policy.log} == {1, 2} and engine.policy.loop.asked


class _Duck:
    """Not a `DraftLengthPolicy`: it has `num_draft_tokens` and `update`, not `reset` or `confidence_threshold`."""

    def num_draft_tokens(self) -> int:
        return 2

    def update(self, outcome) -> None: ...


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_an_object_outside_the_protocol_is_refused_naming_what_it_lacks(pair, engine):
    """Both runners check a policy object by `policy.check_policy`: an object of another class is refused naming the
    methods it lacks (the control: a DraftLengthPolicy subclass with the same two methods runs)."""
    with pytest.raises(ValueError, match=r"_Duck lacks reset\(\), confidence_threshold\(\) and does not subclass"):
        run(pair, [[1, 2, 3]], _Duck(), engine=engine, max_new_tokens=4)
    subclass = type("Subclassed", (DraftLengthPolicy,), dict(vars(_Duck)))
    assert len(run(pair, [[1, 2, 3]], subclass(), engine=engine, max_new_tokens=4).sequences[0]) == 4
