"""The per-request logits-processor hook the runners call (the math is `core.processors`).

`BatchProcessors` holds one request's processors over the rows of a batch: the parameters, the committed
text's `TokenHistory` (on the device) and, where the request has a `constraint`, one host `TokenConstraint`
per row. A step calls `target` on the verify pass's logits `[B, γ+1, V]`, the drafter calls `draft` at each
drafted position, and `commit` moves the state to the committed text (a rejected draft was never committed:
that is the rollback). The transformers loop uses it as it is; the engine keeps the history per slot on the
device (`engine.slots.SlotState`) and uses `start_constraints` / `commit_constraints` for the host part.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.processors import (
    ProcessorRows,
    TokenConstraint,
    TokenHistory,
    advance,
    constraint_masks,
    history_of,
    process_draft,
    text_bans,
)
from specdec.request import SamplingParams

__all__ = ["BatchProcessors", "start_constraints", "commit_constraints"]


def start_constraints(params: SamplingParams, batch: int, vocab: int) -> list[TokenConstraint | None] | None:
    """One `TokenConstraint` per row (None when the request has no constraint)."""
    if params.constraint is None:
        return None
    states = [params.constraint.start(vocab) for _ in range(batch)]
    for state in states:
        if not isinstance(state, TokenConstraint):
            raise TypeError(f"constraint.start must return a TokenConstraint (allowed, commit), got "
                            f"{type(state).__name__}")
    return states


def commit_constraints(constraints: Sequence[TokenConstraint | None], tokens: Sequence[Sequence[int]]) -> None:
    """Each row's constraint advances by the tokens it committed this step."""
    for constraint, committed in zip(constraints, tokens):
        if constraint is not None and committed:
            constraint.commit(list(committed))


class BatchProcessors:
    """One request's processors over `rows` (each row's committed text so far) — see the module doc."""

    def __init__(self, params: SamplingParams, rows: Sequence[Sequence[int]], vocab: int, device: torch.device):
        params.check_vocabulary(vocab)
        self.vocab, self.device = vocab, device
        self.rows = ProcessorRows.uniform(
            len(rows), vocab, device, repetition=params.repetition_penalty, frequency=params.frequency_penalty,
            presence=params.presence_penalty, min_tokens=params.min_tokens, stop_ids=params.eos_token_ids,
            logit_bias=params.logit_bias, allowed=params.allowed_token_ids, ngram=params.no_repeat_ngram_size,
            bad_words=params.bad_words_ids)
        self.ngram_sizes = (params.no_repeat_ngram_size,) if params.no_repeat_ngram_size else ()
        self.context = None  # the committed text (a `TokenBuffer`), read by no_repeat_ngram_size
        self.history: TokenHistory = history_of(rows, vocab, device)
        self.constraints = start_constraints(params, len(rows), vocab)

    @classmethod
    def of(cls, params: SamplingParams, rows, vocab: int, device) -> "BatchProcessors | None":
        """The request's processors, or None when it turns none on (plain rows pay nothing)."""
        return cls(params, rows, vocab, device) if params.processors else None

    def target(self, logits: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Processed verify logits `[B, γ+1, V]` from the raw ones and the draft `[B, γ]`."""
        allowed = None
        if self.constraints is not None:
            allowed = constraint_masks(self.constraints, draft, logits.shape[-1], logits.device)
        return process_draft(logits, draft, self.rows, self.history, allowed, self._bans(draft, logits.shape[-1]))

    def _bans(self, draft: torch.Tensor, vocab: int) -> torch.Tensor | None:
        if not self.ngram_sizes and self.rows.words is None:
            return None
        if self.context is None:
            raise RuntimeError("BatchProcessors.context must be set for no_repeat_ngram_size / bad_words_ids")
        return text_bans(self.rows, self.ngram_sizes, self.context.tokens, self.context.lengths, draft, vocab)

    def draft(self, logits: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
        """Processed drafter logits `[B, V]` at the position after the drafts `drafted [B, i]` (q̃)."""
        vocab = self.vocab
        if logits.shape[-1] != vocab:  # a drafter over another width (cross vocab): leave it raw
            return logits
        allowed = None
        if self.constraints is not None:
            allowed = constraint_masks(self.constraints, drafted, vocab, logits.device)[:, -1:]
        history = advance(self.history, drafted) if drafted.shape[1] else self.history
        banned = self._bans(drafted, vocab)
        return process_draft(logits[:, None], drafted[:, :0], self.rows, history, allowed,
                             None if banned is None else banned[:, -1:])[:, 0]

    def commit(self, new_tokens: torch.Tensor, counts: torch.Tensor, committed: Sequence[Sequence[int]]) -> None:
        """The step committed the first `counts[b]` of `new_tokens [B, k]` (`committed`: the same on the host,
        per row; read only when a constraint needs it)."""
        self.history = advance(self.history, new_tokens, counts)
        if self.constraints is not None:
            commit_constraints(self.constraints, committed)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows `index` (finished rows leave the batch)."""
        self.rows = self.rows.select(index)
        self.history = self.history.select(index)
        if self.constraints is not None:
            keep = index.tolist()
            self.constraints = [self.constraints[i] for i in keep]
