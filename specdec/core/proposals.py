"""A drafter's proposal, checked where it enters a runner (`proposal_check`, on the device, no host sync).

The output law is exact only if q is the distribution the drafts were sampled from; nothing can check that in
one step, but a q that is not a distribution at all, or a drafted token outside the vocabulary, is a drafter
bug that would silently change the output (a q of 0.5/V everywhere made 6 of 8 tokens the drafted one). So
each row's proposal must have, at every drafted position (before the row's `lengths`, active rows only):

  ids      in [0, V) — vLLM's -1 padding ends a row's draft (`base.checked_proposal`); any other id outside
           the vocabulary is refused (vLLM raises too)
  q        finite, ≥ 0, Σ_x q(x) = 1 within `SUM_TOLERANCE` (fp16 / bf16: `SUM_TOLERANCE_HALF`), q(x_i) > 0

`proposal_check` is two reductions over `[B, γ, V]` (a sum and a min), a gather and a few small ops, no host
synchronization: its `[2]` result (first bad row + 1, its `VIOLATIONS` bits) rides in the step's one device → host table
(`step.pack_step(..., proposal=)`), and `StepRecord.unpack` raises `InvalidProposal` naming the drafter
(`StepLayout.drafter`) and the caller's row. The argument itself (`draft=`, `drafter=`) is checked at the
call by `drafters.protocol.check_drafter_argument`.
"""

from __future__ import annotations

import torch

__all__ = ["VIOLATIONS", "SUM_TOLERANCE", "SUM_TOLERANCE_HALF", "InvalidProposal", "proposal_check",
           "describe_violation"]

#: bit → what a row's proposal got wrong (the order a message lists them in)
VIOLATIONS = {
    1: "a drafted id outside the vocabulary [0, V)",
    2: "q has a NaN or infinite entry",
    4: "q has a negative entry",
    8: "q does not sum to 1 over the vocabulary",
    16: "q gives its own drafted token probability 0",
}
SUM_TOLERANCE = 1e-3  # |Σ q − 1| for fp32 / fp64 q (a softmax over 150k entries is off by ~1e-6)
SUM_TOLERANCE_HALF = 1e-2  # fp16 / bf16 q: each entry rounded to 2^-8 relative


class InvalidProposal(ValueError):
    """A drafter's proposal is not a proposal (see the module doc): names the drafter, the row and the fault."""


def proposal_check(tokens: torch.Tensor, probs: torch.Tensor | None, lengths: torch.Tensor | None, vocab_size: int,
                   active: torch.Tensor | None = None, *, parents: torch.Tensor | None = None) -> torch.Tensor:
    """`[2]` int64 on the device: (1 + the first row whose proposal is invalid, or 0; the `VIOLATIONS` bits of that
    row's worst drafted position).

    tokens [B, γ] long, the drafted ids as the drafter returned them (a -1 already ended its row: `lengths`);
    probs [B, M, V] (q; M = γ for a chain) or None (one-hot); lengths [B] drafts per row (None = γ); active [B]
    bool (None = every row); parents [γ] long: the q row each drafted position was drawn from (token trees: the
    node's parent; None = position i from row i). No host synchronization.
    """
    batch, gamma = tokens.shape
    device = tokens.device
    # few launches (inside the engine's verify graph each costs its kernel): a fault code per drafted position,
    # the bits of VIOLATIONS, from two reductions over V (a NaN or inf entry makes the sum non-finite) and a gather
    in_vocab = (tokens >= 0) & (tokens < vocab_size)
    code = (~in_vocab).long()
    if probs is not None:
        q = probs
        total = q.sum(-1, dtype=torch.float32)  # [B, M]
        tolerance = SUM_TOLERANCE_HALF if q.dtype in (torch.float16, torch.bfloat16) else SUM_TOLERANCE
        row_code = torch.where(torch.isfinite(total), ((total - 1).abs() > tolerance).long() * 8, 2) \
            + (q.amin(-1) < 0).long() * 4
        rows = torch.arange(gamma, device=device) if parents is None else parents.to(device)
        safe = torch.where(in_vocab, tokens, 0)
        at_token = q.reshape(batch, -1).gather(1, rows[None, :] * q.shape[-1] + safe)  # q(x_i) [B, γ]
        code = code + (row_code if parents is None else row_code[:, rows]) + (in_vocab & ~(at_token > 0)).long() * 16
    drafted = torch.arange(gamma, device=device)[None, :] < lengths[:, None] if lengths is not None else None
    if active is not None:
        drafted = active[:, None] if drafted is None else drafted & active[:, None]
    if drafted is not None:
        code = code * drafted
    worst = code.amax(1) if gamma else code.new_zeros(batch)  # [B]: the bits of the row's worst position
    first = (worst > 0).long().argmax().reshape(1)  # the first row at fault (0 when none: its code is then 0)
    bits = worst.gather(0, first)  # (a gather, not worst[first]: indexing by a tensor would sync the host)
    return torch.cat([(first + 1) * (bits > 0), bits])


def describe_violation(drafter: str, row: int, bits: int) -> str:
    """The one-line message of `InvalidProposal` for step row `row` (the caller's row, where the runner knows it)."""
    faults = "; ".join(text for bit, text in VIOLATIONS.items() if bits & bit) or f"violation bits {bits}"
    return (f"drafter {drafter} returned an invalid proposal for row {row}: {faults} (a proposal's q must be the "
            "distribution its drafts were sampled from: finite, >= 0, summing to 1, positive at each drafted token)")
