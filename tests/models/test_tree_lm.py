"""TreeCausalLM: a tree pass scores every node as if its root-to-node path had been fed as a chain."""

import pytest
import torch

from specdec.models.tree_lm import TreeCausalLM
from specdec.core.tree import TreeSpec

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5]]


def chain_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("make", ["llama", "qwen2", "gpt2"])
def test_tree_pass_and_commit_match_plain_chains(request, make):
    model = request.getfixturevalue(make)
    lm = TreeCausalLM(model)
    context = lm.begin(PROMPTS, 16)
    spec = TreeSpec([2, 2])
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (3, spec.num_nodes), generator=g)
    last, _ = context.tail(1)
    tokens[:, 0] = last[:, 0]  # the root is each row's last committed token
    lm.begin_tree()
    parents = spec.parents.expand(3, -1)
    # two calls: the root and level 1, then level 2 hanging under nodes of the first call
    logits = torch.cat([lm.forward_tree(tokens[:, :3], parents[:, :3]), lm.forward_tree(tokens[:, 3:], parents[:, 3:])], 1)
    for b, prompt in enumerate(PROMPTS):
        for node in range(spec.num_nodes):
            path, i = [], node
            while i > 0:
                path.insert(0, int(tokens[b, i]))
                i = int(spec.parents[i])
            torch.testing.assert_close(logits[b, node], chain_logits(model, prompt + path), atol=1e-4, rtol=1e-4)
    # keep root → node 2 → node 5 in row 0, root → node 1 in row 1, only the root in row 2
    keep = torch.zeros(3, spec.num_nodes, dtype=torch.bool)
    keep[0, [0, 2, 5]] = True
    keep[1, [0, 1]] = True
    keep[2, 0] = True
    lm.commit_path(keep)
    paths = [[int(tokens[0, 2]), int(tokens[0, 5])], [int(tokens[1, 1])], []]
    assert lm.lengths.tolist() == [len(p) + len(x) for p, x in zip(PROMPTS, paths)]
    nxt = torch.tensor([[7], [8], [9]])
    out = lm.forward(nxt)[:, -1]
    for b, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(out[b], chain_logits(model, prompt + paths[b] + [int(nxt[b])]), atol=1e-4, rtol=1e-4)
    lm.crop(lm.lengths - 1)  # rollback still works on the committed path
    out = lm.forward(nxt)[:, -1]
    for b, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(out[b], chain_logits(model, prompt + paths[b] + [int(nxt[b])]), atol=1e-4, rtol=1e-4)


def test_commit_with_row_gather_and_compaction(llama):
    lm = TreeCausalLM(llama)
    lm.compact_after_holes = 0  # compact at every crop
    context = lm.begin([[3, 4, 5]], 16)
    last, _ = context.tail(1)
    lm.begin_tree()
    logits = lm.forward_tree(torch.tensor([[int(last), 20, 21]]), torch.tensor([[-1, 0, 0]]))
    keep = torch.tensor([[True, True, False], [True, False, True]])
    lm.commit_path(keep, rows=torch.tensor([0, 0]))  # one tree seeds two rows
    lm.crop(lm.lengths)
    out = lm.forward(torch.tensor([[9], [9]]))[:, -1]
    torch.testing.assert_close(out[0], chain_logits(llama, [3, 4, 5, 20, 9]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[1], chain_logits(llama, [3, 4, 5, 21, 9]), atol=1e-4, rtol=1e-4)
    assert logits.shape == (1, 3, 64)


def test_tree_phase_misuse(llama):
    lm = TreeCausalLM(llama)
    lm.begin([[1, 2]], 4)
    with pytest.raises(RuntimeError, match="begin_tree"):
        lm.forward_tree(torch.tensor([[1]]), torch.tensor([[-1]]))
    lm.begin_tree()
    with pytest.raises(RuntimeError, match="commit_path"):
        lm.crop(1)
