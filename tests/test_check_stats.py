"""The library's chi-square (`specdec.exactness.stats`, the one definition the tests use) against scipy."""

import math

import numpy as np
import pytest

from specdec.exactness.stats import chi2_pvalue, chi2_survival, chi_square

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("statistic, dof", [(0.5, 3), (1.0, 1), (30.0, 10), (200.0, 50), (500.0, 30), (80.0, 120)])
def test_survival_matches_scipy_far_into_the_tail(statistic, dof):
    assert chi2_survival(statistic, dof) == pytest.approx(scipy_stats.chi2.sf(statistic, dof), rel=1e-9)


def test_survival_edges():
    assert chi2_survival(0.0, 5) == 1.0 and chi2_survival(3.0, 0) == 1.0 and chi2_survival(math.inf, 4) == 0.0


def test_pvalue_matches_scipy_with_pooled_cells():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(40, 0.3))  # many cells with expectation < 5: pooled into one
    samples = rng.choice(40, size=3000, p=probs)
    observed = np.bincount(samples, minlength=40).astype(float)
    expected = probs * 3000
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    assert chi2_pvalue(samples, probs) == pytest.approx(scipy_stats.chisquare(obs, exp).pvalue, rel=1e-9)
    wrong = probs.copy()
    wrong[:5] *= 1.5
    assert chi2_pvalue(samples, wrong) < 1e-4 < chi2_pvalue(samples, probs)


def test_impossible_outcome_rejects_outright():
    result = chi_square([10, 5, 1], [10, 6, 0])
    assert result.p_value == 0.0 and result.impossible == 1 and math.isinf(result.statistic)
    assert chi2_pvalue([0, 1, 2], [0.5, 0.5, 0.0]) == 0.0


def test_groups_sum_statistics_and_degrees_of_freedom():
    """Independent groups with fixed totals: statistics add, each group loses one degree of freedom."""
    a_obs, a_exp = np.array([30, 50, 20.0]), np.array([25, 50, 25.0])
    b_obs, b_exp = np.array([12, 28.0]), np.array([20, 20.0])
    both = chi_square(np.concatenate([a_obs, b_obs]), np.concatenate([a_exp, b_exp]), groups=[0, 0, 0, 1, 1])
    a, b = chi_square(a_obs, a_exp), chi_square(b_obs, b_exp)
    assert both.dof == a.dof + b.dof == 3 and both.cells == 5 and both.samples == 140
    assert both.statistic == pytest.approx(a.statistic + b.statistic)
    assert both.p_value == pytest.approx(scipy_stats.chi2.sf(a.statistic + b.statistic, 3))


@pytest.mark.parametrize("observed, expected, groups", [([1, 2], [1.0], None), ([1], [-1.0], None),
                                                         ([1, 2], [1.0, 2.0], [0])])
def test_malformed_counts_are_refused(observed, expected, groups):
    with pytest.raises(ValueError):
        chi_square(observed, expected, groups)


def test_the_test_suite_uses_the_library_definition():
    import stats_utils

    assert stats_utils.chi2_pvalue is chi2_pvalue


def test_false_alarms_stay_near_the_level_for_peaked_laws():
    """Under the law itself, p < 0.01 happens about 1% of the time with the check's cell size (10)."""
    from specdec.exactness.laws import CELL_MIN_EXPECTED

    rng = np.random.default_rng(0)
    logits = rng.normal(size=64) * 2.5
    probs = np.exp(logits) / np.exp(logits).sum()
    pvalues = np.array([chi_square(rng.multinomial(300, probs), probs * 300, min_expected=CELL_MIN_EXPECTED).p_value
                        for _ in range(3000)])
    assert 0.004 < (pvalues < 0.01).mean() < 0.018
    assert 0.07 < (pvalues < 0.1).mean() < 0.13
