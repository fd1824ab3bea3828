"""Token-tree slot attention: the reference mask is the definition (a node sees the committed text and its own
path), and the Triton kernel (CPU: Triton's interpreter) equals the reference."""

import pytest
import torch

from specdec.fast.kernels.attention import TreeMask, slot_attention, slot_attention_reference

# a [2, 2, 1] tree, breadth first: node 0 the root, 1-2 its children, 3-6 theirs, 7-10 one leaf each
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6]


def ancestor_bits(parents: list[int]) -> torch.Tensor:
    """`[N]` int64: bit t of entry i set when node t is node i or one of its ancestors."""
    bits = []
    for i, parent in enumerate(parents):
        bits.append((1 << i) | (bits[parent] if parent >= 0 else 0))
    return torch.tensor(bits, dtype=torch.long)


def tree_case(batch, heads, kv_heads, dim, num_slots, *, first=0, seed=0, dtype=torch.float32):
    """Queries for nodes first.. of PARENTS per row, the tree's root at a random slot `base` per row."""
    gen = torch.Generator().manual_seed(seed)
    k = len(PARENTS) - first
    keys = torch.randn(batch, kv_heads, num_slots, dim, generator=gen).to(dtype)
    values = torch.randn(batch, kv_heads, num_slots, dim, generator=gen).to(dtype)
    q = torch.randn(batch, k, heads, dim, generator=gen).to(dtype)
    base = torch.randint(0, num_slots - len(PARENTS) - 1, (batch,), generator=gen)
    base[0] = 0
    positions = base[:, None] + first + torch.arange(k)[None, :]  # each query's own slot
    tree = TreeMask(base, ancestor_bits(PARENTS)[first:][None, :].expand(batch, k))
    return q, keys, values, positions, tree


def by_hand(q, keys, values, positions, tree) -> torch.Tensor:
    """The definition, one query at a time in float64: slots below base, then the node's own path."""
    batch, k, heads, dim = q.shape
    group = heads // keys.shape[1]
    out = torch.zeros(batch, k, heads, dim, dtype=torch.float64)
    for b in range(batch):
        base = int(tree.base[b])
        for i in range(k):
            node = int(positions[b, i]) - base
            path = [t for t in range(len(PARENTS)) if int(tree.ancestors[b, i]) >> t & 1]
            assert node in path and max(path) == node
            slots = list(range(base)) + [base + t for t in path]
            for h in range(heads):
                key, value = keys[b, h // group, slots].double(), values[b, h // group, slots].double()
                weights = torch.softmax(key @ q[b, i, h].double() / dim**0.5, 0)
                out[b, i, h] = weights @ value
    return out


@pytest.mark.parametrize("first", [0, 3])
def test_reference_is_the_tree_definition(first):
    q, keys, values, positions, tree = tree_case(3, 4, 2, 16, 40, first=first)
    out = slot_attention_reference(q, keys, values, positions, tree=tree)
    assert torch.allclose(out.double(), by_hand(q, keys, values, positions, tree), atol=1e-5)


def test_a_path_scores_as_the_same_tokens_laid_out_as_a_chain():
    """Node 9 (path 0 → 2 → 5 → 9) sees exactly what the last of four chain tokens sees after the same text."""
    q, keys, values, positions, tree = tree_case(1, 4, 2, 16, 40, seed=3)
    base = int(tree.base[0])
    path = [0, 2, 5, 9]
    chain_keys, chain_values = keys.clone(), values.clone()
    chain_keys[:, :, base : base + 4] = keys[:, :, [base + t for t in path]]
    chain_values[:, :, base : base + 4] = values[:, :, [base + t for t in path]]
    node = slot_attention_reference(q, keys, values, positions, tree=tree)[:, 9]
    chain = slot_attention_reference(q[:, 9:10], chain_keys, chain_values, torch.tensor([[base + 3]]))[:, 0]
    assert torch.allclose(node, chain, atol=1e-6)


triton = pytest.importorskip("triton")


@pytest.fixture
def interpreter_new_enough():
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if not torch.cuda.is_available() and version < (3, 8):
        pytest.skip(f"Triton {triton.__version__}'s interpreter; these CPU tests need triton >= 3.8")


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 1)])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("first", [0, 1, 7])
def test_triton_matches_reference(heads, kv_heads, num_splits, first, interpreter_new_enough):
    q, keys, values, positions, tree = tree_case(3, heads, kv_heads, 16, 150, first=first, seed=first)
    ref = slot_attention_reference(q, keys, values, positions, tree=tree)
    out = slot_attention(q, keys, values, positions, kernel="triton", num_splits=num_splits, tree=tree)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


def test_triton_with_softcap_matches_reference(interpreter_new_enough):
    q, keys, values, positions, tree = tree_case(2, 4, 2, 16, 70, seed=5)
    ref = slot_attention_reference(q, keys, values, positions, tree=tree, softcap=2.0)
    out = slot_attention(q, keys, values, positions, kernel="triton", tree=tree, softcap=2.0)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


def test_tree_arguments_are_checked():
    q, keys, values, positions, tree = tree_case(2, 4, 2, 16, 40)
    with pytest.raises(ValueError, match="sliding window"):
        slot_attention(q, keys, values, positions, tree=tree, window=8)
    with pytest.raises(ValueError, match="ancestors"):
        slot_attention(q, keys, values, positions, tree=TreeMask(tree.base, tree.ancestors[:, :3]))
