"""`HierarchicalDrafter` on the engine, where its inner drafter holds no model (prompt lookup, n-gram tables, a
plugin written against the engine's protocol): the middle model drafts from a slot cache of its own, as the engine's
model drafter does, and is itself decoded speculatively by the inner drafter.

    specdec.generate(target, prompts, drafter=HierarchicalDrafter(draft, PromptLookupDrafter()))  # the engine

`EngineHierarchy` is a `drafters.protocol.CachedSlotDrafter`: its middle model is bound to the engine like a model
drafter's (`engine.build`: a `SlotModel` over the engine's body of the model, prefilled at admission, caught up after
plain steps, moved with its row), so nothing is re-begun per step (the loop adapter, `drafters.loop_adapter`, would
prefill each row's whole text every step). A proposal of γ tokens, all rows greedy:

    re-feed the last `WINDOW` committed tokens (as the model drafter does), then in rounds until every row holds γ:
      the inner drafter proposes k tokens over the text so far (committed + this proposal's drafts)   [b, k]
      one middle pass over (the unfed token, the k drafts) → its logits at k + 1 positions              [b, k+1, V]
      `core.verify_greedy`: the accepted drafts and the middle's own next token join the text (≤ what a row needs)
      the middle's cache keeps what is now text (its length moves back to the text's − 1: the next round re-feeds
      the last token, overwriting what rejected drafts wrote)

so each row's drafts are the middle model's greedy tokens (the loop's `HierarchicalDrafter` rule, its one-hot q), in
fewer middle passes when the inner drafts are accepted. A step with a sampled row drafts the middle model's chain
directly (`drafters.model.chain_proposal`: each row's own law and counter-based seed, q reported): the law of the
hierarchy's drafts IS the middle model's autoregressive law (the inner speculation is exact), only its cost differs.
After a proposal the middle's cache holds every row's committed tokens but the last 2 (the engine's invariant for a
cached drafter: positions below the text's − 1 hold the text's own entries). Writes a round makes past the step's
junk slot (inner drafts beyond what any row needs) land in it and are never read by a kept token.

Host reads every round (how many rows still need tokens, the counters): eager steps only, as a loop drafter
(`engine.build` refuses it under CUDA graphs; `specdec.generate` turns them off for it). No token trees, no
speculative beams (they need the plain model drafter). `HierarchicalDrafter.counters` counts its middle and inner
work here as on the loop.
"""

from __future__ import annotations

import copy

import torch

from specdec.core import verify_greedy
from specdec.drafters.hierarchical import HierarchicalDrafter
from specdec.drafters.model import chain_proposal
from specdec.drafters.protocol import Proposal
from specdec.engine.drafters import SlotModel, StepView, refeed_window

__all__ = ["EngineHierarchy", "runs_on_engine"]


def runs_on_engine(drafter) -> bool:
    """A `HierarchicalDrafter` (the class itself: a subclass may change its rule) whose inner drafter holds no model
    and takes the engine's call (prompt lookup, n-gram tables, a slot plugin): `EngineHierarchy` runs it on the
    engine. (An inner drafter holding a model — a model drafter, another hierarchy — keeps the loop, or the loop
    adapter under engine="fast".)"""
    from specdec.drafters.loop_adapter import holds_model
    from specdec.drafters.protocol import is_slot_drafter

    return type(drafter) is HierarchicalDrafter and is_slot_drafter(drafter.inner) and \
        not holds_model(drafter.inner)


class EngineHierarchy:
    """A `HierarchicalDrafter` (`runs_on_engine`) over the engine's slot state of its middle model (see the module doc).

    drafter   the HierarchicalDrafter (its inner drafter, k = `num_inner_draft_tokens`, its counters)
    state     the middle model's `SlotModel` (`engine.build` binds it, as a model drafter's)
    """

    capturable = False  # (host reads every round: `engine.build` refuses it under CUDA graphs)

    def __init__(self, drafter: HierarchicalDrafter, state: SlotModel):
        if not runs_on_engine(drafter):
            raise TypeError(f"EngineHierarchy runs a HierarchicalDrafter whose inner drafter holds no model, got "
                            f"{type(drafter).__name__}")
        self.drafter, self.state = drafter, state
        self.inner, self.k = drafter.inner, drafter.num_inner_draft_tokens
        self.vocab_size = state.vocab_size

    # -- the engine's capabilities (`drafters.protocol.CachedSlotDrafter`): the middle model's slot cache
    @property
    def model(self):
        return self.state.model

    @property
    def cache(self):
        return self.state.cache

    @cache.setter
    def cache(self, value) -> None:  # (the engine swaps in the paged pool's cache)
        self.state.cache = value

    def prefill(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Feed committed positions [starts[i], ends[i]) of the slots in `rows` (`SlotModel.prefill`)."""
        self.state.prefill(state, rows, starts, ends, chunk, extent=extent, graphs=graphs)

    def prefill_ragged(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                       extent: int | None = None) -> None:
        """`prefill` with each row's columns from its own start (`SlotModel.prefill_ragged`)."""
        self.state.prefill_ragged(state, rows, starts, ends, chunk, extent=extent)

    # -- the proposal
    @torch.inference_mode()
    def propose(self, context: StepView, num_draft_tokens: int) -> Proposal:
        """`context`: the engine's `StepView` (tokens `[b, P]`, lengths `[b]`) → `Proposal(tokens [b, γ],
        q [b, γ, V] or None when every row is greedy, lengths None: every row drafts γ, forward_passes: middle
        passes)`."""
        if not context.flavor.all_greedy:  # the middle model's own chain: its law, each row's draws
            self.drafter.counters.middle_calls += num_draft_tokens
            return chain_proposal(self.state, context, context, num_draft_tokens)
        return self._greedy(context, num_draft_tokens)

    def _greedy(self, context: StepView, gamma: int) -> Proposal:
        model, k, counters = self.state.model, self.k, self.drafter.counters
        b, start = context.batch, context.lengths
        cache = self.state.cache.view(slice(0, b), context.num_positions)
        feed, fed = refeed_window(context, cache)  # [b, WINDOW]: the middle's cache rolled back before them
        text = _scratch(context, gamma + k + 1)  # committed text + this proposal's drafts (the inner drafter's view)
        cols = torch.arange(k + 1, device=start.device)[None, :]
        passes = 0
        while True:
            need = gamma - (text.lengths - start)  # [b] tokens each row still needs
            busy = need > 0
            if not bool(busy.any()):
                break
            inner = self.inner.propose(text, k)
            drafts = inner.tokens[:, :k]
            width = drafts.shape[1]
            lengths = None if inner.lengths is None else inner.lengths.clamp(max=width)
            tokens = torch.cat([feed, drafts], 1)
            valid = torch.cat([fed, torch.ones_like(drafts, dtype=torch.bool)], 1)
            logits = model(tokens, cache, valid)[:, -(width + 1):]  # [b, k+1, V] at the drafts' positions, the bonus
            passes += 1
            result = verify_greedy(drafts, logits, draft_lengths=lengths, check_nan=False)
            counts = torch.minimum(result.num_accepted + 1, need.clamp_min(0))  # [b] tokens joining the text
            emitted = result.tokens(drafts)  # [b, k+1]
            slots = (text.lengths[:, None] + cols[:, : width + 1]).clamp(max=text.tokens.shape[1] - 1)
            keep = cols[:, : width + 1] < counts[:, None]
            text.tokens.scatter_(1, slots, torch.where(keep, emitted, text.tokens.gather(1, slots)))
            text.lengths += counts
            cache.lengths.copy_((text.lengths - 1).clamp_min(0))  # (what rejected drafts wrote is re-fed over)
            feed = text.tokens.gather(1, (text.lengths - 1).clamp_min(0)[:, None])
            fed = torch.ones_like(feed, dtype=torch.bool)
            drafted = lengths if lengths is not None else torch.full_like(need, width)
            counters.inner_calls += inner.forward_passes
            counters.inner_drafted += int((drafted * busy).sum())
            counters.inner_accepted += int((result.num_accepted * busy).sum())
            counters.middle_tokens += int(counts[busy].sum())
            counters.middle_row_steps += int(busy.sum())
        counters.middle_calls += passes
        tokens = text.tokens.gather(1, start[:, None] + torch.arange(gamma, device=start.device)[None, :])
        return Proposal(tokens=tokens, probs=None, lengths=None, forward_passes=passes)

    def __repr__(self) -> str:
        return f"EngineHierarchy({type(self.inner).__name__}, k={self.k})"


def _scratch(context: StepView, extra: int) -> StepView:
    """The view with a private copy of its rows' text (`extra` more columns) for the inner drafter to read and this
    proposal to extend; no processors or constraints (the inner drafts are raw; verification keeps the law)."""
    text = copy.copy(context)
    text.tokens = torch.cat([context.tokens, context.tokens.new_zeros(context.batch, extra)], 1)
    text.lengths = context.lengths.clone()
    text.processors = text.history = text.constraints = None
    return text
