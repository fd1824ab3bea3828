"""One row's grammar state under speculation: `GrammarState`, a `core.processors.TokenConstraint`.

The runners ask, per step, for the tokens allowed at every drafted position given the committed text c and the
drafts x_1..x_γ — the mask at position i depends on x_<i, so the row's matcher is advanced along the draft —
then `commit` the tokens the step kept. The law this keeps: plain decoding from p̃_i ∝ p_i · 1[allowed after
c, x_<i] (the runner sets forbidden scores to -inf in p and in q before temperature and the filters).

  - A draft token the grammar forbids has p̃ = 0: it is rejected with certainty, so nothing after it is read
    (all-True rows there). The draft is not cut *before* it: the residual norm(max(0, p̃ − q)) at that position
    is what keeps the law exact for a drafter whose q did not see the mask.
  - The matcher holds the walked draft between calls (the model drafter asks again with a prefix one token
    longer at each drafted position, and the verify pass with the whole draft): each mask is computed once.
    `commit` rolls it back to the longest prefix the committed tokens share with the walk and feeds it the rest.
Masks come from xgrammar as int32 bitmasks (bit j of word w = token 32w + j), unpacked to bool rows of width V.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.constrain.grammar import Grammar

__all__ = ["GrammarState", "unpack_bitmask"]

_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 `[..., W]` → allowed `[..., V]` bool (same device)."""
    if bitmask.device.type == "cpu":  # numpy's unpackbits: ~3x faster than the shifts for one row on the host
        import numpy as np

        bits = np.unpackbits(bitmask.contiguous().numpy().view(np.uint8), axis=-1, bitorder="little")
        return torch.from_numpy(bits[..., :vocab_size].view(np.bool_))
    return _unpack_shifts(bitmask, vocab_size)


def _unpack_shifts(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The same on any device, in torch ops."""
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab_size].bool()


class GrammarState:
    """One row's `xgrammar.GrammarMatcher`, at the row's committed text plus the draft walked so far."""

    def __init__(self, grammar: Grammar):
        if not isinstance(grammar, Grammar):
            raise TypeError(f"grammar must be a specdec.constrain.Grammar, got {type(grammar).__name__}")
        self.grammar = grammar
        self.vocab_size = grammar.vocab_size
        self.matcher = grammar.matcher()
        self._bitmask = torch.empty(1, grammar.bitmask_width, dtype=torch.int32)
        self._walk: list[int] = []  # draft tokens fed to the matcher beyond the committed text
        self._masks: list[torch.Tensor] = []  # [V] bool: allowed after the committed text + _walk[:i]
        self.mask_fills = 0  # masks computed (each position once per step): the cost the benchmarks count

    @property
    def terminated(self) -> bool:
        """A stop token was committed: the row's text is complete."""
        return not self._walk and self.matcher.is_terminated()

    def allowed(self, draft: Sequence[int]) -> torch.Tensor:
        """bool `[len(draft) + 1, V]`: row i = the tokens allowed after the committed text + draft[:i]; rows after
        a token the grammar forbids (or after a stop token) are all True (never read)."""
        draft = [int(t) for t in draft]
        self._rewind(_common_prefix(draft, self._walk))
        rows = len(draft) + 1
        if not self._masks:
            if self.matcher.is_terminated():  # a finished row a static batch still steps: never read
                return torch.ones(rows, self.vocab_size, dtype=torch.bool)
            self._fill()
        for token in draft[len(self._walk):]:
            if len(self._masks) <= len(self._walk):  # the walk ended with a stop token: nothing follows
                break
            mask = self._masks[-1]
            if not (0 <= token < self.vocab_size and mask[token]) or not self.matcher.accept_token(token):
                break  # forbidden: rejected with certainty where it stands
            self._walk.append(token)
            if self.matcher.is_terminated():  # a stop token: the text ends with it
                break
            self._fill()
        out = torch.ones(rows, self.vocab_size, dtype=torch.bool)
        known = min(rows, len(self._masks))
        out[:known] = torch.stack(self._masks[:known])
        return out

    def commit(self, tokens: Sequence[int]) -> None:
        """The row committed `tokens` (accepted drafts, then the sampled token; cut at EOS / the budget)."""
        tokens = [int(t) for t in tokens]
        kept = _common_prefix(tokens, self._walk)
        self._rewind(kept)
        for token in tokens[kept:]:
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"grammar state out of step: committed token {token}, which the grammar forbids "
                                   "here (the runner must mask p and q with `allowed`)")
        self._masks = self._masks[kept:kept + 1] if kept == len(tokens) else []
        self._walk = []

    def _rewind(self, keep: int) -> None:
        """Roll the matcher back to the committed text + the first `keep` walked tokens."""
        if keep < len(self._walk):
            self.matcher.rollback(len(self._walk) - keep)
            del self._walk[keep:]
            del self._masks[keep + 1:]

    def _fill(self) -> None:
        self.matcher.fill_next_token_bitmask(self._bitmask)
        self._masks.append(unpack_bitmask(self._bitmask[0], self.vocab_size))
        self.mask_fills += 1


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
