"""The engine's feature drafters: heads drafting from the target's hidden states.

  EngineFeatureDrafter  a head with one decoder layer and its own slot cache: specdec's `FeatureHead`, the
                        published EAGLE-1/2 and EAGLE-3 heads (`fast.eagle.EagleHead`)
  EngineMedusaDrafter   Medusa heads (`fast.medusa.MedusaHeads`): no cache, K drafts from one feature

A head tells the engine which target features to keep: `feature_layers` (None = the final-normed state; EAGLE-3:
the states entering some target layers) and `feature_dim` (their width per position).

The engine keeps the target's features per committed position (`SlotState.features`, written by prefill and
by every verify pass for the committed prefix), so with a row's length L, features are known at positions
[0, L − 1). The head's own slot cache holds one entry per position t: (f_t, token_{t+1}).

A proposal re-feeds the last `window` entries with true features, positions [L − 1 − window, L − 2]
(window = the engine's largest γ + 1, so it covers everything the previous step committed: the entries
the previous drafts wrote from predicted features are overwritten, and rejected drafts need no rollback),
then drafts γ tokens: (f_{L−2}, x_{L−1}) → f̂_{L−1} → x̂_L, then (f̂_{L−1}, x̂_L) → f̂_L → x̂_{L+1}, ...
each drawn with `StepView.draw` at its absolute position (counter-based randomness, as the model drafter),
so q is exactly the law each token was drawn from and `core.verify` keeps the output law the target's.
The head's protocol: `inputs(features, tokens)` (entries from target features), `step(hidden, tokens, cache)`
(one step on its own output), `logits(hidden)` (over the target's vocabulary), `layer` (a `FastLlama`).
"""

from __future__ import annotations

import torch

from specdec.drafters.protocol import Proposal
from specdec.engine.drafters import StepView
from specdec.engine.slots import SlotCache, SlotState, prefill_ragged, prefill_rows

__all__ = ["EngineFeatureDrafter", "EngineMedusaDrafter"]


class EngineFeatureDrafter:
    """A bound head (`FeatureHead`, `EagleHead`) with its own slot cache; the engine keeps the target's features."""

    needs_features = True

    def __init__(self, head, state: SlotState, max_batch: int, num_positions: int, max_draft_tokens: int):
        self.head = head
        self.model = head.layer  # the engine builds its RoPE tables before any capture
        self.state = state
        self.cache = SlotCache(head.layer, max_batch, num_positions)
        self.vocab_size = head.config.vocab_size
        self.window = max_draft_tokens + 1
        self.feature_layers, self.feature_dim = head.feature_layers, head.feature_dim

    def _entries(self, rows: slice, first: int, width: int) -> torch.Tensor:
        """fc inputs of head entries at positions [first, first + width): (f_t, token_{t+1}) → `[b, width, dim]`."""
        tokens = self.state.tokens[rows]
        capacity = tokens.shape[1]
        cols = (first + 1 + torch.arange(width, device=tokens.device)).clamp(max=capacity - 1)
        at = (first + torch.arange(width, device=tokens.device))[None, :].expand(tokens.shape[0], -1)
        return self.head.inputs(self.state.feature_store.read(rows, at), tokens[:, cols])

    def prefill(self, state: SlotState, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed head entries at positions [starts[i], ends[i]) (their features must be known: ends ≤ L − 1).

        A row that feeds anything also re-feeds the `window` entries before starts[i]: the engine counts a step's
        accepted drafts as fed, which holds for token drafters, but this head fed them with predicted features
        (only the next proposal's window would overwrite them, and plain steps may come first).
        extent, graphs: as `prefill_rows` (extent: no row holds an entry at or past it that must survive, None =
        unknown; graphs: a `PrefillGraphs` replaying chunk shapes seen before, None = eager)."""
        starts = [max(s - self.window, 0) if e > s else s for s, e in zip(starts, ends)]
        prefill_rows(self.head.layer, self.cache, state, rows, starts, ends, chunk, embeds=self._entries, extent=extent,
                     graphs=graphs)

    def prefill_ragged(self, state: SlotState, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                       extent: int | None = None) -> None:
        """`prefill` with each row's columns from its own start (`slots.prefill_ragged`: rows at different offsets,
        a catch-up's, share a forward without computing the columns between them)."""
        starts = [max(s - self.window, 0) if e > s else s for s, e in zip(starts, ends)]
        prefill_ragged(self.head.layer, self.cache, state, rows, starts, ends, chunk, embeds=self._entries_at,
                       extent=extent)

    def _entries_at(self, rows: slice, cols: torch.Tensor) -> torch.Tensor:
        """`_entries` at per-row positions `cols [b, width]` (each < capacity − 1 where it matters)."""
        tokens = self.state.tokens[rows]
        features = self.state.feature_store.read(rows, cols)
        return self.head.inputs(features, tokens.gather(1, (cols + 1).clamp(max=tokens.shape[1] - 1)))

    def propose(self, context: StepView, num_draft_tokens: int) -> Proposal:
        head, batch, w = self.head, context.batch, self.window
        cache = self.cache.view(slice(0, batch), context.num_positions)
        lengths = context.lengths
        pos = lengths[:, None] - 1 - w + torch.arange(w, device=lengths.device)[None, :]  # [b, w]: L−1−w .. L−2
        # A one-token text has no feature yet: its last entry becomes (0, x_0), alone in the window, so its
        # first draft reads only what the row holds (never a previous request's cache slots).
        start = pos == -1
        valid = (pos >= 0) | (start & (lengths[:, None] == 1))
        at = pos.clamp_min(0)
        features = self.state.feature_store.read(slice(0, batch), at)
        features = features * (pos >= 0)[..., None]
        next_tokens = context.tokens.gather(1, (pos + 1).clamp_min(0)) * valid
        cache.lengths.copy_((lengths - 1 - w).clamp_min(0))
        hidden = head(features, next_tokens, cache, valid, last_only=True)  # f̂_{L−1}: [b, 1, dim]

        def next_logits(i, prev):  # each draft step runs the head on its own previous feature and token
            nonlocal hidden
            if i > 0:
                hidden = head.step(hidden, prev[:, None], cache)
            return head.logits(hidden)[:, 0]

        return context.draft_chain(num_draft_tokens, next_logits, num_draft_tokens)


class EngineMedusaDrafter:
    """`MedusaHeads` on the target's last known feature f_{L−2}: head k drafts x_{L+k} (see `fast.medusa`).
    γ above the number of heads K drafts K tokens (per-row draft lengths), the rest of the step samples from p."""

    needs_features = True
    feature_layers = None

    def __init__(self, heads, state: SlotState):
        self.heads, self.state = heads, state
        self.vocab_size = heads.config.vocab_size
        self.feature_dim = heads.config.dim
        self.num_heads = heads.config.num_heads

    def propose(self, context: StepView, num_draft_tokens: int) -> Proposal:
        gamma, batch, lengths = num_draft_tokens, context.batch, context.lengths
        at = (lengths - 2).clamp_min(0)[:, None]
        # a one-token text has no feature yet: its heads read zeros (a valid, if poor, q)
        feature = self.state.feature_store.read(slice(0, batch), at)[:, 0] * (lengths >= 2)[:, None]
        logits = self.heads(feature)  # [b, K, V]
        drafted = min(gamma, self.num_heads)
        chain = context.draft_chain(drafted, lambda i, prev: logits[:, i], 1)  # one pass of the heads
        if drafted == gamma:
            return chain
        tokens, probs = chain.tokens, chain.probs
        pad = gamma - drafted  # never read: the rows' draft lengths stop at K
        tokens = torch.cat([tokens, tokens.new_zeros(batch, pad)], 1)
        if probs is not None:
            probs = torch.cat([probs, probs.new_zeros(batch, pad, probs.shape[-1])], 1)
        return Proposal(tokens, probs, torch.full_like(lengths, drafted), 1)
