"""The γ policy's step-time table under mixed steps (`specdec.engine.policy_mixed`): pure decode steps' times
first, mixed steps' corrected by their chunks' cost fitted per γ.

The law: with chunk tokens costing a fixed part plus a per-token part that grows with γ on top of the true decode
step (`policy_sim.Chunks`), and chunks riding mostly in speculative steps, the table recovers the true T(b, γ, ℓ)
within 12% at a length bucket pure steps time and within 15% at one only mixed steps time, and "auto" runs the γ a
run without chunks runs. Negative control: the engine's old attribution (the step less `ChunkBudget.mixed_share`,
recorded as a decode step) inflates γ > 0 by 25%+ and runs a lower γ.
"""

from __future__ import annotations

import random

import pytest

from specdec.engine.policy import GammaPolicy
from specdec.engine.policy_mixed import MIN_FIT, ChunkCost, MixedTimes
from policy_sim import Cell, Chunks, run_mixed

CELL = Cell("h200-like", 64, 2.5e-3, ((2, 1.3), (4, 1.4), (8, 1.9)), 0.7)  # γ 4 wins at α 0.7 by ~18%
CHUNKS = Chunks(fixed_s=3e-3, token_s=2e-6, per_gamma=0.5, tokens=(512, 1024), odds=(0.3, 0.9))
STEPS = 1500
SEEDS = (0, 1, 2)


def _mean_gamma(gammas: dict) -> float:
    return sum(g * n for g, n in gammas.items()) / sum(gammas.values())


def _dominant(gammas: dict) -> int:
    return max(gammas, key=lambda g: (gammas[g], g))


def _error(policy: GammaPolicy, gamma: int, length: int) -> float:
    true = CELL.step_seconds(64, gamma, length)
    return policy.step_time(64, gamma, length) / true - 1.0


@pytest.fixture(scope="module")
def reference():
    """The runs without chunks: seed → gammas."""
    return {seed: run_mixed(CELL, None, STEPS, seed=seed)["gammas"] for seed in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_table_recovers_decode_costs(seed):
    chunks = Chunks(**{**CHUNKS.__dict__, "mixed_lengths": (1000,)})  # every 4th step at a mixed-only length
    policy = run_mixed(CELL, chunks, STEPS, seed=seed)["policy"]
    mixed_only = {key for key in policy.samples if key not in policy.mixed.pure}
    assert {(64, g, 1024) for g in (0, 2, 4)} <= mixed_only  # (the corrected path is exercised)
    for gamma in (0, 1, 2, 4, 8):
        assert abs(_error(policy, gamma, 100)) <= 0.12, (gamma, _error(policy, gamma, 100))
        assert abs(_error(policy, gamma, 1000)) <= 0.15, (gamma, _error(policy, gamma, 1000))


@pytest.mark.parametrize("seed", SEEDS)
def test_choice_matches_a_run_without_chunks(seed, reference):
    gammas = run_mixed(CELL, CHUNKS, STEPS, seed=seed)["gammas"]
    assert _dominant(gammas) == _dominant(reference[seed]) == 4
    assert _mean_gamma(gammas) >= _mean_gamma(reference[seed]) - 0.6


@pytest.mark.parametrize("seed", SEEDS)
def test_negative_control_old_split_inflates_speculation(seed, reference):
    out = run_mixed(CELL, CHUNKS, STEPS, attribution="split", seed=seed)
    policy = out["policy"]
    assert all(_error(policy, g, 100) >= 0.25 for g in (1, 2, 4, 8)), [_error(policy, g, 100) for g in (1, 2, 4, 8)]
    assert _mean_gamma(out["gammas"]) <= _mean_gamma(reference[seed]) - 1.0


def test_chunk_cost_fit_is_robust_and_per_gamma():
    rng = random.Random(0)
    cost = ChunkCost()
    for i in range(16):  # γ 2: 1 ms + 3 µs/token, sizes 256..1024, one straggler
        n = rng.randint(256, 1024)
        cost.measured(2, n, (1e-3 + 3e-6 * n) * (5.0 if i == 7 else rng.uniform(0.98, 1.02)))
    a, c = cost.fit(2)
    assert a == pytest.approx(1e-3, rel=0.15) and c == pytest.approx(3e-6, rel=0.1)
    for _ in range(MIN_FIT):  # γ 8 at one size: its intercept with γ 2's slope
        cost.measured(8, 600, 2e-3 + 3e-6 * 600)
    assert cost.fit(8) == pytest.approx((2e-3, 3e-6), rel=0.1)
    assert cost.cost(4, 600) == pytest.approx((1e-3 + 2e-3) / 2 + 3e-6 * 600, rel=0.1)  # linear in γ between
    assert cost.cost(0, 600) == pytest.approx(cost.cost(2, 600))  # below the smallest fitted γ: its cost
    assert ChunkCost().seconds(2, 600, 0.01, fallback=0.004) == 0.004  # nothing measured: the engine's split
    assert cost.seconds(2, 600, 1e-3, fallback=0.0) == 1e-3  # at most the whole step


def test_pure_steps_own_the_table():
    times = MixedTimes(8)
    key = (64, 4, 128)
    mixed = times.sample(key, 0.009, 512, 0.004, [])
    assert list(mixed) == [key] and mixed[key] == pytest.approx([0.005])  # no pure step yet: the engine's split stands in
    pure = times.sample(key, 0.004, 0, 0.0, mixed[key])
    assert pure == {key: [0.004]}  # the first pure step drops the corrected samples
    assert times.sample(key, 0.009, 512, 0.004, pure[key]) == {}  # a mixed step there: an excess, not a sample
    assert times.chunks.fit(None) == pytest.approx((0.0, 0.005 / 512))
    negative = MixedTimes(8)  # control: with no pure step, mixed ones do enter the table
    assert negative.sample(key, 0.009, 512, 0.004, []) != {}


def test_the_engine_hands_mixed_steps_whole_to_the_policy(make_llama, monkeypatch):
    """An "auto" engine on the mixed step: each recorded mixed step reaches the policy whole, with its chunk tokens
    and the budget's split (at most the step), and the greedy rows' tokens are those of whole prefills."""
    from prefill_helpers import drive, mixed_params, prompt
    from specdec.engine import Engine, EngineConfig

    target = make_llama(0)
    early, late = [prompt(12 + 5 * i, i) for i in range(3)], [prompt(40 + 10 * i, 10 + i) for i in range(3)]
    calls, runs = [], []
    for mixed in (True, False):
        engine = Engine(target, make_llama(5, layers=1), EngineConfig(
            max_batch_size=4, max_seq_len=128, num_draft_tokens="auto", max_draft_tokens=4, admit_min=1,
            mixed_step=mixed, prefill_budget=24 if mixed else None))
        record = engine.policy.record_step

        def spy(*args, **kwargs):
            calls.append((mixed, args[2], kwargs.get("chunk_tokens", 0), kwargs.get("chunk_share", 0.0)))
            return record(*args, **kwargs)
        monkeypatch.setattr(engine.policy, "record_step", spy)
        params = mixed_params(len(early) + len(late))
        runs.append((drive(engine, early, late, params), [p.temperature == 0 for p in params]))
    fed = [(s, n, share) for m, s, n, share in calls if m and n > 0]
    assert fed and all(0.0 <= share < s for s, _, share in fed)  # (mixed steps were recorded: not vacuous)
    assert not any(n for m, _, n, _ in calls if not m)  # control: without the mixed step no step carries chunks
    (mixed_tokens, greedy), (whole_tokens, _) = runs
    pick = lambda tokens: [t for t, g in zip(tokens, greedy) if g]  # noqa: E731 (in request order)
    assert pick(mixed_tokens) == pick(whole_tokens)


def test_the_mixed_step_charges_no_prompt_feeding_to_speculation(make_llama):
    """The mixed step feeds a cached drafter every filling prompt whatever the regime: `AdmissionCost.every_regime`
    (set by the engine with the mixed step on and a cached drafter) makes the charge per speculative token 0.
    Negative control: the same measurements without it charge the feeding."""
    from specdec.engine import Engine, EngineConfig
    from specdec.engine.policy_admission import AdmissionCost

    def measured(every_regime: bool) -> AdmissionCost:
        cost = AdmissionCost()
        cost.every_regime = every_regime
        for _ in range(8):
            cost.prefilled(256, 2e-3, 256, 1e-3, 1, 256)
            cost.stepped(4, 64 * 4.0, 64)
        return cost
    assert measured(False).per_token() > 0 and measured(True).per_token() == 0.0
    target = make_llama(0)
    flags = {mixed: Engine(target, make_llama(5, layers=1), EngineConfig(
        max_batch_size=2, max_seq_len=64, num_draft_tokens="auto", mixed_step=mixed)).policy.admission.every_regime
        for mixed in (True, False)}
    assert flags == {True: True, False: False}


@pytest.mark.parametrize("every_regime", [True, False])
def test_h200_record_speculates_once_feeding_is_not_charged(every_regime):
    """The mixed step's "auto" row of the H200 traffic A/B (zoo pair, feature head, 64 slots: its table at batch 64,
    its feed cost, prompt and output lengths; α 0.955): with the drafter's prompt feeding uncharged, as the mixed
    step pays it in every regime, "auto" speculates (γ 4 or 8); charged (the negative control), a plain step ranks
    first."""
    from policy_sim import _Row

    policy = GammaPolicy("auto", 8)
    table = {0: 2.378e-3, 1: 2.825e-3, 2: 4.439e-3, 4: 6.469e-3, 8: 7.925e-3}
    policy.admission.every_regime = every_regime
    for _ in range(8):
        for gamma, seconds in table.items():
            policy.record_step(64, gamma, seconds, 0.0, length=1000, rows=64)
        policy.admission.prefilled(473, 473 * 14e-6, 473, 473 * 4.9e-6, 1, 473)  # a request of 473 prompt tokens
        policy.admission.stepped(4, 97.0, 64)  # ... joins, another finishes: 97 tokens a request
    assert policy.admission.report()["feed_us_per_prompt_token"] == pytest.approx(4.9)
    rows = [_Row(1000, 1 << 30, 0.955, i) for i in range(64)]
    gamma = policy.choose(64, rows, lambda: [(955.0, 1000.0, 250.0, 250.0)] * 64, length=1000)
    assert (gamma >= 4) if every_regime else (gamma == 0), (gamma, policy.last_rates)
