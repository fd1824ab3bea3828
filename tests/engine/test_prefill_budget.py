"""The "auto" prefill budget's arithmetic (`engine/prefill_budget.py`): pure, on synthetic costs — it converges to
the tokens whose feed takes `stall` × the decode step (launch overhead included, no fit), follows the decode step
when the load changes, keeps a floor when one forward alone exceeds the allowed stall, and is `COLD` until both
rates are measured."""

import pytest

from specdec.engine.prefill_budget import COLD, FLOOR, AutoBudget


def _settle(budget: AutoBudget, step_s: float, overhead_s: float, per_token_s: float, steps: int = 400) -> int:
    """Run `steps` engine steps whose decode takes `step_s` and whose prefill of B tokens takes overhead + B × per
    token (what an eager forward costs: launches, then work), the budget fed in full each step → the budget then."""
    for _ in range(steps):
        budget.decoded(step_s)
        tokens = budget.budget()
        budget.fed(tokens, overhead_s + tokens * per_token_s)
    return budget.budget()


def test_the_budget_is_cold_until_both_rates_are_measured():
    budget = AutoBudget(0.5)
    assert budget.budget() == COLD
    budget.decoded(0.02)
    assert budget.budget() == COLD  # no prefill measured yet
    budget.fed(100, 0.001)
    assert budget.budget() == int(0.5 * 0.02 / 1e-5)  # 10 ms allowed at 10 µs a token
    assert budget.report()["budget"] == budget.budget() and budget.report()["decode_step_ms"] == pytest.approx(20)


@pytest.mark.parametrize("stall", [0.5, 1.0])
def test_the_budget_is_the_tokens_the_allowed_stall_feeds_launch_overhead_included(stall):
    """seconds(B) = 4 ms + B × 2 µs, decode step 30 ms: the fit recovers a and b from the feeds' varied sizes and
    the fed prefill settles at stall × 30 ms (within 2%); a per-token rate taken at one size and kept (the control:
    the cold budget's) misses it by the overhead's share."""
    step, overhead, per_token = 0.030, 0.004, 2e-6
    budget = AutoBudget(stall)
    tokens = _settle(budget, step, overhead, per_token)
    assert budget.feed_cost() == pytest.approx((overhead, per_token), rel=1e-3)
    assert overhead + tokens * per_token == pytest.approx(stall * step, rel=0.02)
    frozen = stall * step / ((overhead + COLD * per_token) / COLD)  # the rate measured once, at COLD tokens
    assert abs(overhead + frozen * per_token - stall * step) > 0.1 * stall * step


def test_the_budget_never_falls_below_what_amortizes_a_feeds_launches():
    """A feed's launches (8 ms) exceed the allowed stall (0.5 × 10 ms): no budget meets the bound, and one sized by
    the stall alone would be the floor — 16 tokens a step of pure launches (what the H200 run showed: 16–71 tokens,
    every arm ~0.6x). The budget is a / b instead: each feed does as much work as its launches cost."""
    budget = AutoBudget(0.5)
    tokens = _settle(budget, 0.010, 0.008, 10e-6)
    assert tokens == pytest.approx(0.008 / 10e-6, rel=0.01)  # 800 tokens: half the feed's time is work
    assert max((0.5 * 0.010 - 0.008) / 10e-6, FLOOR) == FLOOR  # the control: the stall alone leaves the floor


def test_the_budget_follows_the_decode_step():
    """More rows decoding (a longer step) allow proportionally more prefill; the median forgets the old load."""
    budget = AutoBudget(0.5)
    small = _settle(budget, 0.010, 0.0, 5e-6)
    large = _settle(budget, 0.040, 0.0, 5e-6)
    assert small == pytest.approx(0.5 * 0.010 / 5e-6, rel=0.01) and large == pytest.approx(4 * small, rel=0.02)


def test_the_fit_falls_back_to_the_mean_rate_when_sizes_do_not_vary():
    """Feeds of one size cannot tell launches from work: b is their mean seconds per token, a = 0."""
    budget = AutoBudget(0.5)
    for seconds in (0.010, 0.012, 0.011, 0.009):
        budget.fed(1000, seconds)
    assert budget.feed_cost() == pytest.approx((0.0, 10.5e-6))
