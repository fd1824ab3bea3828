"""A smaller causal LM as drafter, with its own KV cache kept in lockstep with the committed text."""

from __future__ import annotations

import torch

from specdec.core import SamplingConfig
from specdec.drafters.base import Drafter, Proposal, draw_draft
from specdec.models.hf import HFCausalLM
from specdec.sequences import TokenBuffer


class ModelDrafter(Drafter):
    """Drafts autoregressively with a `transformers` causal LM (same vocabulary as the target).

    Its cache holds committed tokens plus the drafts of the current step; `commit` crops it back to
    the committed prefix, so the next `propose` feeds only the tokens it has not seen (1 or 2).
    """

    def __init__(self, model: torch.nn.Module):
        self.lm = HFCausalLM(model)
        self.vocab_size = self.lm.vocab_size
        self.accepts_processor = True

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        self._claim(context)
        self.lm.reset(context.batch_size)

    @torch.inference_mode()
    def propose(
        self,
        context: TokenBuffer,
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        confidence_threshold: float | None = None,
        processor=None,
    ) -> Proposal:
        """processor: see `Drafter.accepts_processor` (None = none)."""
        self._check_owner(context)
        unseen = context.lengths - self.lm.lengths  # ≥ 1: at least the last committed token
        block, valid = context.tail(int(unseen.max()), unseen)
        logits = self.lm.forward(block, valid)[:, -1]
        tokens, probs = [], []
        active = torch.ones_like(context.lengths, dtype=torch.bool)
        lengths = torch.zeros_like(context.lengths)
        for i in range(num_draft_tokens):
            if i > 0:
                logits = self.lm.forward(tokens[-1][:, None])[:, -1]
            if processor is not None:
                drafted = torch.stack(tokens, 1) if tokens else context.lengths.new_zeros(context.batch_size, 0)
                logits = processor(logits, drafted)
            token, q, q_token = draw_draft(logits, sampling, generator=generator,
                                           confidence=confidence_threshold is not None)
            if q is not None:
                probs.append(q)
            tokens.append(token)
            lengths += active.long()
            if confidence_threshold is not None:
                # Stop a row once its drafter is unsure of the token it just drafted.
                active &= q_token >= confidence_threshold
                if not bool(active.any()):
                    break
        return Proposal(
            tokens=torch.stack(tokens, 1),
            probs=torch.stack(probs, 1) if probs else None,
            lengths=lengths if confidence_threshold is not None else None,
            forward_passes=len(tokens),
        )

    def commit(self, context: TokenBuffer) -> None:
        # Keep what is still committed text: the old prefix and the accepted drafts (never the last token,
        # which the next step feeds).
        self._check_owner(context)
        self.lm.crop(torch.minimum(self.lm.lengths, context.lengths - 1))

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)
