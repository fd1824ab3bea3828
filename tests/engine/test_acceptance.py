"""The acceptance watch (`specdec.engine.acceptance`): a request whose acceptance collapses falls back to plain
decoding (cap 0) and probes again after its cool-down; a steady row never falls back (the false-alarm bound); the
detector disabled never falls back and loses throughput in a collapse (the negative control); the per-row cap's
marginal rule against Thm 3.8 by hand-computed values. Run in the simulated engine, `policy_sim`."""

import dataclasses

import pytest

from specdec.analysis import expected_tokens, walltime_improvement
from specdec.engine.acceptance import AcceptanceWatch, marginal_cap, pass_caps, step_threshold
from specdec.engine.policy import GammaPolicy
from policy_sim import Cell, run_rows, simulate

# T(γ)/T(0) of the 8-slot head table (issue 21: γ = 4 1.46x plain at α 0.80); speculation is cheap at few rows
CHEAP = Cell("8 slots head", 8, 8 / 5905, ((4, expected_tokens(0.8, 4) / 1.46),), 0.8)
LONG = dataclasses.replace(CHEAP, new_tokens=(1500, 2500), requests=24)  # long requests: a sticky running α
DROP, BACK = 300, 700  # the dropping row's α is 0.05 over these steps, 0.8 before and after


def _drop(step):
    return [0.8, 0.8, 0.8, 0.05 if DROP <= step < BACK else 0.8]


def _policy(watch=None, **kw):
    return GammaPolicy("auto", 8, watch=watch, **kw)


def test_a_collapsed_row_falls_back_within_bounded_steps_and_comes_back():
    for seed in range(3):
        policy = _policy()
        steps = run_rows(policy, _drop, 1600, CHEAP, seed=seed)
        held = [i for i, (g, caps) in enumerate(steps) if g > 0 and caps[3] == 0]
        assert held and min(held) >= DROP, held[:5]  # never before its drop (the steady rows never: below)
        assert min(held) - DROP <= 30, min(held)  # detected within 30 steps (≈ 11 expected at h = ln 1e6)
        late = [caps[3] for g, caps in steps[1400:] if g > 0]
        assert late and all(c > 0 for c in late), late  # back to drafting after the cool-downs once α recovered
        assert all(c > 0 for g, caps in steps for c in caps[:3] if g > 0)  # the steady rows kept drafting
        assert policy.report()["collapses"] >= 1 and policy.report()["fallback_steps"] > 0


def test_a_steady_row_never_falls_back():
    # P(a false alarm within N verified positions) <= N * 1e-6 while α >= its estimate: 3000 steps × 5 seeds
    for seed in range(5):
        policy = _policy()
        steps = run_rows(policy, lambda step: [0.6], 3000, CHEAP, seed=seed)
        report = policy.report()
        assert report["collapses"] == 0 and report["drafter_collapses"] == 0, (seed, report)
        assert sum(g > 0 for g, _ in steps) > 1500  # it speculated throughout (the test had positions to test)


def test_the_disabled_detector_never_falls_back_and_is_slower_in_a_collapse():
    policy = _policy(AcceptanceWatch(None))
    steps = run_rows(policy, _drop, 1600, CHEAP, seed=0)
    assert all(caps[3] == g for g, caps in steps) and policy.report()["collapses"] == 0  # never held back
    rates = {}
    for name, false_alarm in (("on", 1e-6), ("off", None)):
        policy = _policy(AcceptanceWatch(false_alarm))
        rates[name] = simulate(LONG, policy=policy, seed=1, eos=0.0, collapse=(300, 1500, 0.05))
        if false_alarm:
            assert policy.report()["drafter_collapses"] >= 1, policy.report()
    assert rates["on"]["tok_s"] > 1.03 * rates["off"]["tok_s"], rates  # (seeds 1-5: +4% to +10%, median +7.6%)


def test_no_collapse_no_change_in_the_traffic():
    # without a collapse the watch stays silent: the same choices as with it disabled
    runs = [simulate(CHEAP, policy=_policy(AcceptanceWatch(w)), seed=2, requests=120) for w in (1e-6, None)]
    assert runs[0]["gammas"] == runs[1]["gammas"] and runs[0]["tok_s"] == runs[1]["tok_s"]


def test_marginal_cap_against_thm_3_8_by_hand():
    # α = 0.8: the extra token at depth j is α^j = 0.8, 0.64, 0.512, 0.4096, ...; E(0.8, 3) = 2.952
    assert [marginal_cap(0.8, 8, t) for t in (0.9, 0.8, 0.6, 0.52, 0.5, 0.45, 0.41, 0.4)] == [0, 1, 2, 2, 3, 3, 3, 4]
    assert 1 + 0.8 + 0.64 + 0.512 == pytest.approx(expected_tokens(0.8, 3)) == pytest.approx(2.952)
    assert marginal_cap(0.8, 2, 0.1) == 2  # never past the step's γ
    assert marginal_cap(0.8, 8, 0.3, coverage=0.5) == 2  # ρ = 0.5 halves each depth: 0.4, 0.32 ≥ 0.3 > 0.256
    # T(γ) = T(0)(1 + γc), c = 0.1: the threshold is τ̄ c / (1 + γc); at Thm 3.8's best γ the row drafts it
    # α = 0.5: S(1, 2, 3) = 1.3636, 1.4583, 1.4423 → γ* = 2; θ = 1.75 × 0.1 / 1.2 = 0.14583; 0.25 ≥ θ > 0.125
    # α = 0.8: γ* = 6 (S = 2.4696); θ = 3.951424 × 0.1 / 1.6 = 0.246964; 0.8^6 = 0.262 ≥ θ > 0.8^7 = 0.210
    for alpha, best, theta in ((0.5, 2, 0.1458333), (0.8, 6, 0.246964)):
        s = {g: walltime_improvement(alpha, g, 0.1) for g in range(1, 12)}
        assert max(s, key=s.get) == best
        times = {0: 1.0, best: 1.0 + 0.1 * best}
        assert step_threshold(times, best, expected_tokens(alpha, best)) == pytest.approx(theta, rel=1e-5)
        assert marginal_cap(alpha, best + 4, theta) == best


def test_row_cost_tokens_caps_a_weak_row_below_a_strong_one():
    steps = run_rows(_policy(row_cost="tokens"), lambda step: [0.9, 0.2], 400, CHEAP, seed=0)
    spec = [caps for g, caps in steps[200:] if g > 1]
    assert spec and all(weak < strong for strong, weak in spec), spec[:5]
    plain = run_rows(_policy(), lambda step: [0.9, 0.2], 400, CHEAP, seed=0)  # "shape": a row pays nothing apart
    assert all(caps[0] == caps[1] == g for g, caps in plain)


def test_pass_caps_restores_the_engine_caps_once_after_the_last_cap_lifts():
    caps, capped = pass_caps([None, 2], [0, 2], None, 8, False, running=[1, 2])
    assert caps == (0, 2) and capped
    assert pass_caps([None, 2], [None, 2], None, 8, True, running=[1, 2]) == ((8, 2), False)
    assert pass_caps([None, 2], [None, 2], None, 8, False, running=[1, 2]) == (None, False)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="false_alarm"):
        AcceptanceWatch(false_alarm=2.0)
    with pytest.raises(ValueError, match="ratio"):
        AcceptanceWatch(ratio=1.0)
    with pytest.raises(ValueError, match="cooldown"):
        AcceptanceWatch(cooldown=64, max_cooldown=32)
    with pytest.raises(ValueError, match="row_cost"):
        GammaPolicy("auto", 8, row_cost="rows")
