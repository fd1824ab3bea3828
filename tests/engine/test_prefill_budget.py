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


@pytest.mark.parametrize("stall", [0.25, 0.5, 1.0])
def test_the_budget_converges_to_the_allowed_stall_despite_launch_overhead(stall):
    """seconds(B) = 4 ms + B × 2 µs, decode step 30 ms: the fed prefill settles at stall × 30 ms (within 2%); a
    per-token rate taken at one size and kept (the negative control: the cold budget's rate) misses it by the
    overhead's share."""
    step, overhead, per_token = 0.030, 0.004, 2e-6
    budget = AutoBudget(stall)
    tokens = _settle(budget, step, overhead, per_token)
    assert overhead + tokens * per_token == pytest.approx(stall * step, rel=0.02)
    frozen = stall * step / ((overhead + COLD * per_token) / COLD)  # the rate measured once, at COLD tokens
    assert abs(overhead + frozen * per_token - stall * step) > 0.1 * stall * step


def test_the_budget_follows_the_decode_step():
    """More rows decoding (a longer step) allow proportionally more prefill; the median forgets the old load."""
    budget = AutoBudget(0.5)
    small = _settle(budget, 0.010, 0.0, 5e-6)
    large = _settle(budget, 0.040, 0.0, 5e-6)
    assert small == pytest.approx(0.5 * 0.010 / 5e-6, rel=0.01) and large == pytest.approx(4 * small, rel=0.02)


def test_the_budget_keeps_a_floor_when_one_forward_exceeds_the_stall():
    """A forward's launches alone (20 ms) exceed the allowed 5 ms: the budget stays at FLOOR (progress; the
    deadline `prefill_steps` feeds the backlog), it does not collapse to 0."""
    assert _settle(AutoBudget(0.5), 0.010, 0.020, 1e-6) == FLOOR
