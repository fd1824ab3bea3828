"""Chi-square goodness of fit against an exact law, the statistics behind `specdec.check` and the test suite.

Cells whose expected count is below `min_expected` (5, the textbook rule) are pooled into one "other" cell per
group (which takes in the smallest cells until it reaches `min_expected` too), so the chi-square approximation
holds; a sample in a cell the law gives probability 0 is an impossible
outcome and rejects the law outright (p-value 0). Groups are independent multinomials with fixed totals (one
per prompt in `specdec.check`): the statistic is summed over groups and has Σ_g (cells_g − 1) degrees of
freedom. The survival function is the regularized upper incomplete gamma function, so only torch is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ChiSquare", "chi_square", "chi2_pvalue", "chi2_survival", "MIN_EXPECTED"]

#: the smallest expected count a cell keeps on its own (the usual validity rule of the chi-square approximation)
MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    """One goodness-of-fit test: Σ (observed − expected)² / expected over the pooled cells.

    statistic   the chi-square statistic (inf when an impossible outcome occurred)
    dof         degrees of freedom, Σ over groups of (cells − 1)
    p_value     P(χ²_dof ≥ statistic) under the law; 0.0 when an impossible outcome occurred
    cells       cells after pooling (over all groups)
    samples     observations tested
    impossible  observations in cells the law gives probability 0
    """

    statistic: float
    dof: int
    p_value: float
    cells: int
    samples: int
    impossible: int

    def rejects(self, level: float) -> bool:
        return self.p_value < level


def chi2_survival(statistic: float, dof: int) -> float:
    """P(χ²_dof ≥ statistic), accurate far into the tail (no 1 − cdf cancellation)."""
    if dof <= 0:
        return 1.0
    if math.isinf(statistic):
        return 0.0
    if statistic <= 0:
        return 1.0
    value = torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                    torch.tensor(statistic / 2.0, dtype=torch.float64))
    return float(value)


def chi_square(observed, expected, groups=None, min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Test counts against expected counts.

    observed  [C] counts per cell
    expected  [C] expected counts under the law (per group they sum to the group's number of samples)
    groups    [C] group id per cell (None = one group); pooling and degrees of freedom are per group
    """
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected, dtype=np.float64).ravel()
    if observed.shape != expected.shape:
        raise ValueError(f"observed {observed.shape} and expected {expected.shape} must have the same shape")
    if not (np.isfinite(expected).all() and (expected >= 0).all() and (observed >= 0).all()):
        raise ValueError("expected counts must be finite and >= 0, observed counts >= 0")
    groups = np.zeros(observed.shape, dtype=np.int64) if groups is None else np.asarray(groups).ravel()
    if groups.shape != observed.shape:
        raise ValueError(f"groups {groups.shape} must have the shape of observed {observed.shape}")
    samples = int(observed.sum())
    impossible = int(observed[expected == 0].sum())
    statistic, dof, cells = 0.0, 0, 0
    for group in np.unique(groups):
        member = (groups == group) & (expected > 0)  # zero-expectation cells hold no sample (checked above)
        obs, exp = observed[member], expected[member]
        obs, exp = _pool(obs, exp, min_expected)
        statistic += float(((obs - exp) ** 2 / exp).sum())
        dof += len(exp) - 1
        cells += len(exp)
    if impossible:
        return ChiSquare(math.inf, dof, 0.0, cells, samples, impossible)
    return ChiSquare(statistic, dof, chi2_survival(statistic, dof), cells, samples, 0)


def _pool(obs: np.ndarray, exp: np.ndarray, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    """Cells below `min_expected` pooled into one; while that pool is still below it, it absorbs the smallest
    other cell (a pool of expectation 0.05 holding one sample would otherwise add ~20 to the statistic)."""
    big = exp >= min_expected
    if not (~big).any():
        return obs, exp
    order = np.argsort(exp[big], kind="stable")
    obs_big, exp_big = obs[big][order], exp[big][order]
    pool_obs, pool_exp = obs[~big].sum(), exp[~big].sum()
    taken = 0
    while pool_exp < min_expected and taken < len(exp_big):
        pool_obs, pool_exp = pool_obs + obs_big[taken], pool_exp + exp_big[taken]
        taken += 1
    return np.append(obs_big[taken:], pool_obs), np.append(exp_big[taken:], pool_exp)


def chi2_pvalue(samples, probs, min_expected: float = MIN_EXPECTED) -> float:
    """p-value of `samples` (ints in [0, len(probs))) against the exact law `probs` (renormalized)."""
    samples = np.asarray(samples, dtype=np.int64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if len(samples) and (samples.min() < 0 or samples.max() >= len(probs)):
        raise ValueError(f"samples must lie in [0, {len(probs)})")
    observed = np.bincount(samples, minlength=len(probs)).astype(np.float64)
    return chi_square(observed, probs / probs.sum() * len(samples), min_expected=min_expected).p_value
