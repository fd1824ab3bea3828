"""Grammar state for a batch of rows along one speculative step: `GrammarRows`.

Per step, for every row b with committed text c and drafts x_1..x_γ (the law this keeps: plain decoding from
the masked target p̃_i ∝ p_i · 1[x allowed after c, x_<i]):

  - the mask at draft position i depends on x_<i, so the row's matcher is advanced along the draft, one token at
    a time: `draft_mask(i, drafted)` while a drafter that takes a logits processor drafts (its q is then masked
    exactly as p will be), and `walk(tokens, lengths)` after the proposal for the positions not yet filled;
  - a draft token the grammar forbids ends the row's draft *after* itself: p̃ gives it probability 0, so it is
    rejected with certainty and the residual norm(max(0, p̃ − q)) is sampled there, exactly as verification
    would do with the longer draft (cutting the draft *before* it would change the law of a sampled q);
    a stop token accepted by the grammar ends the draft after itself too (the commit ends there);
  - positions past a row's draft get an all-allowed mask: verification never reads them;
  - `settle` rolls each matcher back to the accepted drafts and feeds it the token sampled after them.
Masks are xgrammar bitmasks on the host (int32 [..., ⌈V/32⌉], bit j of word w = token 32w + j), unpacked to
boolean tensors on the logits' device.
"""

from __future__ import annotations

import torch

from specdec.constrain.grammar import Grammar

__all__ = ["GrammarRows", "unpack_bitmask", "mask_logits"]

_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 `[..., W]` → allowed `[..., V]` bool (same device)."""
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab_size].bool()


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Forbidden tokens' scores → -inf. `logits [..., V']`, `allowed [..., V]`; ids ≥ V (a drafter's or target's
    padded vocabulary) are forbidden, ids past V' do not exist."""
    width = logits.shape[-1]
    if allowed.shape[-1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]), value=False)
    return logits.masked_fill(~allowed[..., :width].to(logits.device), float("-inf"))


class GrammarRows:
    """One `xgrammar.GrammarMatcher` per row, kept at the row's committed text between steps.

    A step: `begin(γ)`, then (optionally) `draft_mask(i, drafted)` for i = 0..γ−1 while drafting, then
    `walk(tokens, lengths)` → (allowed [B, γ+1, V], lengths [B]), verification, `settle(...)`.
    """

    def __init__(self, grammar: Grammar, batch_size: int):
        if not isinstance(grammar, Grammar):
            raise TypeError(f"grammar must be a specdec.constrain.Grammar, got {type(grammar).__name__}")
        self.grammar = grammar
        self.vocab_size = grammar.vocab_size
        self.matchers = [grammar.matcher() for _ in range(batch_size)]
        self.done = [False] * batch_size  # terminated (stop token accepted) or left the batch's text
        self.begin(0)

    @property
    def batch_size(self) -> int:
        return len(self.matchers)

    def begin(self, num_draft_tokens: int) -> None:
        """A new step with γ = `num_draft_tokens`: every position allowed until filled."""
        batch = self.batch_size
        self.bitmask = torch.full((batch, num_draft_tokens + 1, self.grammar.bitmask_width), -1, dtype=torch.int32)
        self.filled = [0] * batch  # positions whose mask is computed
        self.walked = [0] * batch  # draft tokens fed to the matcher this step
        self.ends: list[int | None] = [None] * batch  # a draft cut after an illegal / stop token

    # --- while drafting -----------------------------------------------------------------------------
    def draft_mask(self, position: int, drafted: torch.Tensor) -> torch.Tensor:
        """The allowed tokens `[B, V]` (bool, host) at draft position `position` (0-based), given the row's drafts
        before it, `drafted [B, position]`."""
        rows = drafted.tolist() if position else [[] for _ in range(self.batch_size)]
        for b in range(self.batch_size):
            self._fill(b, rows[b], position)
        return unpack_bitmask(self.bitmask[:, position], self.vocab_size)

    # --- after the proposal ---------------------------------------------------------------------------
    def walk(self, tokens: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Masks for every position of the step and the drafts' lengths, cut after a forbidden or stop token.

        tokens [B, γ]; lengths [B] or None (= γ) → (allowed [B, γ+1, V] bool on tokens' device, lengths [B] long)
        """
        gamma = tokens.shape[1]
        rows = tokens.tolist()
        limits = [gamma] * self.batch_size if lengths is None else lengths.tolist()
        for b in range(self.batch_size):
            self._fill(b, rows[b], limits[b])
        cut = [limit if end is None else min(end, limit) for end, limit in zip(self.ends, limits)]
        allowed = unpack_bitmask(self.bitmask, self.vocab_size).to(tokens.device)
        return allowed, torch.tensor(cut, dtype=torch.long, device=tokens.device)

    def _fill(self, b: int, row: list[int], position: int) -> None:
        """Compute row b's masks up to `position` (inclusive), feeding its matcher the drafts it needs."""
        matcher = self.matchers[b]
        while not self.done[b] and self.ends[b] is None and self.filled[b] <= position:
            k = self.filled[b]
            if k > self.walked[b]:  # the mask at k needs x_{k-1} (0-based) fed first
                token = row[k - 1]
                if not self._allowed(b, k - 1, token) or not matcher.accept_token(token):
                    self.ends[b] = k  # forbidden: rejected with certainty at k - 1; nothing after it is read
                    return
                self.walked[b] += 1
                if matcher.is_terminated():  # a stop token: the text ends with it
                    self.ends[b] = k
                    return
            matcher.fill_next_token_bitmask(self.bitmask[b], k)
            self.filled[b] += 1

    def _allowed(self, b: int, k: int, token: int) -> bool:
        if not 0 <= token < self.vocab_size:
            return False
        return bool((int(self.bitmask[b, k, token >> 5]) >> (token & 31)) & 1)

    # --- after verification ---------------------------------------------------------------------------
    def settle(self, new_tokens: torch.Tensor, num_accepted: torch.Tensor, counts: torch.Tensor) -> None:
        """Keep each matcher at its row's committed text: roll back the drafts that were not accepted, then feed
        it the tokens committed after them (the residual or bonus token).

        new_tokens [B, γ+1] (accepted drafts, then the sampled token); num_accepted [B]; counts [B] tokens
        committed this step (0 for a finished row; cut at EOS / the budget)."""
        tokens, accepted, committed = new_tokens.tolist(), num_accepted.tolist(), counts.tolist()
        for b, matcher in enumerate(self.matchers):
            if self.done[b]:
                continue
            kept = min(accepted[b], committed[b])
            if kept > self.walked[b]:
                raise RuntimeError(f"grammar state out of step: row {b} accepted {kept} drafts but its grammar "
                                   f"walked {self.walked[b]}")
            if self.walked[b] > kept:
                matcher.rollback(self.walked[b] - kept)
            for token in tokens[b][kept:committed[b]]:
                if not matcher.accept_token(token):
                    raise RuntimeError(f"grammar state out of step: row {b} committed token {token}, which its "
                                       "grammar forbids")
            if matcher.is_terminated():
                self.done[b] = True

    def finish(self, rows) -> None:
        """Rows that stopped (their budget ran out): their masks are no longer computed."""
        for b in rows:
            self.done[b] = True

    def select_rows(self, index: torch.Tensor) -> None:
        keep = index.tolist()
        self.matchers = [self.matchers[i] for i in keep]
        self.done = [self.done[i] for i in keep]
        self.begin(0)
