"""Prompt lookup: copy what followed the most recent earlier occurrence of the text's last n-gram.

Deterministic (q is one-hot). Rows with no match propose nothing that step (plain decoding for them).
One implementation for both runners: `propose` reads only the context's `tokens` / `lengths` (and an
encoder-decoder row's `source`), which the loop's `TokenBuffer` and the engine's `StepView` both carry, and
draws nothing, so the loop's sampling arguments are optional (the engine calls `propose(context, γ)`).
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Drafter, Proposal
from specdec.sequences import TokenBuffer


class PromptLookupDrafter(Drafter):
    deterministic = True

    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1):
        if not 1 <= min_ngram_size <= max_ngram_size:
            raise ValueError(
                f"need 1 <= min_ngram_size <= max_ngram_size, got {min_ngram_size} and {max_ngram_size}"
            )
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size

    def _haystack(self, context: TokenBuffer) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens to search `[B, L]` and their lengths; encoder-decoder rows search source + output."""
        if context.source is None:
            return context.tokens, context.lengths
        rows = [src + context.row(b)[int(context.start_lengths[b]):] for b, src in enumerate(context.source)]
        width = max(len(r) for r in rows)
        hay = torch.zeros(len(rows), width, dtype=torch.long)
        for b, r in enumerate(rows):
            hay[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        return hay.to(context.tokens.device), torch.tensor([len(r) for r in rows], device=context.tokens.device)

    @torch.inference_mode()
    def propose(self, context, num_draft_tokens, sampling=None, generator=None, confidence_threshold=None) -> Proposal:
        """Copied tokens `[B, γ]` (one-hot q) and per-row lengths `[B]` (0 where nothing matched); sampling,
        generator, confidence_threshold: unused (the loop passes them, the engine does not)."""
        hay, lengths = self._haystack(context)
        batch, width = hay.shape
        device = hay.device
        gamma = num_draft_tokens
        start = torch.full((batch,), -1, dtype=torch.long, device=device)  # where the continuation starts
        for n in range(self.max_ngram_size, self.min_ngram_size - 1, -1):
            if width <= n:
                continue
            suffix_idx = (lengths[:, None] - n + torch.arange(n, device=device)[None, :]).clamp_min(0)
            suffix = hay.gather(1, suffix_idx)  # [B, n]
            windows = hay.unfold(1, n, 1)  # [B, width - n + 1, n]
            pos = torch.arange(windows.shape[1], device=device)[None, :]
            # A match must end before the last token so that at least one continuation token exists.
            match = (windows == suffix[:, None, :]).all(-1) & (pos + n < lengths[:, None]) & (lengths[:, None] > n)
            latest = torch.where(match, pos, torch.full_like(pos, -1)).max(1).values
            found = (latest >= 0) & (start < 0)
            start = torch.where(found, latest + n, start)
        has = start >= 0
        take = torch.where(has, (lengths - start).clamp(max=gamma), torch.zeros_like(start))
        idx = (start.clamp_min(0)[:, None] + torch.arange(gamma, device=device)[None, :]).clamp(max=width - 1)
        tokens = hay.gather(1, idx) if gamma else hay[:, :0]
        tokens = tokens * (torch.arange(gamma, device=device)[None, :] < take[:, None])
        return Proposal(tokens=tokens, probs=None, lengths=take)
