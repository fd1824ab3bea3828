"""The loop drafters' base class (`protocol.LoopDrafter`): propose γ tokens AND the distribution q they were
sampled from, as a `protocol.Proposal` (the record both runners receive); the checks the loop runs on it.

A drafter that always proposes the same tokens for the same context is deterministic: its q is
one-hot (`Proposal.probs is None`), and verification then accepts x with probability p(x).
"""

from __future__ import annotations

import weakref

import torch

from specdec.core import SamplingConfig, sample, standardize_logits
from specdec.core.proposals import proposal_check
from specdec.drafters.protocol import Proposal
from specdec.sequences import TokenBuffer

__all__ = ["Drafter", "Proposal", "draw_draft", "checked_proposal", "empty_proposal"]


class Drafter:
    """Base class. Subclasses implement `propose`; stateful ones also `begin`, `commit`, `select_rows`."""

    #: vocabulary size the drafter proposes over (None = takes the target's)
    vocab_size: int | None = None
    #: True when proposals do not depend on the random generator (q is one-hot)
    deterministic: bool = False
    #: True when `propose` takes `processor=`: a callable (logits [B, V], drafted [B, i]) → processed logits
    #: [B, V] for draft position i + 1, applied before the drafter's sampling law, so q is the processed q̃
    #: (`core.processors`). A drafter without it drafts from its raw q, which keeps the law exact (q is what
    #: the tokens were drawn from) at a lower acceptance.
    accepts_processor: bool = False

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

    # Stateful drafters (a KV cache in lockstep with one batch) serve one generation at a time: `begin`
    # claims the drafter for that generation's context, and `propose`/`commit` refuse any other context
    # with a clear error (two interleaved streams sharing one drafter would otherwise corrupt its cache).

    def _claim(self, context: TokenBuffer) -> None:
        self._owner = weakref.ref(context)

    def _check_owner(self, context: TokenBuffer) -> None:
        owner = getattr(self, "_owner", None)
        if owner is None or owner() is not context:
            raise ValueError(
                f"drafter: this {type(self).__name__} was taken over by another generate/stream call (its cache "
                "follows one batch at a time); give each concurrent call its own drafter"
            )


def draw_draft(logits: torch.Tensor, sampling: SamplingConfig, *, generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None, confidence: bool = False, check_nan: bool = True):
    """One draft token per row under the loop's one law, the step every model drafter of the loop takes
    (`ModelDrafter`, `fast.target.FastDrafter`): logits `[B, V]` → (token `[B]`, q `[B, V]` — the law it was drawn
    from, None when greedy —, the token's probability `[B]` for a confidence stop — greedy: the softmax's max —,
    None unless `confidence`). noise: Exp(1) `[B, V]` drawn by the caller (outside a captured graph), else
    `generator`; check_nan False inside a graph (no host sync)."""
    if sampling.greedy:
        token = logits.argmax(-1)
        return token, None, logits.float().softmax(-1).max(-1).values if confidence else None
    q = standardize_logits(logits, sampling, check_nan=check_nan)
    token = sample(q, generator, noise=noise)
    return token, q, q.gather(1, token[:, None]).squeeze(1) if confidence else None


def checked_proposal(proposal: Proposal, batch_size: int, num_draft_tokens: int, vocab_size: int,
                     active: torch.Tensor | None = None) -> tuple[Proposal, torch.Tensor]:
    """A drafter's proposal, checked (shapes, with errors naming the drafter) and made safe to feed the target,
    and its `core.proposals.proposal_check` `[2]` (ids, q; rows of `active` [B] only), still on the device.

    A row's draft ends at its `lengths` (if given) or at its first -1 (vLLM's padding), whichever comes first;
    slots past the end become 0 (never read by `verify`, but fed to the target, whose embedding must not see -1).
    Any other id outside [0, V) before the end is a fault the check reports (the step raises when its record is
    read); it is fed as 0 meanwhile. Stopping a draft early keeps the output law exact. No host sync.
    """
    if not isinstance(proposal, Proposal) or not isinstance(proposal.tokens, torch.Tensor):
        raise TypeError(f"drafter.propose must return a Proposal with a tokens tensor, got {type(proposal).__name__}")
    tokens, probs, lengths = proposal.tokens, proposal.probs, proposal.lengths
    if tokens.dim() != 2 or tokens.shape[0] != batch_size or tokens.shape[1] > num_draft_tokens \
            or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"drafter returned tokens {tuple(tokens.shape)} {tokens.dtype}; expected integer ids "
                         f"[B={batch_size}, <= {num_draft_tokens}]")
    gamma = tokens.shape[1]
    if probs is not None and (not isinstance(probs, torch.Tensor) or tuple(probs.shape) != (batch_size, gamma, vocab_size)
                              or not probs.dtype.is_floating_point):
        shape = f"{tuple(probs.shape)} {probs.dtype}" if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise ValueError(f"drafter returned probs {shape}; expected None or floating [B, γ, V] = "
                         f"[{batch_size}, {gamma}, {vocab_size}]")
    if lengths is not None and (not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (batch_size,)):
        shape = tuple(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ValueError(f"drafter returned lengths {shape}; expected None or [B] = [{batch_size}]")
    leading = (tokens != -1).long().cumprod(1).sum(1)  # [B] ids before the first -1
    lengths = leading if lengths is None else torch.minimum(lengths.long().clamp(0, gamma), leading)
    check = proposal_check(tokens, probs, lengths, vocab_size, active)
    keep = (torch.arange(gamma, device=tokens.device)[None, :] < lengths[:, None]) & (tokens >= 0) & (tokens < vocab_size)
    tokens = torch.where(keep, tokens, torch.zeros_like(tokens)).long()
    return Proposal(tokens=tokens, probs=probs, lengths=lengths, forward_passes=proposal.forward_passes), check


def empty_proposal(batch_size: int, device: torch.device) -> Proposal:
    return Proposal(tokens=torch.zeros(batch_size, 0, dtype=torch.long, device=device))
