"""The block table's flat pool entries in one launch (`fast.kernels.paged_index`) equal their torch definition
(CPU: Triton's interpreter; GPU: compiled, and replayed in a CUDA graph)."""

import pytest
import torch

from specdec.fast.kernels.paged_index import paged_slots, paged_slots_reference

triton = pytest.importorskip("triton")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (without CUDA, conftest runs Triton's interpreter)


def _case(batch: int, cols: int, k: int, size: int, device=DEVICE, seed: int = 0):
    """A table view with a row stride wider than its columns (as `PagedSlotCache.view` cuts it), block ids > 0,
    and slots covering every offset, the junk slot (span − 1) and positions past the span."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randint(1, 1000, (batch + 2, cols + 3), generator=g, dtype=torch.int32)
    table = full.to(device)[1 : batch + 1, :cols]
    span = cols * size
    slots = torch.randint(0, span + 4, (batch, k), generator=g)
    slots[:, 0] = span - 1  # the junk slot
    if k > 1:
        slots[:, 1] = 0
    return table, slots.to(device)


@pytest.mark.parametrize("batch,cols,k,size", [(1, 1, 1, 16), (3, 5, 5, 16), (8, 9, 17, 8), (2, 4, 33, 32)])
def test_kernel_matches_the_definition(batch, cols, k, size):
    table, slots = _case(batch, cols, k, size)
    ref = paged_slots_reference(table, slots, size)
    out = paged_slots(table, slots, size, kernel="triton")
    assert out.dtype == torch.long and out.shape == slots.shape
    assert torch.equal(out, ref)
    assert torch.equal(paged_slots(table, slots, size, kernel="reference"), ref)


def test_the_comparison_sees_a_lost_junk_mapping():
    """Negative control: entries computed without sending the junk slot to the null block differ from the kernel's."""
    table, slots = _case(3, 5, 5, 16)
    wrong = table.gather(1, (slots // 16).clamp(max=4)).long() * 16 + slots % 16
    assert not torch.equal(paged_slots(table, slots, 16, kernel="triton"), wrong)


def test_the_definition_is_the_caches_rule():
    """`PagedKVCache.write_index` (the caches' writes) is these entries, flattened."""
    from specdec.fast.cache import PagedKVCache

    table, slots = _case(2, 3, 4, 16, device="cpu")
    pool = [torch.zeros(1000, 16, 1, 2)]
    cache = PagedKVCache(pool, pool, torch.zeros(2, dtype=torch.long), table)
    assert torch.equal(cache.write_index(slots), paged_slots_reference(table, slots, 16).reshape(-1))


def test_bad_shapes_are_refused():
    table, slots = _case(2, 3, 4, 16)
    with pytest.raises(ValueError, match="table \\[B, C\\] and slots \\[B, k\\]"):
        paged_slots(table, slots[:1], 16)


@pytest.mark.gpu
@needs_cuda
def test_cuda_auto_and_graph_replay_match_the_definition():
    table, slots = _case(8, 9, 5, 16, device="cuda")
    assert torch.equal(paged_slots(table, slots, 16), paged_slots_reference(table, slots, 16))
    static = slots.clone()
    graph = torch.cuda.CUDAGraph()
    paged_slots(table, static, 16)  # warm (compiles before the capture)
    with torch.cuda.graph(graph):
        out = paged_slots(table, static, 16)
    _, fresh = _case(8, 9, 5, 16, device="cuda", seed=1)
    static.copy_(fresh)
    graph.replay()
    assert torch.equal(out, paged_slots_reference(table, fresh, 16))
