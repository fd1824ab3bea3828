"""Proving exactness on the user's own pair: `specdec.check` and the statistics behind it.

    import specdec
    result = specdec.check(target, draft_model, prompts, temperature=0.8, top_p=0.95, engine="fast")
    result.status, result.worst_p_value, result.power   # "pass" | "fail" | "underpowered"

Terms: p is the target's standardized law (temperature → top-k → top-p), q the drafter's. A *position* is the
j-th generated token; its law is tested jointly with the prefix before it (`laws`). A *negative control* is a
deliberately wrong law the same trials must reject, showing the test could have caught a bug on this pair.
Modules: `stats` (chi-square, pooled cells; also used by the test suite), `laws` (the exact law as cells, from
plain forward passes), `certify` (`check`: prompts, trials through the runner, tests, the greedy comparison),
`result` (the records it returns),
`limits` (bounds and defaults, importable without torch). Names below are imported on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "check": "specdec.exactness.certify",
    "CheckResult": "specdec.exactness.result",
    "CheckTimings": "specdec.exactness.result",
    "GreedyDifference": "specdec.exactness.result",
    "GreedyResult": "specdec.exactness.result",
    "PositionResult": "specdec.exactness.result",
    "ChiSquare": "specdec.exactness.stats",
    "chi_square": "specdec.exactness.stats",
    "chi2_pvalue": "specdec.exactness.stats",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec.exactness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
