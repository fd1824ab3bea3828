"""Tests for specdec.analysis: the §3 formulas against the paper's tables, then the measurements."""

from __future__ import annotations

import math

import pytest

from specdec.analysis import (
    expected_tokens,
    operations_increase,
    optimal_gamma,
    speculation_pays,
    walltime_improvement,
)

# Table 1 of the paper (c = ĉ = 0): (α, γ) → (operations increase, walltime speedup)
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha, gamma, operations, speed", TABLE_1)
def test_table_1(alpha: float, gamma: int, operations: float, speed: float) -> None:
    assert round(operations_increase(alpha, gamma, 0.0), 2) == operations
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == speed


def test_table_4_prediction() -> None:
    # EnDe, T5-small draft, temperature 0: α 0.75, c 0.02, γ = 7 → predicted 3.2X
    assert walltime_improvement(0.75, 7, 0.02) == pytest.approx(3.2, abs=0.05)


def test_expected_tokens_limits() -> None:
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 0) == 1.0
    # continuous into α = 1, no cancellation just below it
    assert expected_tokens(1 - 1e-12, 5) == pytest.approx(6.0, rel=1e-9)
    for alpha in (0.1, 0.5, 0.9, 0.999):
        assert expected_tokens(alpha, 7) == pytest.approx(sum(alpha**i for i in range(8)), rel=1e-12)


def test_plain_decoding_is_neutral() -> None:
    assert walltime_improvement(0.3, 0, 0.5) == 1.0
    assert operations_increase(0.3, 0, 0.5) == 1.0


def test_ceiling_is_one_over_one_minus_alpha() -> None:
    assert walltime_improvement(0.8, 200, 0.0) == pytest.approx(1 / (1 - 0.8), rel=1e-9)


def test_optimal_gamma_example() -> None:
    gamma = optimal_gamma(0.8, 0.05)
    assert isinstance(gamma, int) and gamma == 8
    assert walltime_improvement(0.8, gamma, 0.05) == pytest.approx(3.09, abs=0.005)


def test_optimal_gamma_is_the_argmax() -> None:
    for alpha, c in [(0.5, 0.1), (0.7, 0.02), (0.95, 0.01), (0.3, 0.5)]:
        gamma = optimal_gamma(alpha, c, max_gamma=40)
        best = max(walltime_improvement(alpha, g, c) for g in range(1, 41))
        assert walltime_improvement(alpha, gamma, c) == best


def test_optimal_gamma_grows_with_alpha_and_shrinks_with_cost() -> None:
    alphas = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    by_alpha = [optimal_gamma(a, 0.05) for a in alphas]
    assert by_alpha == sorted(by_alpha) and by_alpha[0] < by_alpha[-1]
    costs = [0.001, 0.01, 0.05, 0.1, 0.2, 0.4]
    by_cost = [optimal_gamma(0.8, c) for c in costs]
    assert by_cost == sorted(by_cost, reverse=True) and by_cost[0] > by_cost[-1]


def test_optimal_gamma_edges() -> None:
    assert optimal_gamma(1.0, 0.0, max_gamma=12) == 12  # unbounded speedup: the cap wins
    assert optimal_gamma(0.1, 0.9) == 1  # nothing pays; still an argmax in [1, max_gamma]
    assert optimal_gamma(0.99, 0.0, max_gamma=1) == 1


def test_corollary_3_9() -> None:
    for alpha in (0.1, 0.4, 0.8, 0.95):
        for c in (0.0, 0.05, 0.3, 0.9):
            assert speculation_pays(alpha, c) == (alpha > c)
            s1 = walltime_improvement(alpha, 1, c)
            assert s1 >= (1 + alpha) / (1 + c) - 1e-12
            best = max(walltime_improvement(alpha, g, c) for g in range(1, 65))
            assert (best > 1) == (alpha > c)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: expected_tokens(1.2, 3), "alpha"),
        (lambda: expected_tokens(-0.1, 3), "alpha"),
        (lambda: expected_tokens(float("nan"), 3), "alpha"),
        (lambda: expected_tokens(0.5, -1), "gamma"),
        (lambda: expected_tokens(0.5, 2.5), "gamma"),
        (lambda: walltime_improvement(0.5, 2, -0.1), "cost_ratio"),
        (lambda: walltime_improvement(0.5, 2, float("inf")), "cost_ratio"),
        (lambda: operations_increase(0.5, 2, -1.0), "op_cost_ratio"),
        (lambda: optimal_gamma(0.5, 0.1, max_gamma=0), "max_gamma"),
        (lambda: speculation_pays(0.5, -2), "cost_ratio"),
    ],
)
def test_bad_arguments_name_themselves(call, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()


def test_formulas_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, specdec.analysis as a; a.optimal_gamma(0.8, 0.05); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
