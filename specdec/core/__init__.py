"""The algorithm as pure tensor functions: no models, no caches, no global state.

Terms (Leviathan, Kalman & Matias 2023; letters as in the paper):
  p         target distribution (`target_probs`), the law the output must follow exactly
  q         drafter distribution (`draft_probs`), the law the draft tokens were sampled from
  γ         `num_draft_tokens`, drafts verified per step
  β         Σ_x min(p(x), q(x)) at one prefix: the probability that a draft from q is accepted
  residual  norm(max(0, p − q)): where a rejected position samples its replacement
  bonus     the token sampled from p after all γ drafts were accepted

Randomness always comes in as an explicit `torch.Generator` (or explicit uniforms in tests).

`sampling.py`: the laws (`SamplingConfig`, the `FILTERS` table, `standardize_logits` / `standardize_rows`,
`sample`); `verify.py`: Algorithm 1 (`verify`, `verify_greedy`, `acceptance_beta`) and `verify_coupled` (the
bitwise mode's shared-race rule). Import from `specdec.core`;
`tree.py` (token trees: `TreeSpec`, `draw_children`, `verify_tree`, `verify_tree_greedy`) from `specdec.core.tree`.
"""

from specdec.core.sampling import (
    FILTERS,
    INVALID_SCORES,
    TEMPERATURE_FLOOR,
    Filter,
    SamplingConfig,
    invalid_scores,
    sample,
    standardize_logits,
    standardize_rows,
)
from specdec.core.verify import VerifyResult, acceptance_beta, check_leniency, verify, verify_coupled, verify_greedy

__all__ = [
    "SamplingConfig",
    "Filter",
    "FILTERS",
    "VerifyResult",
    "TEMPERATURE_FLOOR",
    "INVALID_SCORES",
    "invalid_scores",
    "standardize_logits",
    "standardize_rows",
    "sample",
    "verify",
    "verify_greedy",
    "verify_coupled",
    "acceptance_beta",
    "check_leniency",
]
