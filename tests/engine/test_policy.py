"""The engine's "auto" γ: argmax over γ of (each row's expected tokens, Thm 3.8 with its measured α) / (the
measured step time at this batch bucket), checked against a simulated engine with a fake clock."""

import random

import pytest

from specdec.analysis import expected_tokens
from specdec.engine.policy import _HOLD, GammaPolicy


class _Row:
    estimate = None

    def __init__(self, alpha, budget=10**9):
        self.alpha, self.budget = alpha, budget


def _simulate(alpha, step_time, steps=2000, batch=8, noisy=True, budget=10**9, jitter=0.0, seed=0, gamma=None,
              device_counters=False):
    """Run the policy (or a fixed γ) against a simulated engine: rows of acceptance rate α (a number, or a
    function of the row index), each step of `step_time(γ)` seconds (times 1 + jitter·noise, and now and then 3x).
    noisy: accepted drafts follow the geometric law and β is the 0/1 acceptance of each verified position (as
    at T = 0); else each row produces exactly E(α, γ) tokens with β = α. Finished rows (budget tokens) are
    replaced by new ones. → (tokens per second realized, the γ of each step, estimates() calls)."""
    rng = random.Random(seed)
    policy = GammaPolicy("auto" if gamma is None else gamma, 8)
    rate_of = alpha if callable(alpha) else (lambda i: alpha)
    made = iter(range(10**9))

    def new_row():
        return _Row(rate_of(next(made)), budget)

    rows, chosen, calls = [new_row() for _ in range(batch)], [], [0]

    def estimates():  # as the engine's device counters: (Σβ, verified, speculative steps, steps that drafted)
        calls[0] += 1
        return [row.estimate.totals() if row.estimate else (0.0, 0.0, 0.0, 0.0) for row in rows]

    tokens = seconds = 0.0
    for _ in range(steps):
        g = policy.choose(batch, rows, estimates if device_counters else None)
        produced = 0.0
        for row in rows:
            a = row.alpha
            if noisy:
                n = 0
                while n < g and rng.random() < a:
                    n += 1
                reached, beta = min(n + 1, g), float(n)
            else:
                n, reached, beta = expected_tokens(a, g) - 1, g, a * g
            produced += n + 1
            if g:
                policy.record_row(row, beta_sum=beta, reached=reached, drafting=1)
            row.budget -= n + 1
        t = step_time(g) * (1 + jitter * rng.random()) * (3.0 if jitter and rng.random() < 0.03 else 1.0)
        policy.record_step(batch, g, t, produced / batch)
        tokens, seconds = tokens + produced, seconds + t
        chosen.append(g)
        rows = [row if row.budget > 0 else new_row() for row in rows]
    return tokens / seconds, chosen, calls[0]


def _best_fixed(alpha, step_time):
    rates = {g: expected_tokens(alpha, g) / step_time(g) for g in (0, 1, 2, 4, 6)}
    best = max(rates, key=rates.get)
    return best, rates[best]


def _near_best(alpha, step_time, within=0.05):
    """The γ's whose E/T is within 5% of the best (at α = 0.8, T = 1 + 0.1γ: 4 and 6, 3% apart)."""
    rates = {g: expected_tokens(alpha, g) / step_time(g) for g in (0, 1, 2, 4, 6)}
    return {g for g, r in rates.items() if r >= (1 - within) * max(rates.values())}


@pytest.mark.parametrize("noisy", [False, True])
def test_a_good_drafter_settles_on_the_gamma_that_maximizes_e_over_t(noisy):
    def step_time(g):
        return 1.0 + 0.1 * g

    best, rate = _best_fixed(0.8, step_time)
    assert best == 6
    realized, chosen, _ = _simulate(0.8, step_time, noisy=noisy, jitter=0.2 if noisy else 0.0)
    late = chosen[-400:]
    assert sum(g in _near_best(0.8, step_time) for g in late) >= 0.95 * len(late)
    assert late.count(best) >= 0.5 * len(late)
    if not noisy:  # (with jitter the clock runs slower than step_time: compare with the simulated fixed γ)
        assert realized >= 0.95 * rate
    fixed, _, _ = _simulate(0.8, step_time, noisy=noisy, jitter=0.2 if noisy else 0.0, gamma=best, seed=1)
    assert realized >= 0.95 * fixed  # the same simulated engine at the best fixed γ


@pytest.mark.parametrize("noisy", [False, True])
def test_a_weak_drafter_falls_back_to_plain_decoding(noisy):
    def step_time(g):
        return 1.0 + 0.5 * g

    assert _best_fixed(0.2, step_time)[0] == 0
    realized, chosen, _ = _simulate(0.2, step_time, noisy=noisy, jitter=0.2 if noisy else 0.0)
    assert chosen[:6] == [4, 4, 4, 0, 0, 0]  # a new bucket times a speculative and a plain step first
    late = chosen[-400:]
    assert late.count(0) >= 0.95 * len(late)  # plain, but for a rare re-run of the runner-up
    fixed, _, _ = _simulate(0.2, step_time, noisy=noisy, jitter=0.2 if noisy else 0.0, gamma=0, seed=1)
    assert realized >= 0.95 * fixed


def test_the_choice_follows_the_rows_not_the_history():
    """Speculation pays for rows of α = 0.9 and not for rows of α = 0.1 (T = 1 + 0.3γ): requests of one kind,
    then of the other, arrive at batch 1; the policy follows the current row's acceptance."""
    def step_time(g):
        return 1.0 + 0.3 * g

    assert _best_fixed(0.9, step_time)[0] > 0 and _best_fixed(0.1, step_time)[0] == 0
    kinds = lambda i: 0.9 if (i // 20) % 2 == 0 else 0.1  # noqa: E731 (20 requests of each kind in turn)
    realized, chosen, _ = _simulate(kinds, step_time, steps=3000, batch=1, budget=128)
    rates = [_best_fixed(a, step_time)[1] for a in (0.9, 0.1)]
    assert 0 in chosen[-1000:] and any(chosen[-1000:])  # both regimes seen late in the run
    fixed = max(_simulate(kinds, step_time, steps=3000, batch=1, budget=128, gamma=g, seed=1)[0] for g in (0, 2, 4))
    assert realized >= 0.97 * fixed and realized <= max(rates)


def test_batch_one_requests_in_turn_start_at_the_pooled_alpha():
    """Each new request (a new row, nothing measured yet) starts from the α of the rows seen before it."""
    def step_time(g):
        return 1.0 + 0.1 * g

    realized, chosen, _ = _simulate(0.8, step_time, steps=1500, batch=1, budget=128)
    assert sum(g in _near_best(0.8, step_time) for g in chosen[-500:]) >= 0.95 * 500
    assert realized >= 0.95 * _simulate(0.8, step_time, steps=1500, batch=1, budget=128, gamma=6, seed=1)[0]


def test_per_row_totals_are_read_only_when_the_policy_re_decides():
    def step_time(g):
        return 1.0 + 0.1 * g

    steps = 800
    _, chosen, calls = _simulate(0.8, step_time, steps=steps, device_counters=True)
    assert 0 < calls <= steps / _HOLD + 8  # at most one read per held decision (+ the first ones)
    assert sum(g in _near_best(0.8, step_time) for g in chosen[-100:]) >= 90


def test_a_fixed_gamma_is_exactly_that_gamma():
    policy = GammaPolicy(3, 8)
    assert {policy.choose(8, [_Row(0.5)]) for _ in range(50)} == {3}
    policy.set_fixed("auto")
    assert policy.choose(8, [_Row(0.5)]) == 4  # "auto" at a new bucket: times γ = default first
    with pytest.raises(ValueError, match="num_draft_tokens"):
        policy.set_fixed(9)


def test_times_are_medians_of_the_last_steps_and_untimed_gammas_interpolate():
    policy = GammaPolicy("auto", 8)
    for seconds in (1.0, 1.0, 9.0):  # a stray slow step does not move the median
        policy.record_step(4, 0, seconds, 1.0)
    for seconds in (2.0, 2.0, 2.0):
        policy.record_step(4, 4, seconds, 2.5)
    assert policy.times == {(4, 0): 1.0, (4, 4): 2.0}
    row = _Row(0.5)
    policy.record_row(row, beta_sum=100.0, reached=100, drafting=1)  # α ≈ 1: the largest candidate wins
    assert policy.choose(4, [row]) == 6
    alpha = (100 + policy.prior_alpha * 4) / 104  # the row's Σβ / verified with the pooled prior (weight 4)
    for g, t in ((2, 1.5), (6, 2.5)):  # T interpolated between 0 and 4, extended from 4 with their slope
        assert policy.last_rates[g] == pytest.approx(expected_tokens(alpha, g) / t)


def test_a_decision_is_kept_for_a_few_steps_but_not_across_batch_buckets():
    policy = GammaPolicy("auto", 8)
    for bucket in (4, 8):
        for gamma, seconds in ((0, 1.0), (4, 1.4)):
            for _ in range(3):
                policy.record_step(bucket, gamma, seconds, 1.0)
    rows, calls = [_Row(0.5) for _ in range(4)], []

    def estimates():  # every row: α ≈ 0.9 over 100 verified positions, drafting at every speculative step
        calls.append(1)
        return [(90.0, 100.0, 25.0, 25.0)] * len(rows)

    chosen = [policy.choose(4, rows, estimates) for _ in range(_HOLD)]
    assert chosen == [6] * _HOLD and len(calls) == 1  # one read for the whole held decision
    policy.samples[(8, 0)] = [0.1] * 3  # at bucket 8 plain steps measure 14x faster: plain wins there
    assert policy.choose(8, rows + rows, estimates) == 0 and len(calls) == 2  # a new bucket re-decides at once
    assert policy.choose(16, rows * 4, estimates) == 4  # an untimed bucket times γ = default first


def test_a_catch_up_after_plain_steps_counts_against_plain_steps():
    """Plain steps look cheap, but the next speculative step feeds the drafter what they committed: with that
    cost reported, a choice that was plain (low α) turns speculative."""
    policy = GammaPolicy("auto", 8)
    for _ in range(3):
        policy.record_step(8, 0, 1.0, 1.0)
        policy.record_step(8, 4, 2.0, 1.0)
    rows = [_Row(0.5) for _ in range(8)]

    def estimates():  # α 0.2 over 100 verified positions: every γ > 0 gives < 1 token per second (T(1) = 1.25 s)
        return [(20.0, 100.0, 25.0, 25.0)] * len(rows)

    assert policy.choose(8, rows, estimates) == 0
    policy.record_catch_up(8, seconds=3.0, plain_steps=4)  # 0.75 s more per plain step: 1 token per 1.75 s
    policy.set_fixed("auto")  # drop the kept decision
    assert policy.choose(8, rows, estimates) != 0
    assert policy.last_rates[0] == pytest.approx(1.0 / 1.75)


def test_a_policy_whose_plain_steps_need_a_catch_up_never_explores_plain_steps():
    """With a drafter that keeps a cache, "auto" times only speculative γ's and chooses among them."""
    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    rows = [_Row(0.5) for _ in range(4)]

    def estimates():  # α 0.05: plain would win if it were an arm
        return [(5.0, 100.0, 25.0, 25.0)] * len(rows)

    chosen = []
    for _ in range(200):
        gamma = policy.choose(4, rows, estimates)
        chosen.append(gamma)
        policy.record_step(4, gamma, 1.0 + 0.1 * gamma, 1.0)
    assert 0 not in chosen and chosen[-1] == 1  # the cheapest speculative step once timed
    assert set(policy.last_rates) == {1, 2, 4, 6}
    unguarded = GammaPolicy("auto", 8)  # the same traffic: plain steps are explored, then chosen
    for _ in range(200):
        gamma = unguarded.choose(4, rows, estimates)
        unguarded.record_step(4, gamma, 1.0 + 0.1 * gamma, 1.0)
    assert gamma == 0
