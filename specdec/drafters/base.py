"""The drafter protocol: propose γ tokens AND the distribution q they were sampled from.

A drafter that always proposes the same tokens for the same context is deterministic: its q is
one-hot (`Proposal.probs is None`), and verification then accepts x with probability p(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core import SamplingConfig
from specdec.sequences import TokenBuffer


@dataclass(frozen=True)
class Proposal:
    """Drafts for one step.

    tokens   [B, γ]      long
    probs    [B, γ, V]   the q each token was sampled from; None = deterministic (one-hot q)
    lengths  [B]         drafts actually proposed per row (≤ γ); None = all γ
    forward_passes       drafter model calls this proposal took (0 for table/lookup drafters)
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    forward_passes: int = 0


class Drafter:
    """Base class. Subclasses implement `propose`; stateful ones also `begin`, `commit`, `select_rows`."""

    #: vocabulary size the drafter proposes over (None = takes the target's)
    vocab_size: int | None = None
    #: True when proposals do not depend on the random generator (q is one-hot)
    deterministic: bool = False

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        """A new batch starts with `context` (prompts or decoder start tokens)."""

    def propose(
        self,
        context: TokenBuffer,
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        confidence_threshold: float | None = None,
    ) -> Proposal:
        raise NotImplementedError

    def commit(self, context: TokenBuffer) -> None:
        """Verification appended tokens to `context`; drop any state built on rejected drafts."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` (finished rows leave the batch)."""


def empty_proposal(batch_size: int, device: torch.device) -> Proposal:
    return Proposal(tokens=torch.zeros(batch_size, 0, dtype=torch.long, device=device))
