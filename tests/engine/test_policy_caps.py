"""The γ policy with per-request caps (`GammaPolicy.choose(..., caps=)`): a step's γ is at least its rows' largest
fixed cap; without an "auto" row it is that floor (or the smallest built shape above it); "auto" chooses among the
arms at or above the floor and counts each row at min(γ, its cap); the extra tokens per cap group are Thm 3.8's."""

import pytest

from specdec.analysis import expected_tokens
from specdec.engine.policy import GammaPolicy
from specdec.engine.policy_depth import extra_tokens


class _Row:
    estimate = None


def _timed(policy: GammaPolicy, batch: int = 8) -> GammaPolicy:
    for gamma, seconds in ((0, 1.0), (1, 1.05), (2, 1.1), (4, 1.2), (8, 1.4)):
        for _ in range(3):
            policy.record_step(batch, gamma, seconds, 1.0, length=100)
    return policy


def test_without_an_auto_row_the_step_runs_the_largest_cap_or_the_built_shape_above_it():
    policy = GammaPolicy("auto", 8)
    rows = [_Row()] * 3
    assert policy.choose(8, rows, caps=[0, 3, 1]) == 3  # eager (ready None): exactly the floor
    assert policy.choose(8, rows, caps=[0, 0, 0]) == 0
    built = {0, 1, 2, 4, 8}
    assert policy.choose(8, rows, caps=[0, 3, 1], ready=built.__contains__) == 4  # 3 not built: the next built
    assert policy.choose(8, rows, caps=[5, 7, 0], ready=built.__contains__) == 8
    assert policy.choose(8, rows, caps=[2, 0, 0], ready=built.__contains__) == 2
    assert policy.choose(8, rows, caps=[6, 0, 0], ready={0}.__contains__) == 6  # nothing above built: captures 6
    fixed = GammaPolicy(3, 8)  # caps=None: every row takes the engine's default
    assert {fixed.choose(8, rows) for _ in range(5)} == {3} and fixed.choose(8, rows, caps=[3, 0, 5]) == 5


def test_auto_rows_choose_at_or_above_the_floor_and_a_kept_decision_below_it_is_dropped():
    policy = _timed(GammaPolicy("auto", 8))

    def estimates():  # α 0.3: γ = 1 is the best arm for auto rows alone
        return [(30.0, 100.0, 25.0, 25.0)] * 4

    rows = [_Row()] * 4
    alone = {policy.choose(8, rows, estimates, length=100, caps=[None] * 4) for _ in range(3)}
    assert alone <= {0, 1, 2}
    assert policy.choose(8, rows, estimates, length=100, caps=[None, None, 4, 0]) >= 4  # the cap-4 row needs 4
    assert set(policy.last_rates) == {4, 8}  # only the arms at or above the floor were weighed


def test_plain_and_capped_rows_weigh_the_auto_choice_at_their_own_depth():
    """Rows [auto, plain, cap 2, plain] at α 0.95: the step's predicted tokens per row at γ are
    1 + (E(α, γ) − 1 + E(α, min(γ, 2)) − 1) / 4 (Thm 3.8; the plain rows add nothing past their one token)."""
    policy = _timed(GammaPolicy("auto", 8))
    policy.choose(8, [_Row()] * 4, lambda: [(95.0, 100.0, 25.0, 25.0)] * 4, length=100, caps=[None, 0, 2, 0])
    alpha = min((95.0 + policy.prior_alpha * 8.0) / 108.0, 1.0)  # (a row's α with the pooled prior, weight 8)
    assert set(policy.predicted) == {2, 4, 8}  # the arms at or above the floor
    for gamma, tau in policy.predicted.items():
        want = 1.0 + (expected_tokens(alpha, gamma) - 1.0 + expected_tokens(alpha, min(gamma, 2)) - 1.0) / 4
        assert tau == pytest.approx(want, rel=1e-9), gamma


def test_extra_tokens_count_each_capped_row_at_min_gamma_cap():
    rows = [(0.7, 1.0), (0.9, 0.5), (0.5, 1.0), (0.8, 1.0)]
    caps = [None, 2, 0, 5]
    sums = extra_tokens(rows, (1, 2, 4, 8), None, caps)
    for g in (1, 2, 4, 8):
        want = sum(c * (expected_tokens(a, g if cap is None else min(g, cap)) - 1.0) for (a, c), cap in zip(rows, caps))
        assert sums[g] == pytest.approx(want)
    assert extra_tokens(rows, (1, 2, 4, 8), None, [None] * 4) == extra_tokens(rows, (1, 2, 4, 8))  # (no cap: as before)
    shaped = extra_tokens(rows, (4, 8), [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], [3, 3, 3, 3])
    assert shaped[4] == pytest.approx(shaped[8]) == pytest.approx(extra_tokens(rows, (3,), [1.0, 0.9, 0.8])[3])
