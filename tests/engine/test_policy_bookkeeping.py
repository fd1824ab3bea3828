"""The engine's "auto" γ policy, unit by unit: fixed γ, Thm 3.8's extra tokens, the candidates, probing, the
step-time tables (medians per length bucket, borrowed across buckets), holding a decision, the catch-up and
admission charges, and the warmed policy's restriction to built shapes. The policy against recorded step-cost
tables in a simulated engine is tests/engine/test_policy.py."""

import pytest

from specdec.analysis import expected_tokens
from specdec.engine.policy import _HOLD, GammaPolicy, length_bucket


class _Row:
    estimate = None


def test_ready_restricts_a_warmed_policy_to_built_shapes_and_charges_captures_otherwise():
    policy = GammaPolicy("auto", 8)
    for gamma, seconds in ((0, 1.0), (2, 1.1), (4, 1.2), (8, 1.4)):
        for _ in range(3):
            policy.record_step(8, gamma, seconds, 1.0, length=100)

    def estimates():  # α 0.9: γ = 8 is the best arm when built
        return [(90.0, 100.0, 25.0, 25.0)] * 8

    built = {0, 2, 4}
    policy.only_ready = True
    chosen = {policy.choose(8, [_Row()] * 8, estimates, length=100, ready=built.__contains__) for _ in range(40)}
    assert chosen <= built and 4 in chosen and policy.last_rates.keys() == built
    policy.set_fixed("auto")
    assert policy.choose(8, [_Row()] * 8, estimates, length=100, ready=set().__contains__) == 8  # none built: any
    policy.only_ready = False  # no warm-up: γ = 8 carries its capture, spread over the regime's steps
    policy.set_fixed("auto")
    policy.capture_events[:] = [1000.0]  # a capture that costs 1000 s is never worth it
    policy.choose(8, [_Row()] * 8, estimates, length=100, ready=built.__contains__)
    rates = policy.last_rates
    assert max(rates, key=rates.get) == 4 and rates.keys() == {0, 1, 2, 4, 8}
    policy.set_fixed("auto")
    policy.capture_events.clear()  # the prior: 16 plain steps over 256 steps: γ = 8 still pays
    policy.choose(8, [_Row()] * 8, estimates, length=100, ready=built.__contains__)
    rates = policy.last_rates
    assert max(rates, key=rates.get) == 8


def test_a_fixed_gamma_is_exactly_that_gamma():
    policy = GammaPolicy(3, 8)
    assert {policy.choose(8, [_Row()]) for _ in range(50)} == {3}
    policy.set_fixed("auto")
    assert policy.choose(8, [_Row()]) == 2  # "auto" at a new bucket: times γ = default (2) first
    with pytest.raises(ValueError, match="num_draft_tokens"):
        policy.set_fixed(9)


def test_extra_tokens_are_thm_3_8s():
    from specdec.engine.policy import _extra_tokens

    rows = [(0.7, 1.0), (0.2, 0.5), (1.0, 1.0), (0.0, 1.0)]
    sums = _extra_tokens(rows, (1, 2, 4, 8))
    for g in (1, 2, 4, 8):
        assert sums[g] == pytest.approx(sum(c * (expected_tokens(a, g) - 1.0) for a, c in rows))


def test_candidates_reach_max_draft_tokens():
    assert GammaPolicy("auto", 8).candidates == [1, 2, 4, 8]
    assert GammaPolicy("auto", 5).candidates == [1, 2, 4, 5]
    assert GammaPolicy("auto", 12).candidates == [1, 2, 4, 8, 12]


def test_a_new_bucket_probes_speculative_then_plain_steps_in_runs_of_two():
    """The first bucket times γ = default and plain steps (3 each) before deciding; plain probes never run more
    than 2 steps in a row, so a drafter with a cache needs no catch-up for them. A later bucket times the arm
    the engine runs, and plain steps, the same way."""
    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    chosen = []
    for bucket in (4, 16):
        for _ in range(12):
            gamma = policy.choose(bucket, [_Row()] * 4, lambda: [(9.0, 10.0, 5.0, 5.0)] * 4, length=100)
            chosen.append((bucket, gamma))
            policy.record_step(bucket, gamma, 1.0 + 0.05 * gamma, 1.0, length=100)
    assert chosen[0] == (4, policy.default) == (4, 2)
    for bucket in (4, 16):
        timed = {g: len(v) for (b, g, _), v in policy.samples.items() if b == bucket}
        assert timed.get(0, 0) >= 3 and sum(timed.values()) - timed.get(0, 0) >= 3, timed
    run = longest = 0
    for _, g in chosen:
        run = run + 1 if g == 0 else 0
        longest = max(longest, run)
    assert longest <= 2 and chosen[-1][1] > 0  # (α 0.9, speculation 5% dearer per γ: it wins)


def test_times_are_medians_per_length_bucket_and_borrowed_across_buckets():
    policy = GammaPolicy("auto", 8)
    for seconds in (1.0, 1.0, 9.0):  # a stray slow step does not move the median
        policy.record_step(4, 0, seconds, 1.0, length=100)
    for seconds in (2.0, 2.0, 2.0):
        policy.record_step(4, 4, seconds, 2.5, length=100)
    policy.record_step(4, 0, 2.0, 1.0, length=1000)  # the long bucket: plain steps cost twice as much
    assert policy.step_time(4, 0, 100) == 1.0 and policy.step_time(4, 4, 100) == 2.0
    assert policy.step_time(4, 4, 1000) == pytest.approx(4.0)  # γ=4 borrowed from ℓ=128, scaled by plain's 2x
    assert policy.step_time(4, 2, 100) == pytest.approx(1.5)  # interpolated in γ
    assert policy.step_time(4, 6, 100) == pytest.approx(2.5)  # extended along the 0 → 4 line
    assert policy.step_time(8, 0, 100) is None
    assert policy.report()["buckets"]["4"]["0"]["by_length_ms"] == {"128": 1000.0, "1024": 2000.0}
    assert length_bucket(1) == 64 and length_bucket(65) == 128 and length_bucket(128) == 128


def test_a_decision_is_kept_for_a_few_steps_and_reads_the_rows_once():
    policy = GammaPolicy("auto", 8)
    for bucket in (32,):
        for gamma, seconds in ((0, 1.0), (2, 1.2)):
            for _ in range(3):
                policy.record_step(bucket, gamma, seconds, 1.0)
    calls = []

    def estimates():  # every row: α ≈ 0.9 over 100 verified positions, drafting at every speculative step
        calls.append(1)
        return [(90.0, 100.0, 25.0, 25.0)] * 20

    rows = [_Row() for _ in range(22)]
    chosen = [policy.choose(32, rows[: 20 + i % 3], estimates) for i in range(_HOLD)]
    assert len(set(chosen)) == 1 and chosen[0] > 0 and len(calls) == 1  # rows coming and going: no re-decision
    for _ in range(3):  # at bucket 64 plain steps measure 14x faster (and the running arm was timed there too)
        policy.record_step(64, 0, 0.1, 1.0)
        policy.record_step(64, chosen[0], 1.8, 1.0)
    assert policy.choose(64, [_Row()] * 40, estimates) == 0 and len(calls) == 2  # a new bucket re-decides at once


def test_a_catch_up_after_plain_steps_counts_against_plain_steps():
    """Plain steps look cheap, but the next speculative step feeds the drafter what they committed: with that
    cost reported (a step with catch_up_of > 0), a choice that was plain (low α) turns speculative."""
    policy = GammaPolicy("auto", 8)
    for _ in range(3):
        policy.record_step(8, 0, 1.0, 1.0)
        policy.record_step(8, 4, 2.0, 1.0)
        policy.record_step(8, 2, 1.5, 1.0)

    def estimates():  # α 0.2 over 100 verified positions: every γ > 0 gives < 1 token per second (T(1) = 1.25 s)
        return [(20.0, 100.0, 25.0, 25.0)] * 8

    assert policy.choose(8, [_Row()] * 8, estimates) == 0
    policy.record_step(8, 4, 5.0, 2.0, catch_up_of=4)  # 3 s over the usual 2 s: 0.75 s more per plain step
    assert policy.times[(8, 4)] == 2.0  # (a catch-up step is no step time)
    policy.set_fixed("auto")  # drop the kept decision
    assert policy.choose(8, [_Row()] * 8, estimates) != 0
    assert policy.last_rates[0] == pytest.approx(1.0 / 1.75)


def test_the_admission_charge_is_feed_cost_times_prompt_per_request_times_finished_per_token():
    """2 ms per 1000 prompt tokens fed, 1000-token prompts, a request finishing every 100 tokens: 0.02 ms a token,
    whatever the regime — plain steps keep it (they finish requests and produce tokens too) — and nothing before a
    request finished (the first batch's admission is paid already)."""
    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    policy.record_admission(4000, 0.008, requests=4)  # a first batch of 4, fed
    policy.record_step(4, 2, 0.01, 2.0, rows=4)
    assert policy.admission.per_token() == 0.0  # nothing finished yet
    for step in range(400):  # every 25 plain steps of 4 rows × 1 token, a request finishes and another (unfed)
        if step % 25 == 24:  # takes its slot: 4 rows again, one of them new
            policy.record_admission(1000, None, requests=1)
        policy.record_step(4, 0, 0.01, 1.0, rows=4)
    assert policy.admission.per_token() == pytest.approx(2e-6 * 1000 / 100, rel=0.15)  # (a finish just counted)
    assert policy.admission.backlog() == pytest.approx(16 * 1000 * 2e-6, rel=1e-6)  # 16 prompts not fed yet
    policy.record_step(4, 2, 0.01, 2.0, rows=4)
    assert policy.admission.backlog() == 0.0  # a speculative step fed them
    report = policy.report()
    assert report["prompt_tokens_per_request"] == pytest.approx(1000) and report["feed_us_per_prompt_token"] == 2


def test_cold_feeds_then_a_plain_run_do_not_keep_the_feed_cost_10x_too_high():
    """Issue 21's H200 recheck: the first feeds (shapes run for the first time) cost ~10x the steady 1.5 µs per
    prompt token, then the engine ran plain and never fed the drafter again, so the estimate stayed ~10x too high
    and kept the charge (and the engine plain). The target's prefill, timed at every admission in every regime,
    warms up in the plain run; the drafter's feed is estimated as its measured share of the target's prefill of the
    same prompts (0.3 here, cold or warm) times that, and never above the target's. A policy told no target times
    (the negative control) keeps the cold estimate."""
    estimates = {}
    for told in (False, True):
        policy = GammaPolicy("auto", 8, plain_catches_up=True)
        for _ in range(3):  # cold: the drafter's and the target's first prefills of their shapes, 10x steady
            policy.record_admission(1000, 0.015, requests=1, target_seconds=0.05 if told else None)
        for step in range(400):  # a plain run: admissions unfed, the target's prefill warm (5 µs a prompt token)
            if step % 25 == 24:
                policy.record_admission(1000, None, requests=1, target_seconds=0.005 if told else None)
            policy.record_step(4, 0, 0.01, 1.0, rows=4)
        estimates[told] = policy.report()["feed_us_per_prompt_token"]
    assert estimates[False] == pytest.approx(15.0)  # the control: cold samples and nothing to correct them
    assert estimates[True] == pytest.approx(1.5)  # 0.3 of the target's warm prefill
    assert policy.report()["target_prefill_us_per_prompt_token"] == pytest.approx(5.0)
    assert policy.admission.per_token() == pytest.approx(1.5e-6 * 1000 / 100, rel=0.15)


def test_the_drafters_feed_is_never_estimated_above_the_targets_prefill():
    """Feeds only ever cold (15 µs a prompt token), no paired sample, the target's prefill warm at 3 µs: the bound."""
    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    policy.record_admission(1000, 0.015, requests=1)
    for _ in range(3):
        policy.record_admission(1000, None, requests=1, target_seconds=0.003)
    assert policy.report()["feed_us_per_prompt_token"] == pytest.approx(3.0)


def test_the_feed_cost_is_a_median_so_a_cold_full_batch_is_outvoted_by_two_warm_feeds():
    """A full first batch fed cold (15.6 µs a prompt token, 64 prompts in one sample) then two warm feeds (1.5 µs):
    the estimate is the warm cost (a token-weighted or decayed mean read ~15 µs); cold samples leave after
    `_FEED_WINDOW` feeds."""
    from specdec.engine.policy_admission import _FEED_WINDOW
    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    policy.record_admission(64_000, 1.0, requests=64)
    assert policy.report()["feed_us_per_prompt_token"] == pytest.approx(15.625)
    for _ in range(2):
        policy.record_admission(1000, 0.0015, requests=1)
    assert policy.report()["feed_us_per_prompt_token"] == pytest.approx(1.5)
    for _ in range(_FEED_WINDOW // 2):  # a cold majority in the window: the estimate is cold again
        policy.record_admission(1000, 0.0156, requests=1)
    assert policy.report()["feed_us_per_prompt_token"] > 10
    for _ in range(_FEED_WINDOW):  # all gone after a window of warm feeds
        policy.record_admission(1000, 0.0015, requests=1)
    assert policy.report()["feed_us_per_prompt_token"] == pytest.approx(1.5)


def test_the_feed_cost_is_at_most_what_the_drafter_measures_per_token_it_drafts():
    """Cold feeds only (15 µs a prompt token), the target's prefill as cold, no warm pair to scale by: the steps'
    drafting (0.4 ms for 64 rows × γ 4 = 1.6 µs a token) bounds the estimate — measured at fixed γ's too."""
    policy = GammaPolicy(4, 8, plain_catches_up=True)
    policy.record_admission(64_000, 0.96, requests=64, target_seconds=0.96)
    assert policy.report()["feed_us_per_prompt_token"] == pytest.approx(15.0)
    for _ in range(3):
        policy.record_step(64, 4, 0.004, 3.0, rows=64, draft_seconds=0.0004)
    report = policy.report()
    assert report["feed_us_per_prompt_token"] == pytest.approx(1.5625) == report["draft_us_per_token"]
    policy.record_step(64, 0, 0.002, 1.0, rows=64, draft_seconds=0.0)  # a plain step drafts nothing: no sample
    assert policy.report()["draft_us_per_token"] == pytest.approx(1.5625)


def test_the_gaps_between_steps_are_reported_per_arm_fixed_or_auto(monkeypatch):
    """What runs between two steps (admissions, the caller) is timed from one step's record to the next choice and
    reported under the arm of the step before it — a read-out to compare arms by, fixed γ's included."""
    import specdec.engine.policy_times as times

    clock = iter([0.0, 0.003, 1.0, 1.010, 2.0, 2.001])  # record → choose: 3 ms after γ 4, 10 ms, then 1 ms
    monkeypatch.setattr(times.time, "perf_counter", lambda: next(clock))
    policy = GammaPolicy(4, 8)
    policy.choose(8, [_Row()])  # (nothing recorded before it: no gap)
    for _ in range(3):
        policy.record_step(8, 4, 0.002, 3.0, rows=8)
        policy.choose(8, [_Row()])
    cell = policy.report()["buckets"]["8"]["4"]
    assert cell["gaps"] == 3 and cell["after_ms"] == pytest.approx(14 / 3, abs=1e-3) and cell["after_max_ms"] == 10.0
