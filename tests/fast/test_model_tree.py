"""FastLlama's token-tree pass: every node's logits are transformers' logits of the committed text + the node's path
(fp32, CPU; ragged rows, levels fed one call at a time as a drafter does, the fused layer through Triton's
interpreter)."""

import pytest
import torch

from specdec.fast import FastLlama
from specdec.fast.cache import TreeNodes

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 3], [3, 4, 5]]
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6]  # [2, 2, 1], breadth first


def tree_nodes(first: int, last: int) -> TreeNodes:
    depths, bits = [], []
    for i, parent in enumerate(PARENTS):
        depths.append(0 if parent < 0 else depths[parent] + 1)
        bits.append((1 << i) | (bits[parent] if parent >= 0 else 0))
    return TreeNodes(first, torch.tensor(depths[first:last]), torch.tensor(bits[first:last]))


def path(node: int) -> list[int]:
    out = []
    while node > 0:
        out.append(node)
        node = PARENTS[node]
    return out[::-1]


def prefilled(fast, prompts):
    """A cache holding each prompt but its last token (the tree's root)."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for b, p in enumerate(prompts):
        tokens[b, : len(p) - 1] = torch.tensor(p[:-1])
        valid[b, : len(p) - 1] = True
    cache = fast.new_cache(len(prompts), 48)
    fast(tokens, cache, valid)
    return cache


def check_nodes(hf, prompts, nodes, logits, columns):
    for b, prompt in enumerate(prompts):
        for column, node in enumerate(columns):
            text = prompt + [int(nodes[b, t]) for t in path(node)]
            ref = hf(torch.tensor([text])).logits[0, -1]
            torch.testing.assert_close(logits[b, column], ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_one_tree_pass_scores_every_path(make_llama, kernels):
    if kernels == "triton":
        pytest.importorskip("triton")
    hf = make_llama(3, layers=2)
    fast = FastLlama.from_hf(hf, kernels=kernels)
    nodes = torch.randint(0, 64, (len(PROMPTS), len(PARENTS)), generator=torch.Generator().manual_seed(1))
    nodes[:, 0] = torch.tensor([p[-1] for p in PROMPTS])
    with torch.inference_mode():
        cache = prefilled(fast, PROMPTS)
        logits = fast(nodes, cache, tree=tree_nodes(0, len(PARENTS)))
        assert cache.lengths.tolist() == [len(p) - 1 + len(PARENTS) for p in PROMPTS]
        check_nodes(hf, PROMPTS, nodes, logits, range(len(PARENTS)))


def test_levels_fed_one_call_each(make_llama):
    """A drafter feeds the root as committed text, then one level per call (first = the level's first node)."""
    hf = make_llama(4, layers=1)
    fast = FastLlama.from_hf(hf, kernels="reference")
    nodes = torch.randint(0, 64, (len(PROMPTS), len(PARENTS)), generator=torch.Generator().manual_seed(2))
    nodes[:, 0] = torch.tensor([p[-1] for p in PROMPTS])
    with torch.inference_mode():
        cache = prefilled(fast, PROMPTS)
        fast(nodes[:, :1], cache)  # the root, as a chain token
        for first, last in ((1, 3), (3, 7)):
            logits = fast(nodes[:, first:last], cache, tree=tree_nodes(first, last))
            check_nodes(hf, PROMPTS, nodes, logits, range(first, last))
