"""Which runner a `specdec.generate` / `stream` call takes: the request-level engine on every device by default
(`engine="auto"`), draft-length policies included (a name or a `DraftLengthPolicy` object: asked and told every step
on the engine as on the loop, `engine.policy_loop`) and loop-only drafters that hold no model (a duck-typed loop
drafter whose `propose` needs the loop's sampling arguments: called through `drafters.loop_adapter.LoopOnEngine`),
and a `HierarchicalDrafter` over a table, a rule, a draft model or another such hierarchy (`engine.hierarchy`: each
of its models on a slot cache of its own), and the eager chain loop only for what the engine does not take well or at
all — another loop drafter holding a model (a duck-typed one, a hierarchy subclass: the adapter re-begins its state
over each row's whole text every step, exact but a prefill per step, while the loop's state follows its static batch;
`engine="fast"` takes it to the adapter), or a model neither engine body runs (the engine's build refuses it with `UnsupportedModel`: no fast family body covers it and
the transformers backend refuses it — encoder-decoders (T5, BART), state outside K/V (Jamba, Mamba), attention
outside transformers' attention interface with no adapter in `fast.hf_adapters` (CPM-Ant); Falcon, Bloom,
MPT, GPT-Neo, XGLM, GPT-NeoX-Japanese and gpt-oss run on the backend). The refusal is logged once and kept on the
model, so later calls go straight to the loop (`runner_for` reports the runner taken); a refused model takes its
policy and drafter to the loop. `specdec.beam_search` routes the same way (`beams_or_none`): the engine's beam
groups on either body, the loop's `search.beam` where the engine refuses (the build's refusals, and targets with
sliding-window layers). Token trees (`draft_tree`) take the engine for a draft model or a `TreeModelDrafter`
over one (`engine_tree_drafter`: the engine drafts from its model) and the loop's trees only where the engine refuses
the pair, or for another tree drafter (a `TreeModelDrafter` subclass, one written against `TreeLoopDrafter`).
"""

from __future__ import annotations

import os
import weakref

import torch

__all__ = ["use_engine", "engine_or_none", "beams_or_none", "runner_for", "engine_needed", "is_feature_head",
           "engine_tree_drafter"]


#: model → {id(drafter): (the drafter, weakly; why the engine refused the pair)}: later calls go straight to the
#: loop, and `runner_for` says so
_REFUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: the same for beam search: what the engine refused beam groups for (the build's refusals, and targets with
#: sliding-window layers, which the engine's tree passes do not run)
_BEAMS_REFUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def engine_or_none(engine, target, prompts, drafter, params, num_draft_tokens, generator, attention_mask):
    """The engine's stream, or None where engine="auto" and the engine refuses the model or drafter
    (`UnsupportedModel`: neither a fast family body nor the transformers backend runs it; one log line, and the
    refusal is kept on the model so the next call does not build again)."""
    from specdec.engine.config import UnsupportedModel
    from specdec.engine.generate import engine_stream

    if engine == "auto" and _refused(target, drafter) and not engine_needed(drafter):
        return None
    try:
        return engine_stream(target, prompts, drafter, params, num_draft_tokens, generator=generator,
                             attention_mask=attention_mask)
    except UnsupportedModel as err:
        if engine != "auto" or engine_needed(drafter):
            raise
        from specdec.engine.build import notice_fallback

        notice_fallback(str(err))
        owner = _owner(target)
        if _weak(owner):
            _REFUSED.setdefault(owner, {})[id(drafter)] = (_ref(drafter), str(err))
        return None


def beams_or_none(engine, target, prompts, drafter, options):
    """`specdec.beam_search` on the engine's beam groups (`engine.beam_run`: a fast family body or the transformers
    backend), or None where engine="auto" and the engine refuses (`UnsupportedModel`: a model the build refuses, a
    target with sliding-window layers; one log line, kept on the model so the next call goes straight to the loop).
    engine="fast" raises the refusal."""
    from specdec.engine.beam_run import engine_beam_search
    from specdec.engine.config import UnsupportedModel

    if engine == "auto" and (_refused(target, drafter, _BEAMS_REFUSED) or _refused(target, drafter)):
        return None
    try:
        return engine_beam_search(target, prompts, drafter, **options)
    except UnsupportedModel as err:
        if engine != "auto":
            raise
        from specdec.engine.build import notice_fallback

        notice_fallback(str(err))
        owner = _owner(target)
        if _weak(owner):
            _BEAMS_REFUSED.setdefault(owner, {})[id(drafter)] = (_ref(drafter), str(err))
        return None


def _owner(target):
    return target if isinstance(target, torch.nn.Module) else getattr(target, "model", target)


def _weak(owner) -> bool:
    try:
        weakref.ref(owner)
    except TypeError:
        return False
    return True


def _ref(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # None and other objects without weak references
        return lambda: obj


def _refused(target, drafter, table=_REFUSED) -> bool:
    """Whether the engine refused this (target, drafter) before (`table`: `_REFUSED` or `_BEAMS_REFUSED`; the same
    drafter object, not its id)."""
    owner = _owner(target)
    entry = table.get(owner, {}).get(id(drafter)) if _weak(owner) else None
    return entry is not None and entry[0]() is drafter


def runner_for(engine: str, target, drafter, num_draft_tokens) -> str:
    """The runner `stream_request` took (or takes) for this call: "fast" (the engine) or "hf" (the chain loop) —
    `specdec.check` reports it."""
    if not use_engine(engine, target, drafter, num_draft_tokens):
        return "hf"
    return "hf" if engine == "auto" and _refused(target, drafter) and not engine_needed(drafter) else "fast"


def use_engine(engine, target, drafter, num_draft_tokens) -> bool:
    """Whether this call goes to the engine (see `generate`'s `engine` argument): "hf" never; "fast", a feature head
    and a drafter only the engine calls always; "auto" on every device, whatever `num_draft_tokens` is (an int,
    "auto", a policy name or a `DraftLengthPolicy`), unless the drafter is one the engine does not call as it is
    and is not worth the adapter (`_engine_drafts`: a loop drafter holding a model that the engine does not bind, a
    hierarchy subclass), or the target is a user's `Target` (`models.protocol.own_methods`: the engine would run the
    model inside it, not its methods). A model neither engine body runs falls back to the loop when the engine refuses it
    (`engine_or_none`)."""
    if engine not in ("auto", "fast", "hf"):
        raise ValueError(f"engine must be 'auto', 'fast' or 'hf', got {engine!r}")
    if engine == "hf":
        return False
    if engine == "fast" or engine_needed(drafter):
        return True
    from specdec.models.protocol import own_methods

    if own_methods(target):  # a user's `Target`: the engine would not call its methods (`engine.build`)
        return False
    return _engine_drafts(drafter)


def _engine_drafts(drafter) -> bool:
    """Whether the engine can call this drafter, without building anything: a draft model (the fast bodies or the
    transformers backend may take it), a folder, of the loop drafters the kinds written for both runners (n-grams,
    prompt lookup, the model drafters the engine drafts with: `engine.build.covers_drafter`), and a loop-only drafter
    (its `propose` needs the loop's sampling arguments) that holds no model: the engine calls it through
    `drafters.loop_adapter.LoopOnEngine`, which begins it over each row's text every step — free for a table or a
    rule, a prefill of the whole text per step for a drafter with a model, which stays on the loop (its state there
    follows the batch step by step; engine="fast" takes it to the adapter) — but a `HierarchicalDrafter` over a
    table, a rule, a `ModelDrafter` or another such hierarchy runs natively, each model on its own slot cache
    (`engine.hierarchy.runs_on_engine`). Another `LoopDrafter` subclass whose `propose` binds the engine's call may
    still need the loop's arguments: the loop."""
    if drafter is None or isinstance(drafter, (torch.nn.Module, str, os.PathLike)):
        return True
    from specdec.drafters.cross_vocab import CrossVocabDrafter
    from specdec.drafters.loop_adapter import holds_model, is_loop_only
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import NGramDrafter
    from specdec.drafters.prompt_lookup import PromptLookupDrafter
    from specdec.drafters.protocol import LoopDrafter
    from specdec.engine.build import covers_drafter
    from specdec.fast.target import FastDrafter

    if is_loop_only(drafter):  # through `drafters.loop_adapter`, begun row by row every step: cheap without a model
        from specdec.engine.hierarchy import runs_on_engine

        return not holds_model(drafter) or runs_on_engine(drafter)  # (a hierarchy, its models: `engine.hierarchy`)
    if isinstance(drafter, LoopDrafter) and not isinstance(drafter, (NGramDrafter, PromptLookupDrafter)):
        return type(drafter) is ModelDrafter or type(drafter) in (FastDrafter, CrossVocabDrafter) and \
            covers_drafter(drafter)
    return covers_drafter(drafter)


def engine_tree_drafter(drafter):
    """What the engine drafts a `draft_tree` call's token trees from: a `drafters.tree.TreeModelDrafter` (the class
    itself: a subclass may change its rule) as its draft model — the engine grows trees from a draft model
    (`engine.tree_step`), the same rule — and anything else as it is (another tree drafter keeps the loop's trees)."""
    from specdec.drafters.tree import TreeModelDrafter

    return drafter.model if type(drafter) is TreeModelDrafter else drafter


def engine_needed(drafter) -> bool:
    """A drafter only the engine runs: a feature head or a plugin written against the engine's protocol."""
    return is_feature_head(drafter) or _engine_only(drafter)


def _engine_only(drafter) -> bool:
    """A drafter written against the engine's protocol alone (`drafters.protocol.is_slot_drafter`, not a loop
    drafter): only the engine can call it."""
    from specdec.drafters.protocol import LoopDrafter, is_slot_drafter

    return is_slot_drafter(drafter) and not isinstance(drafter, LoopDrafter)


def is_feature_head(drafter) -> bool:
    """A head or head folder (specdec's, EAGLE, EAGLE-3, Medusa, speculators): drafts from target features."""
    from specdec.drafters.formats import is_drafter  # lazily: the transformers loop does not need the fast model

    return is_drafter(drafter)
