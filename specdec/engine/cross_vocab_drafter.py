"""A draft model with another tokenizer on the engine (token-level intersection; see `drafters.cross_vocab`).

The engine's model drafter reads the committed target tokens at their own positions, so here every target token
reaches the draft as exactly ONE draft token (`VocabBridge.single_spelling`: its shared id, else the first token
of the draft's spelling of its string): the draft's text has the target's positions and the slot cache, the
re-fed window and CUDA graphs work as for `EngineModelDrafter`. The drafts are drawn from the draft's law
restricted to the shared tokens and placed at the target's ids (`StepView.draw` at their absolute positions), so q
is the law they were drawn from and verification keeps the target's law. (The transformers loop's
`CrossVocabDrafter` spells unshared tokens in full; the law does not depend on the spelling, only α.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.drafters.cross_vocab import VocabBridge
from specdec.drafters.protocol import Proposal
from specdec.engine.drafters import StepView, refeed_window
from specdec.engine.slots import SlotCache, SlotState, prefill_rows
from specdec.fast.model import FastLlama

__all__ = ["EngineCrossVocabDrafter"]


class EngineCrossVocabDrafter:
    """A `FastLlama` over its own vocabulary drafting target tokens through a `VocabBridge`."""

    def __init__(self, model: FastLlama, bridge: VocabBridge, state: SlotState, max_batch: int, num_positions: int):
        if model.shape.vocab_size < bridge.draft_vocab_size:
            raise ValueError(f"the draft model has {model.shape.vocab_size} logits; its tokenizer has "
                             f"{bridge.draft_vocab_size} ids")
        device = model.device
        self.model, self.state = model, state
        self.cache = SlotCache(model, max_batch, num_positions)
        self.vocab_size = bridge.target_vocab_size
        self.spelling = bridge.single_spelling().to(device)  # [V_t] → one draft id each
        self.target_ids, self.draft_ids = bridge.target_ids.to(device), bridge.draft_ids.to(device)

    def _embed(self, target_tokens: torch.Tensor) -> torch.Tensor:
        """The draft's input vectors for target tokens `[b, k]` → `[b, k, dim]` (its own embedding scale applied)."""
        x = F.embedding(self.spelling[target_tokens], self.model.embed)
        scale = self.model.shape.arch.embed_scale
        return x if scale is None else x * torch.tensor(scale, dtype=x.dtype)

    def _entries(self, rows: slice, first: int, width: int) -> torch.Tensor:
        tokens = self.state.tokens[rows]
        cols = (first + torch.arange(width, device=tokens.device)).clamp(max=tokens.shape[1] - 1)
        return self._embed(tokens[:, cols])

    def _target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """`[b, V_d]` → `[b, V_t]`: the shared tokens' logits at their target ids, -inf elsewhere."""
        out = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.target_ids, draft_logits.index_select(1, self.draft_ids))

    def prefill(self, state: SlotState, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the slots in `rows`, spelled in the draft's tokens."""
        prefill_rows(self.model, self.cache, state, rows, starts, ends, chunk, embeds=self._entries, extent=extent,
                     graphs=graphs)

    def propose(self, context: StepView, num_draft_tokens: int) -> Proposal:
        cache = self.cache.view(slice(0, context.batch), context.num_positions)
        window, valid = refeed_window(context, cache)
        first = self.model(None, cache, valid, embeds=self._embed(window), last_only=True)[:, 0]

        def next_logits(i, prev):
            logits = first if i == 0 else self.model(None, cache, embeds=self._embed(prev[:, None]),
                                                      last_only=True)[:, 0]
            return self._target_logits(logits)

        return context.draft_chain(num_draft_tokens, next_logits, num_draft_tokens)
