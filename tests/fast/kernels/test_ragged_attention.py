"""Varlen paged attention (`kernels.ragged_attention`): the torch reference equals `slot_attention` row by row over
the row's blocks (its definition), the Triton kernel (Triton's interpreter on CPU) equals the reference for mixed
query counts, page sizes, grouped heads, windows and soft-caps, never reading a block no row's table names (NaN
there); the bitwise mode's path gives each query the same bits in any mix; a mask one position off differs."""

import dataclasses

import pytest
import torch

from specdec.fast.kernels.attention import slot_attention
from specdec.fast.kernels.invariant import invariant_attention
from specdec.fast.kernels.ragged_attention import RaggedLayout, ragged_attention


def layout_for(counts, starts, page, num_blocks, seed=0, width=None):
    """A layout whose rows hold scrambled blocks of a pool; returns it and the blocks no row holds."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-(s + c) // page) for s, c in zip(starts, counts)]
    width = width or max(need)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(counts), width, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    query_start = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    positions = torch.cat([torch.arange(s, s + c) for s, c in zip(starts, counts)])
    return RaggedLayout(tuple(counts), tuple(starts), query_start, positions, table), order


def pools(num_blocks, page, kv_heads, dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_blocks, page, kv_heads, dim, generator=gen),
            torch.randn(num_blocks, page, kv_heads, dim, generator=gen))


def rel_err(out, ref):
    return ((out - ref).norm() / ref.norm()).item()


COUNTS = [(5, 1, 3, 17, 1), (0, 13, 7, 15, 40)]  # prefill chunks (5, 17: the second past its start), decode rows;
# (the fourth row ends at 32: it fills its blocks to the last position)


@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (None, 3.0), (5, 2.0)])
def test_reference_is_slot_attention_row_by_row(window, softcap):
    counts, starts = COUNTS
    page, heads, kv_heads, dim = 4, 4, 2, 16
    lay, _ = layout_for(counts, starts, page, 64)
    keys, values = pools(64, page, kv_heads, dim)
    q = torch.randn(sum(counts), heads, dim, generator=torch.Generator().manual_seed(1))
    out = ragged_attention(q, keys, values, lay, 0.3, window=window, softcap=softcap, kernel="reference")
    first = lay.query_start.tolist()
    for b in range(len(counts)):
        rows = slice(first[b], first[b + 1])
        want = slot_attention(q[None, rows], keys, values, lay.positions[None, rows], 0.3, window=window,
                              softcap=softcap, kernel="reference", block_table=lay.block_table[b : b + 1])[0]
        torch.testing.assert_close(out[rows], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("page", [4, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 1), (2, 2), (12, 2)])
@pytest.mark.parametrize("window,softcap", [(None, None), (7, None), (None, 4.0), (5, 2.0)])
def test_triton_kernel_matches_the_reference(page, heads, kv_heads, window, softcap):
    pytest.importorskip("triton")
    counts, starts = COUNTS
    num_blocks = 80
    lay, unused = layout_for(counts, starts, page, num_blocks, seed=page + heads, width=64 // page)
    keys, values = pools(num_blocks, page, kv_heads, 16, seed=heads)
    ref = ragged_attention(q := torch.randn(sum(counts), heads, 16), keys, values, lay, window=window,
                           softcap=softcap, kernel="reference")
    keys[unused], values[unused] = float("nan"), float("nan")  # (the reference gathered before: the kernel must
    keys[0], values[0] = float("nan"), float("nan")  # never read a block no row holds, nor the null block)
    out = ragged_attention(q, keys, values, lay, window=window, softcap=softcap, kernel="triton")
    assert not ref.isnan().any() and rel_err(out, ref) < 1e-5


def test_triton_kernel_half_precision_and_long_chunks():
    pytest.importorskip("triton")
    counts, starts = (70, 1, 2), (3, 90, 10)  # a chunk longer than one tile of query rows
    lay, _ = layout_for(counts, starts, 16, 20, seed=4)
    keys, values = pools(20, 16, 2, 32, seed=2)
    q = torch.randn(sum(counts), 8, 32)
    ref = ragged_attention(q, keys, values, lay, kernel="reference")
    half = torch.float16  # (the interpreter's bfloat16 is not numpy's: bf16 runs in the GPU test)
    out = ragged_attention(q.to(half), keys.to(half), values.to(half), lay, kernel="triton")
    assert out.dtype == half and rel_err(out.float(), ref) < 2e-3
    assert rel_err(ragged_attention(q, keys, values, lay, kernel="triton"), ref) < 1e-5


def test_fixed_launches_with_unused_tiles_and_empty_rows_equal_the_reference():
    """A bounded batch's launches (`RaggedLayout.launches`, the mixed step's CUDA graphs): rows of no token, one
    tile size for the chunks however short, and unused tiles (past every row: their programs exit) give the
    reference's output; a launch missing a row's tile leaves that row unwritten (the control)."""
    pytest.importorskip("triton")
    from specdec.engine.mixed_shapes import UNUSED_TILE

    counts, starts = (3, 3, 0, 20, 2, 0), (9, 30, 0, 5, 40, 0)
    lay, _ = layout_for(counts, starts, 4, 60, seed=3, width=16)
    keys, values = pools(60, 4, 2, 16, seed=5)
    q = torch.randn(sum(counts), 4, 16, generator=torch.Generator().manual_seed(2))
    ref = ragged_attention(q, keys, values, lay, 0.4, kernel="reference")

    def tiles(pairs):
        return torch.tensor(pairs, dtype=torch.int32).view(-1, 2)
    short = tiles([(0, 0), (1, 0)])  # 2 · 3 query rows: one 16-row tile each
    chunks = [(3, 0), (3, 1), (4, 0)] + [(0, UNUSED_TILE)] * 3  # 32-row tiles: row 3's 40 query rows take two
    fixed = dataclasses.replace(lay, launches=((short, 16), (tiles(chunks), 32)), _memo={})
    out = ragged_attention(q, keys, values, fixed, 0.4, kernel="triton")
    assert rel_err(out, ref) < 1e-5
    missing = dataclasses.replace(lay, launches=((short, 16), (tiles(chunks[:1] + chunks[2:]), 32)), _memo={})
    rows = slice(6 + 16, 6 + 20)  # row 3's query rows 32..39 (its tokens 16..19) sit in its second tile
    bad = ragged_attention(q, keys, values, missing, 0.4, kernel="triton")
    assert not torch.allclose(bad[rows], ref[rows]) and torch.allclose(bad[:rows.start], ref[:rows.start], atol=1e-5)


def test_invariant_path_is_the_same_bits_in_any_mix():
    """Under `invariant=True` a row's outputs do not depend on the rows beside it (nor on where its blocks are)."""
    page, heads, kv_heads, dim = 4, 4, 2, 16
    counts, starts = COUNTS
    lay, _ = layout_for(counts, starts, page, 64)
    keys, values = pools(64, page, kv_heads, dim)
    q = torch.randn(sum(counts), heads, dim)
    out = ragged_attention(q, keys, values, lay, invariant=True, window=6)
    first = lay.query_start.tolist()
    for b in range(len(counts)):
        rows = slice(first[b], first[b + 1])
        one = RaggedLayout((counts[b],), (starts[b],), torch.tensor([0, counts[b]], dtype=torch.int32),
                           lay.positions[rows], lay.block_table[b : b + 1])
        assert torch.equal(ragged_attention(q[rows], keys, values, one, invariant=True, window=6), out[rows])
        gathered = keys[lay.block_table[b].long()].flatten(0, 1).transpose(0, 1)[None]
        v_rows = values[lay.block_table[b].long()].flatten(0, 1).transpose(0, 1)[None]
        want = invariant_attention(q[None, rows], gathered, v_rows, lay.positions[None, rows], window=6)[0]
        assert torch.equal(out[rows], want)


def test_a_mask_one_position_off_differs():
    """Negative control: each query seeing one slot past its position is not the causal result."""
    counts, starts = COUNTS
    lay, _ = layout_for(counts, starts, 4, 64)
    keys, values = pools(64, 4, 2, 16)
    q = torch.randn(sum(counts), 4, 16)
    good = ragged_attention(q, keys, values, lay, kernel="reference")
    off = dataclasses.replace(lay, positions=lay.positions + 1, _memo={})
    assert not torch.allclose(ragged_attention(q, keys, values, off, kernel="reference"), good, atol=1e-3)


def test_bad_arguments_are_named():
    lay, _ = layout_for((2, 1), (0, 3), 4, 8)
    keys, values = pools(8, 4, 2, 16)
    with pytest.raises(ValueError, match="q must be"):
        ragged_attention(torch.randn(4, 4, 16), keys, values, lay)
    with pytest.raises(ValueError, match="kernel"):
        ragged_attention(torch.randn(3, 4, 16), keys, values, lay, kernel="fast")
    with pytest.raises(ValueError, match="window"):
        ragged_attention(torch.randn(3, 4, 16), keys, values, lay, window=0)
    with pytest.raises(ValueError, match="pools"):
        ragged_attention(torch.randn(3, 3, 16), keys, values, lay)
    with pytest.raises(ValueError, match="softcap"):
        ragged_attention(torch.randn(3, 4, 16), keys, values, lay, softcap=2.0, invariant=True)
