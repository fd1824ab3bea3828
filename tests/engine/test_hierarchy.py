"""`HierarchicalDrafter` on the engine (`engine/hierarchy.py`) when its inner drafter holds no model (over a model:
`test_hierarchy_models.py`): `engine="auto"`
takes it there; its greedy text is plain decoding's, alone and under continuous batching (rows joining, a plain row
beside speculative ones); each proposal is the middle model's own greedy continuation (the loop's rule), in fewer
middle passes than tokens — a control that accepts the inner drafts unverified proposes other tokens (and the target's
verification still keeps the text); a sampled step drafts the middle model's chain (the model drafter's draws)."""

from __future__ import annotations

import pytest

import specdec
from helpers import accepting_unverified, engine_hierarchy_proposals, hf_greedy, perturbed_copy
from specdec.decoding import route
from specdec.drafters.loop_adapter import LoopOnEngine
from specdec.engine import Engine, EngineConfig, hierarchy
from specdec.engine.hierarchy import EngineHierarchy, runs_on_engine
from specdec.request import SamplingParams

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8], [1, 2, 1, 2, 1, 2]]
NEW = 16


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target, 0.4, seed=5)


def hierarchy_of(draft, k: int = 2):
    return specdec.HierarchicalDrafter(draft, specdec.PromptLookupDrafter(), num_inner_draft_tokens=k)


def gen(target, drafter, prompts=PROMPTS, **kw):
    kw.setdefault("temperature", 0)
    return specdec.generate(target, prompts, drafter, max_new_tokens=NEW, num_draft_tokens=3, eos_token_id=[], **kw)


def plain(target, prompts=PROMPTS):
    return specdec.generate(target, prompts, None, max_new_tokens=NEW, temperature=0, eos_token_id=[]).sequences


def test_auto_takes_a_model_free_inner_drafter_to_the_engine_with_plain_greedy_tokens(pair):
    target, draft = pair
    drafter = hierarchy_of(draft)
    assert runs_on_engine(drafter) and route.runner_for("auto", target, drafter, 3) == "fast"
    out = gen(target, drafter)
    assert out.sequences == plain(target)
    engine = next(e for e in target.__dict__["_specdec_engines"].values() if e[0]() is drafter)[1]
    assert isinstance(engine.drafter, EngineHierarchy) and engine.drafter_cached and not engine.cuda_graphs
    model = gen(target, draft)  # the middle model as a plain model drafter: the same drafts, so the same counts
    assert (out.stats.drafted_tokens, out.stats.accepted_tokens) == (model.stats.drafted_tokens,
                                                                    model.stats.accepted_tokens)
    c = drafter.counters
    assert c.inner_accepted > 0 and c.middle_calls < c.middle_tokens  # inner drafts saved middle passes


def test_an_inner_drafter_the_engine_does_not_bind_keeps_the_loop_adapter(pair):
    """A hierarchy subclass as the inner drafter (it may change the rule; one over a model or another hierarchy of
    the class itself runs natively: `tests/engine/test_hierarchy_models.py`)."""
    from helpers import UnverifiedHierarchicalDrafter

    target, draft = pair
    inner = UnverifiedHierarchicalDrafter(draft, specdec.PromptLookupDrafter(), num_inner_draft_tokens=2)
    nested = specdec.HierarchicalDrafter(draft, inner, num_inner_draft_tokens=2)
    assert not runs_on_engine(nested) and route.runner_for("auto", target, nested, 3) == "hf"
    engine = Engine(target, nested, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                 cuda_graphs=False))
    assert isinstance(engine.drafter, LoopOnEngine)
    with pytest.raises(TypeError, match="inner drafter the engine binds"):
        EngineHierarchy(nested, None)


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_continuous_batching_keeps_plain_greedy_tokens(pair, layout):
    """Four requests joining two slots one per step, one of them plain (its row drafts nothing): the middle's cache
    is prefilled, caught up after plain steps and moved with its row (on the paged pool, its blocks shared by the
    prefix cache); every text is plain decoding's."""
    target, draft = pair
    pool = dict(kv_layout="paged", block_size=8, enable_prefix_caching=True) if layout == "paged" else {}
    engine = Engine(target, hierarchy_of(draft, k=3), EngineConfig(max_batch_size=2, max_seq_len=64,
                                                                   num_draft_tokens=3, cuda_graphs=False, **pool))
    caps = [None, 0, 2, None]
    ids, outs, pending = {}, {}, list(range(len(PROMPTS)))
    while pending or engine.has_unfinished():
        if pending:
            i = pending.pop(0)
            ids[engine.add_request(PROMPTS[i], SamplingParams(temperature=0, max_new_tokens=NEW,
                                                              num_draft_tokens=caps[i]))] = i
        for out in engine.step():
            outs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    assert [outs[i] for i in range(len(PROMPTS))] == plain(target)
    assert engine.stats.drafted_tokens > engine.stats.accepted_tokens > 0


def _proposals(target, drafter, monkeypatch) -> list[tuple[list[int], list[int]]]:
    return engine_hierarchy_proposals(target, drafter, monkeypatch, PROMPTS, plain(target), NEW)


def test_each_proposal_is_the_middle_models_greedy_continuation(pair, monkeypatch):
    target, draft = pair
    seen = _proposals(target, hierarchy_of(draft), monkeypatch)
    assert len(seen) > len(PROMPTS)
    assert all(drafts == hf_greedy(draft, text, len(drafts), []) for text, drafts in seen)


def test_negative_control_inner_drafts_accepted_unverified_are_not_the_middle_models(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(hierarchy, "verify_greedy", accepting_unverified(hierarchy.verify_greedy))
    seen = _proposals(target, hierarchy_of(draft), monkeypatch)
    assert any(drafts != hf_greedy(draft, text, len(drafts), []) for text, drafts in seen)


def test_a_sampled_step_drafts_the_middle_models_chain(pair):
    """Sampled, the hierarchy's drafts follow the middle model's law (what the inner speculation keeps): on the engine
    it draws that chain directly, each row's own seed — the same text as the middle model as a model drafter."""
    target, draft = pair
    drafter = hierarchy_of(draft)
    ours = gen(target, drafter, temperature=1.0, seed=3)
    assert ours.sequences == gen(target, draft, temperature=1.0, seed=3).sequences
    assert ours.stats.drafted_tokens > 0 and drafter.counters.middle_calls > 0


def test_a_subclass_keeps_its_own_rule_on_the_loop_adapter(pair):
    """A HierarchicalDrafter subclass may change the rule (the loop's negative control does): not replaced here."""
    from helpers import UnverifiedHierarchicalDrafter

    target, draft = pair
    drafter = UnverifiedHierarchicalDrafter(draft, specdec.PromptLookupDrafter(), num_inner_draft_tokens=2)
    assert not runs_on_engine(drafter) and route.runner_for("auto", target, drafter, 3) == "hf"
