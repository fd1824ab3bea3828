"""`HierarchicalDrafter` on the engine when its inner drafter holds a model (`engine/hierarchy.py`,
`engine/slot_group.py`): a draft model under the middle model, or another hierarchy, each on its own slot cache.
`engine="auto"` takes it there; its greedy text is plain decoding's and the loop's, alone and under continuous
batching (rows joining, a plain row, a sampled row, the paged pool with its prefix cache); every inner proposal is
the inner model's own greedy continuation of the text it is given — its cache follows the text through rounds,
plain steps, sampled steps and prefix-cache hits — which a control that skips the closing sync breaks, and one whose
group feeds prompts to the middle model alone; every hierarchy proposal is the middle model's greedy continuation,
which a control accepting the inner drafts unverified breaks."""

from __future__ import annotations

import pytest
import torch

import specdec
from helpers import accepting_unverified, engine_hierarchy_proposals, perturbed_copy
from specdec.decoding import route
from specdec.drafters.model import ModelDrafter
from specdec.engine import Engine, EngineConfig, hierarchy
from specdec.engine.hierarchy import EngineHierarchy, runs_on_engine
from specdec.engine.slot_group import CacheGroup, SlotGroup
from specdec.request import SamplingParams

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8], [1, 2, 1, 2, 1, 2]]
NEW = 16


@pytest.fixture(scope="module")
def models(make_llama):
    target = make_llama(0)
    middle = perturbed_copy(target, 0.4, seed=5)
    return target, middle, perturbed_copy(middle, 0.5, seed=6)


def over_model(middle, small, k: int = 2):
    return specdec.HierarchicalDrafter(middle, small, num_inner_draft_tokens=k)


def nested(middle, small):
    return specdec.HierarchicalDrafter(middle, over_model(small, specdec.PromptLookupDrafter()),
                                       num_inner_draft_tokens=3)


def gen(target, drafter, prompts=PROMPTS, **kw):
    kw.setdefault("temperature", 0)
    return specdec.generate(target, prompts, drafter, max_new_tokens=NEW, num_draft_tokens=3, eos_token_id=[], **kw)


def plain(target, prompts=PROMPTS):
    return specdec.generate(target, prompts, None, max_new_tokens=NEW, temperature=0, eos_token_id=[]).sequences


def greedy(model, text: list[int], n: int) -> list[int]:
    """The model's own greedy continuation of `text`, `n` tokens (full forwards: no cache)."""
    ids = list(text)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(text):]


@pytest.mark.parametrize("kind", ["model", "nested"])
def test_auto_takes_it_to_the_engine_with_plain_and_loop_greedy_tokens(models, kind):
    target, middle, small = models
    drafter = over_model(middle, small) if kind == "model" else nested(middle, small)
    assert runs_on_engine(drafter) and route.runner_for("auto", target, drafter, 3) == "fast"
    out = gen(target, drafter)
    assert out.sequences == plain(target) == gen(target, drafter, engine="hf").sequences
    engine = next(e for e in target.__dict__["_specdec_engines"].values() if e[0]() is drafter)[1]
    assert isinstance(engine.drafter, EngineHierarchy) and isinstance(engine.drafter.state, SlotGroup)
    assert isinstance(engine.drafter.cache, CacheGroup) and len(engine.drafter.cache.parts) == 2
    assert engine.drafter_cached and not engine.cuda_graphs
    c = drafter.counters
    assert c.inner_accepted > 0 and c.middle_calls < c.middle_tokens  # inner drafts saved middle passes


def test_a_transformers_model_as_inner_drafter_is_wrapped_and_bound(models):
    target, middle, small = models
    drafter = over_model(middle, small)
    assert type(drafter.inner) is ModelDrafter and not drafter.inner.on_engine
    engine = Engine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                  cuda_graphs=False))
    assert engine.drafter.inner.on_engine and engine.drafter.inner is not drafter.inner  # (a bound copy)
    with pytest.raises(TypeError, match="bind the inner"):
        EngineHierarchy(drafter, engine.drafter.middle)  # the loop's ModelDrafter as it is: refused


def _run(engine, requests) -> dict[int, list[int]]:
    """Requests (prompt, params) joining one per step → each one's tokens."""
    ids, outs, pending = {}, {}, list(range(len(requests)))
    while pending or engine.has_unfinished():
        if pending:
            i = pending.pop(0)
            ids[engine.add_request(requests[i][0], requests[i][1])] = i
        for out in engine.step():
            outs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    return outs


@pytest.mark.parametrize("layout", ["static", "paged"])
@pytest.mark.parametrize("kind", ["model", "nested"])
def test_continuous_batching_keeps_plain_greedy_tokens(models, layout, kind):
    """Four requests joining two slots, one of them plain (its row drafts nothing: the others' steps still draft):
    every model's cache is prefilled, caught up and moved with its row (paged: one block table for all, shared by
    the prefix cache); every text is plain decoding's."""
    target, middle, small = models
    pool = dict(kv_layout="paged", block_size=8, enable_prefix_caching=True) if layout == "paged" else {}
    drafter = over_model(middle, small, k=3) if kind == "model" else nested(middle, small)
    engine = Engine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                  cuda_graphs=False, **pool))
    caps = [None, 0, 2, None]
    outs = _run(engine, [(p, SamplingParams(temperature=0, max_new_tokens=NEW, num_draft_tokens=c))
                         for p, c in zip(PROMPTS, caps)])
    assert [outs[i] for i in range(len(PROMPTS))] == plain(target)
    assert engine.stats.drafted_tokens > engine.stats.accepted_tokens > 0


SHARED = [7, 3, 9, 1, 4, 4, 2, 8, 6, 5, 3, 3, 1, 9, 2, 7, 4]  # 17 tokens: two full blocks of 8 to share


def _inner_proposals(target, drafter, monkeypatch, layout: str = "static"):
    """(text, drafts) of every inner model proposal (active rows), over greedy requests beside a sampled one and a
    plain one (sampled steps draft the middle's chain; a plain step leaves the models behind: a catch-up)."""
    seen, engines = [], []
    real = ModelDrafter.propose

    def spy(self, context, gamma, *args, **kw):
        proposal = real(self, context, gamma, *args, **kw)
        if self.on_engine:
            active = engines[0].runner.state.active
            for i in range(context.batch):
                if bool(active[i]):
                    n = int(context.lengths[i])
                    seen.append((context.tokens[i, :n].tolist(), proposal.tokens[i].tolist()))
        return proposal

    monkeypatch.setattr(ModelDrafter, "propose", spy)
    pool = dict(kv_layout="paged", block_size=8, enable_prefix_caching=True) if layout != "static" else {}
    pool["mixed_step"] = layout == "mixed"  # (whole prefills elsewhere: the mixed step is the default where it runs)
    engines.append(Engine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                        cuda_graphs=False, **pool)))
    temps, caps = [0, 1.0, 0, 0, 0], [None, None, 0, 2, None]
    shared = layout in ("shared", "mixed")
    prompts = [SHARED + p if shared else p for p in PROMPTS + [[3, 1, 4, 1, 5]]]
    outs = _run(engines[0], [(p, SamplingParams(temperature=t, max_new_tokens=NEW, num_draft_tokens=c, seed=11))
                             for p, t, c in zip(prompts, temps, caps)])
    want = plain(target, prompts)
    assert all(outs[i] == want[i] for i, t in enumerate(temps) if t == 0)
    assert (engines[0].prefix_cache_hits > 0) == shared  # (shared: later prompts' blocks hit)
    assert (engines[0].runner.num_mixed_steps > 0) == (layout == "mixed")  # (prompt chunks in running steps)
    return seen


@pytest.mark.parametrize("layout", ["static", "paged", "shared", "mixed"])
def test_every_inner_proposal_is_the_inner_models_greedy_continuation(models, monkeypatch, layout):
    """static, the paged pool, the paged pool with prompts sharing two blocks (every model's entries in a hit
    block: the prefix cache's copy-on-write across the group's caches), and that with mixed steps (prompt chunks fed
    to every model in ragged feeds)."""
    target, middle, small = models
    seen = _inner_proposals(target, over_model(middle, small, k=3), monkeypatch, layout)
    assert len(seen) > 20
    assert all(drafts == greedy(small, text, len(drafts)) for text, drafts in seen)


def test_negative_control_without_the_closing_sync_the_inner_cache_goes_stale(models, monkeypatch):
    target, middle, small = models
    monkeypatch.setattr(EngineHierarchy, "_follow", lambda self, inner, text, gamma: None)
    seen = _inner_proposals(target, over_model(middle, small, k=3), monkeypatch)
    assert any(drafts != greedy(small, text, len(drafts)) for text, drafts in seen)


def test_negative_control_a_group_that_feeds_only_the_middle_model_leaves_the_inner_cache_empty(models, monkeypatch):
    target, middle, small = models
    for name in ("prefill", "prefill_ragged"):
        real = getattr(SlotGroup, name)
        monkeypatch.setattr(SlotGroup, name, lambda self, *a, real=real, **k: real(
            type("Middle", (), {"states": self.states[:1]})(), *a, **k))
    seen = _inner_proposals(target, over_model(middle, small, k=3), monkeypatch)
    assert any(drafts != greedy(small, text, len(drafts)) for text, drafts in seen)


def _proposals(target, drafter, monkeypatch) -> list[tuple[list[int], list[int]]]:
    return engine_hierarchy_proposals(target, drafter, monkeypatch, PROMPTS, plain(target), NEW)


@pytest.mark.parametrize("kind", ["model", "nested"])
def test_each_proposal_is_the_middle_models_greedy_continuation(models, monkeypatch, kind):
    target, middle, small = models
    drafter = over_model(middle, small) if kind == "model" else nested(middle, small)
    seen = _proposals(target, drafter, monkeypatch)
    assert len(seen) > len(PROMPTS)
    assert all(drafts == greedy(middle, text, len(drafts)) for text, drafts in seen)


def test_negative_control_inner_drafts_accepted_unverified_are_not_the_middle_models(models, monkeypatch):
    target, middle, small = models
    monkeypatch.setattr(hierarchy, "verify_greedy", accepting_unverified(hierarchy.verify_greedy))
    seen = _proposals(target, over_model(middle, small), monkeypatch)
    assert any(drafts != greedy(middle, text, len(drafts)) for text, drafts in seen)


def test_a_sampled_run_drafts_the_middle_models_chain(models):
    """Sampled, the hierarchy's drafts follow the middle model's law (what the inner speculation keeps): on the engine
    it draws that chain directly, each row's own seed — the same text as the middle model as a model drafter."""
    target, middle, small = models
    drafter = over_model(middle, small)
    ours = gen(target, drafter, temperature=1.0, seed=3)
    assert ours.sequences == gen(target, middle, temperature=1.0, seed=3).sequences
    assert ours.stats.drafted_tokens > 0 and drafter.counters.middle_calls > 0
