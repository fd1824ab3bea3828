"""Unigram / bigram tables fitted on token sequences: the paper's cheapest drafters (c ≈ 0).

q is a real distribution over the whole vocabulary, so sampling stays exact:
  unigram   q(x)        = (count(x) + smoothing) / Σ
  bigram    q(x | prev) = count(prev, x)/count(prev) over the `top_k_successors` most frequent
            successors of prev, plus the remaining mass spread as the unigram law (prev unseen: unigram).

One implementation for both runners: the table rule (`_distribution`) is the drafter; only the draw is the
runner's, through the one call `draft_chain`: the loop calls `propose(context, γ, sampling, generator)` — one law and
one generator for the batch, `base.LoopDraws` —; the engine calls `propose(context, γ)` with its `StepView`, whose
`draft_chain` draws each row with its own law and counter-based seed (`drafters.protocol`: why the engine's law
lives on its context).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from specdec.core import SamplingConfig
from specdec.drafters.base import Drafter, LoopDraws, Proposal
from specdec.sequences import TokenBuffer


class NGramDrafter(Drafter):
    """`NGramDrafter(order=1 or 2).fit(sequences, vocab_size)`, or `NGramDrafter.fit_new(...)`."""

    def __init__(self, order: int = 2, *, smoothing: float = 0.01, top_k_successors: int = 64):
        if order not in (1, 2):
            raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order!r}")
        if smoothing <= 0:
            raise ValueError(f"smoothing must be > 0 so that q covers every token, got {smoothing!r}")
        self.order = order
        self.smoothing = smoothing
        self.top_k_successors = top_k_successors
        self.vocab_size = None
        self.unigram: torch.Tensor | None = None  # [V]
        self.successors: torch.Tensor | None = None  # [V, K] long
        self.successor_probs: torch.Tensor | None = None  # [V, K]
        self._device_tables: tuple | None = None  # the three tables on the device last drafted on
        self._greedy: torch.Tensor | None = None  # [V] argmax of q(· | prev), on that device

    @classmethod
    def fit_new(cls, sequences: Iterable[Sequence[int]], vocab_size: int, order: int = 2, **kwargs) -> "NGramDrafter":
        return cls(order, **kwargs).fit(sequences, vocab_size)

    def fit(self, sequences: Iterable[Sequence[int]], vocab_size: int) -> "NGramDrafter":
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        counts = torch.zeros(vocab_size, dtype=torch.float64)
        pair_keys = []
        total = 0
        for seq in sequences:
            ids = torch.as_tensor(list(seq), dtype=torch.long)
            if ids.numel() == 0:
                continue
            if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
                raise ValueError(f"token ids must be in [0, {vocab_size}); got one outside in the fitting data")
            counts += torch.bincount(ids, minlength=vocab_size).double()
            total += ids.numel()
            if self.order == 2 and ids.numel() > 1:
                pair_keys.append(ids[:-1] * vocab_size + ids[1:])
        if total == 0:
            raise ValueError("NGramDrafter.fit got no tokens: the fitting sequences are empty")
        self.vocab_size = vocab_size
        self._device_tables = self._greedy = None
        unigram = counts + self.smoothing
        self.unigram = (unigram / unigram.sum()).float()
        if self.order == 2:
            keys = torch.cat(pair_keys) if pair_keys else torch.zeros(0, dtype=torch.long)
            uniq, pair_counts = torch.unique(keys, return_counts=True)
            prev, nxt = uniq // vocab_size, uniq % vocab_size
            k = self.top_k_successors
            # Per prev token, keep its k most frequent successors: sort by (prev, -count).
            order = torch.argsort(prev * (pair_counts.max() + 1) - pair_counts, stable=True) if uniq.numel() else uniq
            prev, nxt, pair_counts = prev[order], nxt[order], pair_counts[order].double()
            prev_totals = torch.zeros(vocab_size, dtype=torch.float64).index_add_(0, prev, pair_counts)
            first = torch.searchsorted(prev, prev)  # start index of each prev group
            rank = torch.arange(prev.numel()) - first
            keep = rank < k
            self.successors = torch.zeros(vocab_size, k, dtype=torch.long)
            self.successor_probs = torch.zeros(vocab_size, k, dtype=torch.float32)
            self.successors[prev[keep], rank[keep]] = nxt[keep]
            self.successor_probs[prev[keep], rank[keep]] = (pair_counts[keep] / prev_totals[prev[keep]]).float()
        return self

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(unigram, successors, successor_probs) on `device`, copied there once (a copy per draft token cost
        ~0.8 ms on a GPU: the bigram drafter ran at 0.2-0.6x of plain decoding)."""
        if self.unigram is None:
            raise ValueError("NGramDrafter is not fitted: call .fit(sequences, vocab_size) first")
        if self._device_tables is None or self._device_tables[0].device != device:
            self._device_tables = tuple(None if t is None else t.to(device)
                                        for t in (self.unigram, self.successors, self.successor_probs))
        return self._device_tables

    def _greedy_next(self, device: torch.device) -> torch.Tensor:
        """`[V]`: argmax_x q(x | prev) for every prev, computed once per device (greedy drafting is then one
        gather per draft token instead of building a `[B, V]` row)."""
        if self._greedy is None or self._greedy.device != device:
            prev = torch.arange(self.vocab_size, device=device)
            self._greedy = torch.cat([self._distribution(chunk).argmax(-1) for chunk in prev.split(1024)])
        return self._greedy

    def _distribution(self, prev: torch.Tensor) -> torch.Tensor:
        """q(· | prev) for `prev [B]` → `[B, V]` (unigram when order == 1)."""
        unigram, successors, successor_probs = self._tables(prev.device)
        if self.order == 1:
            return unigram.expand(prev.shape[0], -1)
        succ = successors[prev]
        succ_p = successor_probs[prev]
        leftover = (1.0 - succ_p.sum(-1, keepdim=True)).clamp_min(0)
        return (leftover * unigram[None, :]).scatter_add(1, succ, succ_p)

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        if self.unigram is None:
            raise ValueError("NGramDrafter is not fitted: call .fit(sequences, vocab_size) first")

    @torch.inference_mode()
    def propose(self, context, num_draft_tokens, sampling: SamplingConfig | None = None, generator=None,
                confidence_threshold=None) -> Proposal:
        """Drafts `[B, γ]` from q(· | previous token) and that q `[B, γ, V]` (None when greedy). sampling None: the
        engine's call — the rows' laws and seeds are on `context` (`StepView.draft_chain`)."""
        prev = context.tokens.gather(1, (context.lengths - 1)[:, None]).squeeze(1)
        if sampling is not None and sampling.greedy:  # the loop's greedy drafts: one gather per token
            tokens, greedy_next = [], self._greedy_next(prev.device)
            for _ in range(num_draft_tokens):
                prev = greedy_next[prev]
                tokens.append(prev)
            return Proposal(tokens=torch.stack(tokens, 1), probs=None)
        self._tables(prev.device)  # (fitted? and the tables on the device before any capture)
        draws = context if sampling is None else LoopDraws(sampling, generator)  # the engine's view, or the loop's law
        return draws.draft_chain(num_draft_tokens, lambda i, previous: self._distribution(
            prev if previous is None else previous).clamp_min(1e-30).log(), 0)
