"""The γ policy's acceptance by draft depth (`specdec.engine.policy_depth`) and its use in "auto"'s expected tokens;
re-deciding when the rows a decision was made for have left."""

import random

import pytest

from specdec.analysis import expected_tokens
from specdec.engine.policy import GammaPolicy
from specdec.engine.policy_depth import DepthProfile, extra_tokens


class _Row:
    estimate = None


def _profile(deep: float, steps: int = 400, rows: int = 16, gamma: int = 8, seed: int = 0) -> DepthProfile:
    """Rows of α 0.6..0.95 (their own α known to the profile) drafting γ, accepted i.i.d. at depths 0..3 and with
    probability α·deep from depth 4 on."""
    rng = random.Random(seed)
    running = [_Row() for _ in range(rows)]
    alphas = [0.6 + 0.35 * i / (rows - 1) for i in range(rows)]
    profile = DepthProfile(8)
    profile.decided(running, [(a, 1.0) for a in alphas], 0.8)
    for _ in range(steps):
        accepted = []
        for a in alphas:
            n = 0
            while n < gamma and rng.random() < (a if n < 4 else a * deep):
                n += 1
            accepted.append(n)
        profile.observe(running, accepted, [gamma] * rows)
    return profile


def test_the_profile_measures_acceptance_by_depth_against_each_rows_alpha():
    shape = _profile(0.8).shape()
    assert shape[0] == 1.0 and all(s > 0.95 for s in shape[1:4]), shape
    assert all(s == pytest.approx(0.8, abs=0.06) for s in shape[4:]), shape
    iid = _profile(1.0, seed=1).shape()  # rows of different α, each i.i.d.: no depth effect (deep rows are not
    assert all(s > 0.95 for s in iid), iid  # mistaken for better drafts: each depth is weighed by its rows' α)


def test_the_profile_keeps_the_deepest_measured_depth_beyond_it_and_starts_flat():
    assert DepthProfile(8).shape() == [1.0] * 8
    shape = _profile(0.7, gamma=6).shape()
    assert len(shape) == 8 and shape[6] == shape[7] == shape[5] < 0.8


def test_extra_tokens_follow_the_shape_and_are_thm_3_8s_when_flat():
    rows = [(0.9, 1.0), (0.5, 0.5), (1.0, 1.0)]
    flat = extra_tokens(rows, (1, 4, 8), [1.0] * 8)
    for g in (1, 4, 8):
        assert flat[g] == pytest.approx(sum(c * (expected_tokens(a, g) - 1.0) for a, c in rows))
    shape = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    got = extra_tokens(rows, (4, 8), shape)

    def direct(alpha, gamma):
        reach, total = 1.0, 0.0
        for k in range(gamma):
            reach *= min(alpha * shape[k], 1.0)
            total += reach
        return total

    for g in (4, 8):
        assert got[g] == pytest.approx(sum(c * direct(a, g) for a, c in rows))
    assert got[4] == pytest.approx(flat[4]) and got[8] < flat[8]


def test_auto_learns_the_profile_from_the_steps_accepted_counts_and_a_fixed_gamma_does_not():
    """The engine reports each step's accepted counts per row; with drafts past depth 3 never accepted, γ = 8
    predicts no more than γ = 4 (the i.i.d. rule: 45% more) and loses to it on its longer step."""
    policy = GammaPolicy("auto", 8)
    for gamma, seconds in ((0, 1.0), (2, 1.2), (4, 1.4), (8, 1.8)):
        for _ in range(3):
            policy.record_step(8, gamma, seconds, 1.0)
    rows = [_Row() for _ in range(8)]

    def estimates():  # α 0.9 over 100 verified positions each
        return [(90.0, 100.0, 25.0, 25.0)] * 8

    policy.choose(8, rows, estimates)
    assert policy.predicted[8] > 1.4 * policy.predicted[4] - 0.4  # (before: Thm 3.8's i.i.d. law)
    for _ in range(200):
        policy.choose(8, rows, estimates)
        policy.record_step(8, 8, 1.8, 4.0, rows=8, accepted=[4] * 6 + [2, 3], drafted=[8] * 8 + [0] * 8)
    policy.set_fixed("auto")
    assert policy.choose(8, rows, estimates) == 4
    assert policy.predicted[8] == pytest.approx(policy.predicted[4], rel=0.01)
    assert policy.report()["depth_shape"][4] < 0.1
    fixed = GammaPolicy(8, 8)
    fixed.record_step(8, 8, 1.8, 4.0, rows=8, accepted=[4] * 8, drafted=[8] * 8)
    assert fixed.report()["depth_shape"] == []


def test_a_decision_is_remade_when_most_of_its_rows_have_left():
    """Batch 1: a new request does not run on the decision made for the one before it; rows coming and going in a
    bigger batch keep it."""
    policy = GammaPolicy("auto", 8)
    for gamma, seconds in ((0, 1.0), (2, 1.2), (4, 1.3), (8, 1.5)):
        for _ in range(3):
            policy.record_step(1, gamma, seconds, 1.0)
            policy.record_step(8, gamma, seconds, 1.0)
    reads = []

    def estimates(alpha, rows=1):
        def read():  # every row: α over 100 verified positions
            reads.append(alpha)
            return [(alpha * 100, 100.0, 25.0, 25.0)] * rows
        return read

    first, second = _Row(), _Row()
    assert policy.choose(1, [first], estimates(0.95)) == 8 and len(reads) == 1
    assert policy.choose(1, [first], estimates(0.95)) == 8 and len(reads) == 1  # kept
    assert policy.choose(1, [second], estimates(0.02)) == 0 and len(reads) == 2  # a new request: decided afresh
    rows = [_Row() for _ in range(10)]
    policy.choose(8, rows[:8], estimates(0.9, 8))
    for i in range(5):  # one row in, one out per step: 3 of 8 replaced at most
        policy.choose(8, rows[i // 2: i // 2 + 8], estimates(0.9, 8))
    assert len(reads) == 3


def test_auto_on_the_engine_reads_each_steps_counts_for_the_rows_it_chose_for(make_llama):
    """Under "auto" with admissions (7 requests through 3 slots), rows finishing on EOS and on their budget, greedy and
    sampled rows mixed: every step's accepted counts reach the depth profile with the rows that ran it (the engine
    releases finished rows before `record_step`), and the greedy rows still give transformers' greedy tokens."""
    from helpers import RAGGED_PROMPTS, hf_greedy
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=3, max_seq_len=128, num_draft_tokens="auto"))
    prompts = RAGGED_PROMPTS + [[4, 4, 9], [9, 8, 7, 6], [2, 3]]
    eos = hf_greedy(target, prompts[0], 12, [])[8]  # an EOS the first request meets after 9 tokens
    ids = {}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.8 if i % 3 == 2 else 0, max_new_tokens=10 + 3 * i, seed=i,
                                eos_token_ids=(eos,) if i % 2 == 0 else ())
        ids[engine.add_request(prompt, params)] = (prompt, params)
    choose, commit, observe = engine.policy.choose, engine._commit, engine.policy.depth.observe
    seen, checked = {}, []

    def chosen(batch, running, *args, **kwargs):
        seen["rows"] = tuple(running)
        return choose(batch, running, *args, **kwargs)

    def committed(record):
        seen["accepted"] = list(record.num_accepted)
        return commit(record)

    def observed(rows, accepted, drafted):
        assert tuple(rows) == seen["rows"] and list(accepted) == seen["accepted"]
        assert all(a <= d for a, d in zip(accepted, drafted))
        checked.append(len(rows))
        return observe(rows, accepted, drafted)

    engine.policy.choose, engine._commit, engine.policy.depth.observe = chosen, committed, observed
    outputs = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] += out.new_token_ids
    assert checked and engine.policy.report()["depth_shape"]
    for rid, (prompt, params) in ids.items():
        if params.temperature == 0:
            assert outputs[rid] == hf_greedy(target, prompt, params.max_new_tokens, list(params.eos_token_ids))
