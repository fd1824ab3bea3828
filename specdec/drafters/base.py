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

__all__ = ["Drafter", "Proposal", "LoopDraws", "draw_draft", "checked_proposal", "empty_proposal"]


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
    (`LoopDraws.draft_chain`: `ModelDrafter`, `fast.FastDrafter`): logits `[B, V]` → (token `[B]`, q `[B, V]` — the law it was drawn
    from, None when greedy —, the token's probability `[B]` for a confidence stop — greedy: the softmax's max —,
    None unless `confidence`). noise: Exp(1) `[B, V]` drawn by the caller (outside a captured graph), else
    `generator`; check_nan False inside a graph (no host sync)."""
    if sampling.greedy:
        token = logits.argmax(-1)
        return token, None, logits.float().softmax(-1).max(-1).values if confidence else None
    q = standardize_logits(logits, sampling, check_nan=check_nan)
    token = sample(q, generator, noise=noise)
    return token, q, q.gather(1, token[:, None]).squeeze(1) if confidence else None


class LoopDraws:
    """The loop's side of the one proposal call: `draft_chain(γ, next_logits, forward_passes) -> Proposal`, the same
    call the engine's `StepView` answers, drawn by the loop's one law for the batch (`sampling`, one `generator`).

    A model drafter's rule is written once against it (`drafters.model.ModelDrafter`): the runner's context (the
    engine's view) or these draws (the loop) turn logits into tokens and q. processor: `Drafter.accepts_processor`'s
    callable (logits `[B, V]`, drafted `[B, i]`) → q̃'s logits. confidence_threshold: a row stops after its first
    draft whose probability is below it (per-row `lengths`; `host_stop` ends the chain once every row stopped, a host
    sync). noise: Exp(1) `[B, γ, V]` drawn outside a captured graph (`fast.target`), else `generator` draws.
    """

    def __init__(self, sampling: SamplingConfig, generator: torch.Generator | None, *,
                 confidence_threshold: float | None = None, processor=None, noise: torch.Tensor | None = None,
                 host_stop: bool = True):
        self.sampling, self.generator, self.processor, self.noise = sampling, generator, processor, noise
        self.confidence_threshold, self.host_stop = confidence_threshold, host_stop

    def draft_chain(self, gamma: int, next_logits, forward_passes: int) -> Proposal:
        """γ tokens drawn one after another: next_logits(i, previous token [B] or None) → logits `[B, V]` of token i
        → `Proposal(tokens [B, ≤ γ], q [B, ≤ γ, V] or None when greedy, lengths [B] under a confidence threshold,
        forward_passes: the caller's count for γ tokens, scaled to the tokens drafted when every row stopped early)`."""
        threshold = self.confidence_threshold
        tokens, probs, token, active, lengths = [], [], None, None, None
        for i in range(gamma):
            logits = next_logits(i, token)
            if self.processor is not None:
                drafted = torch.stack(tokens, 1) if tokens else logits.new_zeros(logits.shape[0], 0, dtype=torch.long)
                logits = self.processor(logits, drafted)
            token, q, q_token = draw_draft(logits, self.sampling, generator=self.generator,
                                           noise=None if self.noise is None else self.noise[:, i],
                                           confidence=threshold is not None, check_nan=self.noise is None)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if threshold is not None:  # a row keeps drafting while every earlier draft was confident
                active = torch.ones_like(token, dtype=torch.bool) if active is None else active
                lengths = active.long() if lengths is None else lengths + active.long()
                active = active & (q_token >= threshold)
                if self.host_stop and i + 1 < gamma and not bool(active.any()):
                    break
        passes = forward_passes if len(tokens) == gamma else forward_passes * len(tokens) // gamma
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None, lengths, passes)


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
