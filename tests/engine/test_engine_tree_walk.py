"""`tree_step.walk_tree` (every node's sibling tests at once) against `core.tree.verify_tree` (the walk down)."""

import pytest
import torch

from specdec.core import sample
from specdec.core.tree import verify_tree
from specdec.engine import Engine, EngineConfig, tree_step
from specdec.engine.tree_step import EngineTree, walk_all_nodes, walk_tree
from specdec.request import SamplingParams


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")])]


def _case(branching, batch, vocab, seed, peaked, device="cpu"):
    """Random tree contents whose children often match the target (so paths go deep)."""
    g = torch.Generator().manual_seed(seed)
    tree = EngineTree.of(branching, torch.device(device))
    n, m = tree.spec.num_nodes, tree.spec.num_internal
    target = (torch.randn(batch, n, vocab, generator=g) * peaked).softmax(-1)
    draft = (torch.randn(batch, m, vocab, generator=g) * peaked).softmax(-1)
    draft[:, :, :3] += 0.5  # a shared head: children are accepted as often as not
    target[:, :, :3] += 0.5
    draft, target = draft / draft.sum(-1, keepdim=True), target / target.sum(-1, keepdim=True)
    tokens = torch.randint(0, 4, (batch, n), generator=g)
    uniforms = torch.rand(batch, n, generator=g)
    noise = -torch.rand(batch, vocab, generator=g).log()
    return tree, *(x.to(device) for x in (tokens, draft, target, uniforms, noise))


@pytest.mark.parametrize("branching", [(1, 1, 1, 1), (4, 2, 2), (3, 2, 1, 1), (2,), (1, 3)])
@pytest.mark.parametrize("mode", ["without_replacement", "iid"])
@pytest.mark.parametrize("vocab", [12, 8192])
@pytest.mark.parametrize("device", DEVICES)
def test_the_walk_decides_what_verify_tree_decides(branching, mode, vocab, device):
    """(On CUDA too: its reductions over [b, M, V] and [b, V] must not move a decision.)"""
    depths = []
    for seed in range(6 if vocab < 100 else 2):  # (the demo pair's vocabulary: fewer, larger cases)
        tree, tokens, draft, target, uniforms, noise = _case(branching, 64 if vocab < 100 else 48, vocab, seed,
                                                             1.0 + seed, device)
        want = verify_tree(tree.spec, tokens, draft, target, mode=mode, uniforms=uniforms, noise=noise)
        path, law = walk_tree(tree, tokens, draft, target, uniforms, mode=mode)
        assert torch.equal(path, want.path)
        assert torch.equal(sample(law, noise=noise), want.next_token)
        depths.append(want.num_accepted)
    accepted = torch.cat(depths)
    assert (accepted == 0).any() and (accepted >= 1).any()  # both outcomes exercised
    if len(branching) > 1:
        assert (accepted >= 2).any()


def test_the_walk_differs_when_the_mode_does():
    """A check that can fail: removal from q changes some decision of a wide level."""
    tree, tokens, draft, target, uniforms, _ = _case((4, 2), 256, 6, 0, peaked=3.0)
    a, _ = walk_tree(tree, tokens, draft, target, uniforms, mode="without_replacement")
    b, _ = walk_tree(tree, tokens, draft, target, uniforms, mode="iid")
    assert not torch.equal(a, b)


def test_which_walk_a_step_takes():
    cpu = torch.device("cpu")
    assert walk_all_nodes(EngineTree.of((1, 1, 1, 1), cpu), 1024, 150_000)  # chain-shaped: no extra slices
    assert walk_all_nodes(EngineTree.of((4, 2, 2), cpu), 32, 8192)  # the demo pair under load
    assert not walk_all_nodes(EngineTree.of((4, 2, 2), cpu), 8, 128_256)  # a wide tree, a large vocabulary


def test_the_engine_draws_the_same_tokens_by_either_walk(make_llama, monkeypatch):
    """A sampled tree step through `walk_tree` and through `verify_tree` (every tree but chains walks down when
    the exchange rate is 0): the same tokens, request by request."""
    target, draft = make_llama(0), make_llama(1, layers=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
        draft.lm_head.weight.mul_(4.0)

    def tokens():
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=96))
        ids = [engine.add_request([1 + i, 5, 9], SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=24,
                                                                seed=i, eos_token_ids=(), draft_tree=(3, 2)))
               for i in range(4)]
        got = {rid: [] for rid in ids}
        while engine.has_unfinished():
            for out in engine.step():
                got[out.request_id] += out.new_token_ids
        assert engine.stats.accepted_tokens > 0
        return [got[rid] for rid in ids]

    walked = tokens()
    calls = []
    monkeypatch.setattr(tree_step, "WALK_ELEMENTS_PER_CHILD", 0)
    real = tree_step.verify_tree
    monkeypatch.setattr(tree_step, "verify_tree", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert tokens() == walked and calls
