"""Token trees as pure functions (specdec.core.tree): the shape, drawing children, recursive rejection sampling.

Statistical checks use hand-built laws on a small vocabulary; the negative control (try every child against
the original p, no residual correction) must fail the same test.
"""

import numpy as np
import pytest
import torch

from specdec.core.tree import TreeSpec, TreeVerifyResult, draw_children, verify_tree, verify_tree_greedy
from stats_utils import chi2_pvalue

PASS, FAIL = 1e-3, 1e-8
V, N = 6, 120_000
g0 = torch.Generator().manual_seed(0)
P1 = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])  # target at the root
Q1 = torch.tensor([0.10, 0.40, 0.05, 0.25, 0.10, 0.10])  # drafter at the root
P2 = torch.rand(V, V, generator=g0).pow(3).softmax(-1)  # target at depth 1 given the depth-1 token
Q2 = torch.rand(V, V, generator=g0).softmax(-1)
P3 = torch.full((V, V), 1.0 / V)  # bonus laws after a leaf


def test_tree_spec_shape():
    spec = TreeSpec([2, 2, 1])
    assert spec.offsets == (0, 1, 3, 7, 11) and spec.num_nodes == 11 and spec.num_internal == 7
    assert spec.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6]
    assert spec.depths.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    anc = spec.ancestors()
    assert anc[9].nonzero().squeeze(1).tolist() == [0, 2, 5, 9]
    assert TreeSpec([1, 1]).parents.tolist() == [-1, 0, 1]  # a chain is a tree


@pytest.mark.parametrize("bad", [[], [2, 0], [2.0], "2,2", None, [True], [64, 64]])
def test_tree_spec_errors_name_the_argument(bad):
    with pytest.raises(ValueError, match="draft_tree"):
        TreeSpec(bad)


def two_level_batch(mode: str, branching=(3, 2), seed: int = 1, deterministic: bool = False):
    """N independent trees drawn from (Q1, Q2) with their exact target laws at every node."""
    spec = TreeSpec(list(branching))
    g = torch.Generator().manual_seed(seed)
    k1, k2 = branching
    if deterministic:  # the top-k1 tokens of Q1, the top-k2 of Q2 (one-hot q)
        x1 = Q1.topk(k1).indices.expand(N, -1)
        x2 = Q2[x1].topk(k2, dim=-1).indices.reshape(N, -1)
        probs = None
    else:
        x1 = draw_children(Q1.expand(N, -1), k1, mode, g)  # [N, k1]
        x2 = draw_children(Q2[x1], k2, mode, g).reshape(N, -1)  # [N, k1·k2]
        probs = torch.cat([Q1.expand(N, 1, -1), Q2[x1]], 1)  # q at the root and the depth-1 nodes
    tokens = torch.cat([torch.zeros(N, 1, dtype=torch.long), x1, x2], 1)
    target = torch.cat([P1.expand(N, 1, -1), P2[x1], P3[x2]], 1)
    return spec, tokens, probs, target, g


def no_residual_rule(spec, tokens, probs, target, g, mode):
    """Negative control: each child is tried against the ORIGINAL p (first accepted wins), no residual update."""
    res = verify_tree(spec, tokens, probs, target, g, mode=mode)
    rows = torch.arange(tokens.shape[0])
    x = tokens[:, 1 : 1 + spec.branching[0]]
    u = torch.rand(x.shape, generator=g)
    ok = u * Q1[x] < P1[x]
    first = torch.where(ok.any(1), x[rows, ok.long().argmax(1)], res.next_token)
    return first


@pytest.mark.parametrize("mode", ["iid", "without_replacement", "deterministic"])
def test_first_token_follows_p_at_the_root(mode):
    spec, tokens, probs, target, g = two_level_batch(mode if mode != "deterministic" else "iid", deterministic=mode == "deterministic")
    res = verify_tree(spec, tokens, probs, target, g, mode="iid" if mode == "deterministic" else mode)
    out = res.tokens(tokens)
    assert chi2_pvalue(out[:, 0].numpy(), P1.numpy()) > PASS
    assert (res.num_accepted > 0).float().mean() > 0.4  # several children make acceptance likely


@pytest.mark.parametrize("mode", ["iid", "without_replacement"])
def test_second_token_follows_p_given_the_first(mode):
    spec, tokens, probs, target, g = two_level_batch(mode)
    res = verify_tree(spec, tokens, probs, target, g, mode=mode)
    out = res.tokens(tokens)
    for a in torch.bincount(out[res.num_accepted >= 1, 0], minlength=V).topk(2).indices.tolist():
        rows = (res.num_accepted >= 1) & (out[:, 0] == a)
        assert chi2_pvalue(out[rows, 1].numpy(), P2[a].numpy()) > PASS
    leaf = res.num_accepted == 2  # bonus after an accepted leaf: uniform P3
    assert chi2_pvalue(out[leaf, 2].numpy(), P3[0].numpy()) > PASS


@pytest.mark.parametrize("mode", ["iid", "without_replacement"])
def test_negative_control_without_residual_correction_fails(mode):
    spec, tokens, probs, target, g = two_level_batch(mode)
    first = no_residual_rule(spec, tokens, probs, target, g, mode)
    assert chi2_pvalue(first.numpy(), P1.numpy()) < FAIL


def test_verifying_with_the_wrong_mode_fails():
    # children drawn without replacement but verified as if i.i.d.: q_c is wrong after the first child
    spec, tokens, probs, target, g = two_level_batch("without_replacement")
    res = verify_tree(spec, tokens, probs, target, g, mode="iid")
    assert chi2_pvalue(res.tokens(tokens)[:, 0].numpy(), P1.numpy()) < FAIL


def test_draw_children_laws():
    g = torch.Generator().manual_seed(4)
    x = draw_children(Q1.expand(N, -1), 2, "without_replacement", g)
    assert (x[:, 0] != x[:, 1]).all()
    assert chi2_pvalue(x[:, 0].numpy(), Q1.numpy()) > PASS
    rows = x[:, 0] == 1  # the second child follows q without the first, renormalized
    assert chi2_pvalue(x[rows, 1].numpy(), Q1.scatter(0, torch.tensor([1]), 0.0).numpy()) > PASS
    y = draw_children(Q1.expand(N, -1), 2, "iid", g)
    assert chi2_pvalue(y[:, 1].numpy(), Q1.numpy()) > PASS and (y[:, 0] == y[:, 1]).any()
    assert draw_children(torch.log(P1)[None], 3, "iid", greedy_logits=True).tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="mode"):
        draw_children(Q1[None], 2, "nucleus", g)


def test_zero_probability_children_are_never_accepted():
    spec = TreeSpec([3])
    q = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]])  # only two tokens have mass: the third child is token 2, q = 0
    p = torch.tensor([[[0.0, 0.0, 1.0, 0.0], [0.25] * 4, [0.25] * 4, [0.25] * 4]])
    tokens = torch.tensor([[0, 0, 1, 2]])
    res = verify_tree(spec, tokens, q, p, uniforms=torch.zeros(1, 4), mode="without_replacement")
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [2]


def test_greedy_tree_takes_the_matching_child():
    spec = TreeSpec([2, 2])
    tokens = torch.tensor([[9, 4, 5, 1, 2, 3, 6]])  # root; level 1: 4, 5; level 2: (1, 2) under 4, (3, 6) under 5
    logits = torch.full((1, 7, 10), -5.0)
    for node, best in [(0, 5), (1, 0), (2, 6), (5, 1), (6, 7)]:
        logits[0, node, best] = 5.0
    res = verify_tree_greedy(spec, tokens, logits)
    assert res.path.tolist() == [[2, 6]] and res.num_accepted.tolist() == [2]
    assert res.tokens(tokens).tolist() == [[5, 6, 7]]  # the argmax path, then the argmax after the leaf
    logits[0, 0] = -5.0
    logits[0, 0, 8] = 5.0  # no child matches: emit the root's argmax
    res = verify_tree_greedy(spec, tokens, logits)
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [8]


def test_shape_errors():
    spec = TreeSpec([2])
    with pytest.raises(ValueError, match="tree_tokens"):
        verify_tree(spec, torch.zeros(1, 2, dtype=torch.long), None, torch.ones(1, 3, 4) / 4)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_tree(spec, torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 2, 4), torch.ones(1, 3, 4) / 4)
    assert isinstance(verify_tree(spec, torch.zeros(1, 3, dtype=torch.long), None, torch.ones(1, 3, 4) / 4), TreeVerifyResult)
