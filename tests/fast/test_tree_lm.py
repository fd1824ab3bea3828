"""FastTreeLM (TreeCausalLM's interface on the fast model): per-row trees score every path as transformers does, and
a committed path (rows re-gathered first) continues exactly as the same text fed as a chain."""

import pytest
import torch

from specdec.fast import FastLlama
from specdec.fast.tree_lm import FastTreeLM, tree_ancestry

PROMPTS = [[5, 6, 7, 8], [12, 3], [3, 4, 5, 9, 9]]


def last_logits(hf, text):
    return hf(torch.tensor([text])).logits[0, -1]


def test_tree_passes_and_committed_paths(make_llama):
    hf = make_llama(2, layers=2)
    lm = FastTreeLM(FastLlama.from_hf(hf, kernels="reference"))
    with torch.inference_mode():
        context = lm.begin(PROMPTS, 12)
        last = context.tail(1)[0]  # [B, 1]
        lm.begin_tree()
        # each row its own shape: row 0 a chain of 3, row 1 two children of the root's child, row 2 a fork at the top
        parents = torch.tensor([[-1, 0, 1], [-1, 0, 0], [-1, -1, 1]])
        nodes = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
        block = torch.cat([last, nodes], 1)
        logits = lm.forward_tree(block, torch.cat([torch.full((3, 1), -1), parents + 1], 1))
        paths = [[[], [10], [10, 11], [10, 11, 12]], [[], [20], [20, 21], [20, 22]], [[], [30], [31], [31, 32]]]
        for b, prompt in enumerate(PROMPTS):
            for column, path in enumerate(paths[b]):
                torch.testing.assert_close(logits[b, column], last_logits(hf, prompt + path), atol=1e-4, rtol=0)
        # rows re-gathered as (2, 0, 0) first; keep (per new row): old row 2's root + 31, 32; old row 0's root + 10, 11
        keep = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
        lm.commit_path(keep, rows=torch.tensor([2, 0, 0]))
        texts = [PROMPTS[2] + [31, 32], PROMPTS[0] + [10, 11], PROMPTS[0] + [10, 11]]
        assert lm.lengths.tolist() == [len(t) for t in texts]  # the cache holds all but nothing pending
        more = torch.tensor([[40], [41], [42]])
        step = lm.forward(more)
        for b, text in enumerate(texts):
            torch.testing.assert_close(step[b, 0], last_logits(hf, text + [int(more[b, 0])]), atol=1e-4, rtol=0)
        with pytest.raises(RuntimeError, match="begin_tree"):
            lm.forward_tree(more, torch.full((3, 1), -1))


def _walk_ancestry(parents, depths, bits):
    """The reference: one node at a time, each reading its parent's values (FastTreeLM's former loop)."""
    batch, k = parents.shape
    first = depths.shape[1]
    depths = torch.cat([depths, torch.zeros(batch, k, dtype=torch.long)], 1)
    bits = torch.cat([bits, torch.zeros(batch, k, dtype=torch.long)], 1)
    rows, one = torch.arange(batch), torch.ones((), dtype=torch.long)
    for i in range(k):
        node, parent = first + i, parents[:, i]
        has, at = parent >= 0, parent.clamp_min(0)
        depths[:, node] = torch.where(has, depths[rows, at] + 1, 0)
        bits[:, node] = torch.where(has, bits[rows, at], 0) | torch.bitwise_left_shift(one, node)
    return depths[:, first:], bits[:, first:]


@pytest.mark.parametrize("first, k", [(0, 1), (0, 13), (5, 8), (40, 24), (0, 64)])
def test_tree_ancestry_equals_the_walk_node_by_node(first, k):
    """Random forests (each node under the text, an earlier node, or an earlier node of the same call), bit 63
    included: the pointer-jumping depths and ancestor bits are the per-node walk's."""
    g = torch.Generator().manual_seed(first * 100 + k)
    batch = 5
    prev_parents = torch.stack([torch.randint(-1, max(t, 1), (batch,), generator=g) if t else torch.full((batch,), -1)
                                for t in range(first)], 1) if first else torch.zeros(batch, 0, dtype=torch.long)
    depths, bits = _walk_ancestry(prev_parents, torch.zeros(batch, 0, dtype=torch.long),
                                  torch.zeros(batch, 0, dtype=torch.long))
    parents = torch.stack([torch.randint(-1, first + i, (batch,), generator=g) for i in range(k)], 1)
    parents[0] = torch.arange(first - 1, first + k - 1)  # row 0: one chain through the whole call (every round)
    got = tree_ancestry(parents, depths, bits)
    want = _walk_ancestry(parents, depths, bits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert int(got[0][0, -1]) == int(got[0][0, 0]) + k - 1  # the chain's depth
