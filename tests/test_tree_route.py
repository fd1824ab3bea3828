"""`draft_tree` with a `TreeModelDrafter` object (`decoding/route.py`, `engine_tree_drafter`): `engine="auto"` runs
its trees on the engine, drafted from its model (`engine/tree_step.py`), with the loop's greedy tokens; a subclass
(it may change the rule) keeps the loop's trees, and so does a target the engine refuses."""

import pytest
import torch

import specdec
from helpers import perturbed_copy
from specdec.decoding import route
from specdec.drafters.tree import TreeModelDrafter

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8]]
KW = dict(max_new_tokens=12, temperature=0, eos_token_id=[])


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target, 0.4, seed=5)  # (close enough that trees are accepted past the root)


class CountingTree(TreeModelDrafter):
    """A subclass of its own: counts the loop's calls."""

    calls = 0

    def propose_tree(self, *args, **kw):
        type(self).calls += 1
        return super().propose_tree(*args, **kw)


def _engine_of(target, model):
    return [e[1] for e in target.__dict__.get("_specdec_engines", {}).values() if e[0]() is model]


@pytest.mark.parametrize("tree", [[2, 1], [3, 2, 1]])
def test_a_tree_model_drafter_runs_on_the_engine_with_the_loops_greedy_tokens(pair, monkeypatch, tree):
    target, draft = pair
    drafter = TreeModelDrafter(draft)
    assert route.engine_tree_drafter(drafter) is draft
    loop_calls = []
    real = TreeModelDrafter.propose_tree
    monkeypatch.setattr(TreeModelDrafter, "propose_tree", lambda self, *a, **k: loop_calls.append(1) or
                        real(self, *a, **k))
    ours = specdec.generate(target, PROMPTS, drafter=drafter, draft_tree=tree, **KW)
    assert not loop_calls and _engine_of(target, draft)  # drafted on the engine, from its model
    loop = specdec.generate(target, PROMPTS, drafter=TreeModelDrafter(draft), draft_tree=tree, engine="hf", **KW)
    assert loop_calls  # (the control: the loop's trees do call it)
    plain = specdec.generate(target, PROMPTS, None, **KW).sequences
    assert ours.sequences == loop.sequences == plain
    assert ours.stats.drafted_tokens > 0 and ours.stats.accepted_tokens > 0


def test_a_subclass_keeps_the_loops_trees(pair):
    target, draft = pair
    drafter = CountingTree(draft)
    assert route.engine_tree_drafter(drafter) is drafter
    CountingTree.calls = 0
    out = specdec.generate(target, PROMPTS, drafter=drafter, draft_tree=[2, 1], **KW)
    assert CountingTree.calls > 0 and out.sequences == specdec.generate(target, PROMPTS, None, **KW).sequences


def test_a_target_the_engine_refuses_keeps_the_loops_trees(make_llama, monkeypatch):
    """torch.ao's dynamic int8 (the build refuses it: each call's activations quantized together): the engine refuses
    the pair, the loop's trees run the object itself."""
    import warnings

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        target = torch.ao.quantization.quantize_dynamic(make_llama(3), {torch.nn.Linear}, dtype=torch.qint8).eval()
    drafter, calls = TreeModelDrafter(make_llama(1, layers=1)), []
    real = TreeModelDrafter.propose_tree
    monkeypatch.setattr(TreeModelDrafter, "propose_tree", lambda self, *a, **k: calls.append(self) or
                        real(self, *a, **k))
    out = specdec.generate(target, PROMPTS, drafter=drafter, draft_tree=[2, 1], **KW)
    assert calls and all(c is drafter for c in calls) and len(out.sequences[0]) == KW["max_new_tokens"]
