"""The Triton split-K attention reading K/V through a block table (`slot_attention(block_table=...)`, a pool
`[N, block_size, H_kv, D]`) equals the reference over the rows' gathered blocks (CPU: Triton's interpreter): chains,
forced splits, windows, soft-caps and token trees; blocks no row's table names (NaN-poisoned) are never read."""

import pytest
import torch

triton = pytest.importorskip("triton")

from specdec.fast.kernels.attention import TreeMask, slot_attention  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter_new_enough():
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if not torch.cuda.is_available() and version < (3, 8):
        pytest.skip(f"Triton {triton.__version__}'s interpreter; these CPU tests need triton >= 3.8")


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def paged(batch, kv_heads, dim, blocks_per_row, page, *, seed=0, spare=5):
    """A pool with `spare` blocks no row holds (NaN: reading one would show) and a scrambled table per row."""
    gen = torch.Generator().manual_seed(seed)
    total = batch * blocks_per_row + spare
    keys = torch.randn(total, page, kv_heads, dim, generator=gen)
    values = torch.randn(total, page, kv_heads, dim, generator=gen)
    order = torch.randperm(total, generator=gen)
    table = order[: batch * blocks_per_row].view(batch, blocks_per_row).to(torch.int32)
    unused = order[batch * blocks_per_row :]
    keys[unused], values[unused] = float("nan"), float("nan")
    return keys, values, table


def positions_for(batch, k, num_slots, seed=0):
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, num_slots - k, (batch,), generator=gen)
    starts[-1] = num_slots - 1 - k  # the last usable slot (S − 2)
    return starts[:, None] + torch.arange(k)[None, :]


@pytest.mark.parametrize("page", [4, 16])
@pytest.mark.parametrize("k,heads,kv_heads", [(1, 4, 2), (5, 8, 1), (3, 2, 2)])
@pytest.mark.parametrize("splits", [None, 3])
def test_paged_kernel_matches_the_reference(page, k, heads, kv_heads, splits):
    batch, dim, blocks = 3, 16, 80 // page
    keys, values, table = paged(batch, kv_heads, dim, blocks, page, seed=k + page)
    q = torch.randn(batch, k, heads, dim, generator=torch.Generator().manual_seed(k))
    positions = positions_for(batch, k, blocks * page, seed=k)
    ref = slot_attention(q, keys, values, positions, kernel="reference", block_table=table)
    out = slot_attention(q, keys, values, positions, kernel="triton", block_table=table, num_splits=splits)
    assert not ref.isnan().any() and rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("window,softcap", [(6, None), (None, 4.0), (9, 3.0)])
def test_windows_and_softcaps_through_the_table(window, softcap):
    batch, k, heads, kv_heads, dim, page, blocks = 2, 4, 4, 2, 16, 8, 8
    keys, values, table = paged(batch, kv_heads, dim, blocks, page, seed=3)
    q = torch.randn(batch, k, heads, dim)
    positions = positions_for(batch, k, blocks * page, seed=1)
    ref = slot_attention(q, keys, values, positions, kernel="reference", window=window, softcap=softcap,
                         block_table=table)
    out = slot_attention(q, keys, values, positions, kernel="triton", window=window, softcap=softcap,
                         block_table=table)
    assert rel_err(out, ref) < 1e-5


def test_tree_mask_through_the_table_and_a_wrong_table_differs():
    batch, heads, kv_heads, dim, page, blocks = 2, 4, 2, 16, 8, 6
    keys, values, table = paged(batch, kv_heads, dim, blocks, page, seed=5)
    parents = [-1, 0, 0, 1, 2]
    bits = []
    for i, parent in enumerate(parents):
        bits.append((1 << i) | (bits[parent] if parent >= 0 else 0))
    base = torch.tensor([10, 30])
    positions = base[:, None] + torch.arange(len(parents))[None, :]  # node t in slot base + t
    tree = TreeMask(base, torch.tensor(bits)[None, :].expand(batch, -1).contiguous())
    q = torch.randn(batch, len(parents), heads, dim)
    ref = slot_attention(q, keys, values, positions, kernel="reference", tree=tree, block_table=table)
    out = slot_attention(q, keys, values, positions, kernel="triton", tree=tree, block_table=table)
    assert rel_err(out, ref) < 1e-5
    swapped = table.flip(0).contiguous()  # negative control: the rows read each other's blocks
    assert rel_err(slot_attention(q, keys, values, positions, kernel="triton", tree=tree, block_table=swapped),
                   ref) > 1e-2


def test_a_bad_table_is_refused():
    keys, values, table = paged(2, 2, 16, 4, 8)
    q = torch.randn(2, 1, 4, 16)
    with pytest.raises(ValueError, match="block_table must be int32"):
        slot_attention(q, keys, values, torch.zeros(2, 1, dtype=torch.long), block_table=table.long())
