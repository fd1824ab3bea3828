"""Chi-square goodness of fit against an exact law (cells with small expectation pooled)."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of `samples` (ints in [0, len(probs))) against the exact law `probs`."""
    n = len(samples)
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    observed = np.bincount(samples, minlength=len(probs)).astype(np.float64)
    expected = probs * n
    if observed[expected == 0].sum() > 0:
        return 0.0  # an impossible outcome happened: the law is wrong
    big = expected >= min_expected
    obs = list(observed[big]) + ([observed[~big].sum()] if (~big).any() else [])
    exp = list(expected[big]) + ([expected[~big].sum()] if (~big).any() else [])
    obs, exp = np.array(obs), np.array(exp)
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep]).pvalue)
