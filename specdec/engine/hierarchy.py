"""`HierarchicalDrafter` on the engine: the middle model drafts from a slot cache of its own, as the engine's model
drafter does, and is itself decoded speculatively by the inner drafter — one holding no model (prompt lookup, n-gram
tables, a plugin written against the engine's protocol) or one holding a model (a `ModelDrafter` under the middle
model, another hierarchy), each model on its own slot cache.

    specdec.generate(target, prompts, drafter=HierarchicalDrafter(draft, PromptLookupDrafter()))  # the engine
    specdec.generate(target, prompts, drafter=HierarchicalDrafter(draft, smaller_draft))          # the engine too

`EngineHierarchy` is a `drafters.protocol.CachedSlotDrafter`: every model is bound to the engine like a model
drafter's (`engine.build`: a `SlotModel` over the engine's body of the model, prefilled at admission, caught up after
plain steps, moved with its row; several models' states and caches as one, `engine.slot_group`), so nothing is
re-begun per step (the loop adapter, `drafters.loop_adapter`, would prefill each row's whole text every step). A
proposal of γ tokens, all rows greedy:

    re-feed the last `WINDOW` committed tokens (as the model drafter does), then in rounds until every row holds γ:
      the inner drafter proposes k tokens over the text so far (committed + this proposal's drafts)   [b, k]
      one middle pass over (the unfed token, the k drafts) → its logits at k + 1 positions              [b, k+1, V]
      `core.verify_greedy`: the accepted drafts and the middle's own next token join the text (≤ what a row needs)
      the middle's cache keeps what is now text (its length moves back to the text's − 1: the next round re-feeds
      the last token, overwriting what rejected drafts wrote)
    an inner drafter holding models is fed the proposal's text (`sync`: its last γ + `WINDOW` tokens, one pass)

so each row's drafts are the middle model's greedy tokens (the loop's `HierarchicalDrafter` rule, its one-hot q), in
fewer middle passes when the inner drafts are accepted. A step with a sampled row drafts the middle model's chain
directly (`drafters.model.chain_proposal`: each row's own law and counter-based seed, q reported), then syncs the
models under it: the law of the hierarchy's drafts IS the middle model's autoregressive law (the inner speculation
is exact), only its cost differs.

The engine's invariant for a cached drafter — after a proposal, positions below each row's committed length − 1
hold the committed text's entries (every row's but its last 2 once the step commits) — holds for every model: within
a step each model writes only from the committed length − `WINDOW` on (every text it is fed extends the committed
one), a round's inner re-feed rolls back at most `WINDOW` ≥ 2 past what the last round wrote of accepted text, and
the closing `sync` rewrites [committed − `WINDOW`, committed + γ) from the proposal's text, which the step's
committed tokens follow up to their last. Writes a round makes past the step's junk slot (inner drafts beyond what
any row needs) land in it and are never read by a kept token.

Host reads every round (how many rows still need tokens, the counters): eager steps only, as a loop drafter
(`engine.build` refuses it under CUDA graphs; `specdec.generate` turns them off for it). No token trees, no
speculative beams (they need the plain model drafter). `HierarchicalDrafter.counters` counts its middle and inner
work here as on the loop (a `sync` counts as one inner call).
"""

from __future__ import annotations

import copy

import torch

from specdec.core import verify_greedy
from specdec.drafters.hierarchical import HierarchicalDrafter
from specdec.drafters.model import ModelDrafter, StateHeld, chain_proposal
from specdec.drafters.protocol import Proposal
from specdec.engine.drafters import WINDOW, SlotModel, StepView, refeed_window
from specdec.engine.slot_group import SlotGroup

__all__ = ["EngineHierarchy", "runs_on_engine"]


def runs_on_engine(drafter) -> bool:
    """A `HierarchicalDrafter` (the class itself: a subclass may change its rule) whose inner drafter the engine
    binds: one holding no model that takes the engine's call (prompt lookup, n-gram tables, a slot plugin), a
    `ModelDrafter` (the class itself: a draft model under the middle one, on a slot cache of its own), or another
    such hierarchy. `EngineHierarchy` runs it on the engine."""
    from specdec.drafters.loop_adapter import holds_model
    from specdec.drafters.protocol import is_slot_drafter, takes_engine_call

    if type(drafter) is not HierarchicalDrafter:
        return False
    inner = drafter.inner
    return is_slot_drafter(inner) and not holds_model(inner) or \
        type(inner) is ModelDrafter and takes_engine_call(inner) or runs_on_engine(inner)


def _slot_states(inner) -> list[SlotModel]:
    """The slot states of the models a bound inner drafter holds (none for a table or a rule)."""
    if isinstance(inner, EngineHierarchy):
        return inner.states
    if isinstance(inner, ModelDrafter) and inner.on_engine:
        return [inner.state]
    return []


class EngineHierarchy(StateHeld):
    """A `HierarchicalDrafter` (`runs_on_engine`) over the engine's slot state of its models (see the module doc).

    drafter   the HierarchicalDrafter (k = `num_inner_draft_tokens`, its counters)
    middle    the middle model's `SlotModel` (`engine.build` binds it, as a model drafter's)
    inner     the inner drafter bound to the engine (`engine.build`: a model drafter over a `SlotModel`, another
              `EngineHierarchy`); None = `drafter.inner` as it is (one holding no model)
    `state` is the middle's `SlotModel`, or with models under it a `slot_group.SlotGroup` of every model's
    """

    capturable = False  # (host reads every round: `engine.build` refuses it under CUDA graphs)

    def __init__(self, drafter: HierarchicalDrafter, middle: SlotModel, inner=None):
        if not runs_on_engine(drafter):
            raise TypeError(f"EngineHierarchy runs a HierarchicalDrafter whose inner drafter the engine binds (a "
                            f"table, a rule, a model drafter, another such hierarchy), got {type(drafter).__name__}")
        from specdec.drafters.loop_adapter import holds_model

        self.inner = drafter.inner if inner is None else inner
        nested = _slot_states(self.inner)
        if holds_model(self.inner) and not nested:
            raise TypeError(f"EngineHierarchy: bind the inner {type(self.inner).__name__} to the engine first "
                            "(`engine.build`: its model on a slot cache of its own)")
        self.drafter, self.middle, self.k = drafter, middle, drafter.num_inner_draft_tokens
        self.states = [middle, *nested]  # every model's slot state, the middle model's first
        self.state = SlotGroup(self.states) if nested else middle
        self.vocab_size = middle.vocab_size

    # -- the proposal
    @torch.inference_mode()
    def propose(self, context: StepView, num_draft_tokens: int) -> Proposal:
        """`context`: the engine's `StepView` (tokens `[b, P]`, lengths `[b]`) → `Proposal(tokens [b, γ],
        q [b, γ, V] or None when every row is greedy, lengths None: every row drafts γ, forward_passes: middle
        passes)`."""
        if not context.flavor.all_greedy:  # the middle model's own chain: its law, each row's draws
            self.drafter.counters.middle_calls += num_draft_tokens
            proposal = chain_proposal(self.middle, context, context, num_draft_tokens)
            if len(self.states) > 1:  # the models under it follow the text these drafts extend
                text = _scratch(context, num_draft_tokens)
                text.tokens.scatter_(1, context.lengths[:, None] + torch.arange(num_draft_tokens,
                                     device=context.lengths.device)[None, :], proposal.tokens)
                text.lengths += num_draft_tokens
                self._follow(self.inner, text, num_draft_tokens)
            return proposal
        return self._greedy(context, num_draft_tokens)

    def sync(self, text: StepView, gamma: int) -> None:
        """Every model here fed the last γ + `WINDOW` tokens of `text` (a proposal's γ drafts after the committed
        text): its cache then holds the whole of `text` (`_follow`)."""
        self.middle.feed(text, gamma + WINDOW)
        self._follow(self.inner, text, gamma)

    def _follow(self, inner, text: StepView, gamma: int) -> None:
        """A bound inner drafter holding models brought to `text` (see the module doc: the engine's invariant)."""
        if isinstance(inner, EngineHierarchy):
            inner.sync(text, gamma)
        elif isinstance(inner, ModelDrafter) and inner.on_engine:
            inner.state.feed(text, gamma + WINDOW)
        else:
            return
        self.drafter.counters.inner_calls += 1

    def _greedy(self, context: StepView, gamma: int) -> Proposal:
        model, k, counters = self.middle.model, self.k, self.drafter.counters
        b, start = context.batch, context.lengths
        cache = self.middle.cache.view(slice(0, b), context.num_positions)
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
        self._follow(self.inner, text, gamma)  # (every row's text: its γ drafts after the committed tokens)
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
