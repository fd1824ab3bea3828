"""The paged pool's books (`engine/kv_pool.py`): blocks handed out and returned, shared with counts, the table a copy
of the rows' blocks, and the accounting check — which must name a deliberately leaked block (the negative control)
and a double free."""

import pytest
import torch

from specdec.engine.kv_pool import (CPU_DEFAULT_BUDGET, NULL_BLOCK, BlockAllocator, KVPool, PoolAccountingError,
                                     blocks_for, kv_budget, pool_blocks)


def test_allocate_free_and_share_keep_the_counts():
    pool = BlockAllocator(9, 16)  # 8 usable blocks
    assert pool.num_free_blocks == 8 and pool.usage == 0.0
    a = pool.allocate(5)
    assert len(a) == 5 and NULL_BLOCK not in a and pool.num_used_blocks == 5 and pool.usage == 5 / 8
    assert pool.allocate(4) is None and pool.num_free_blocks == 3  # too few: nothing taken
    pool.share(a[:2])  # a prefix held twice
    pool.check([a, a[:2]])
    pool.free(a)
    assert pool.num_free_blocks == 6  # the shared two stay with their second holder
    pool.check([a[:2]])
    pool.free(a[:2])
    pool.check([])
    assert pool.num_free_blocks == 8


def test_a_leaked_block_is_detected():
    pool = BlockAllocator(6, 16)
    held = pool.allocate(2)
    leaked = pool.allocate(1)  # taken, then forgotten by its holder
    pool.check([held, leaked])  # (the books balance while it is held)
    with pytest.raises(PoolAccountingError, match=rf"1 blocks leaked .*\[{leaked[0]}\]"):
        pool.check([held])


def test_a_double_free_and_a_miscount_are_detected():
    pool = BlockAllocator(6, 16)
    blocks = pool.allocate(2)
    pool.free(blocks)
    with pytest.raises(PoolAccountingError, match="double free"):
        pool.free(blocks[:1])
    again = pool.allocate(1)
    with pytest.raises(PoolAccountingError, match="other than their counts"):
        pool.check([again, again])  # two holders, a count of one


def test_rows_reserve_move_swap_and_release_through_the_table():
    pool = KVPool(num_blocks=11, block_size=4, max_batch=3, max_positions=20, device=torch.device("cpu"))
    assert pool.max_blocks == 5 and blocks_for(9, 4) == 3
    assert pool.reserve(0, 9) and len(pool.blocks[0]) == 3
    assert pool.reserve(0, 12) and len(pool.blocks[0]) == 3  # already held
    assert pool.reserve(1, 20) and len(pool.blocks[1]) == 5
    pool.check()
    assert not pool.reserve(2, 9) and pool.blocks[2] == []  # 2 free, 3 needed: nothing taken
    rows = [list(b) for b in pool.blocks]
    pool.move(1, 2)  # a table edit: no K/V copied
    assert pool.blocks[2] == rows[1] and pool.blocks[1] == []
    assert pool.table[2].tolist() == rows[1] and pool.table[1].tolist() == [NULL_BLOCK] * 5
    pool.swap(0, 2)
    assert pool.blocks[0] == rows[1] and pool.table[2, :3].tolist() == rows[0]
    pool.check()
    pool.release(0)
    pool.release(2)
    pool.check()
    assert pool.allocator.num_free_blocks == 10
    with pytest.raises(PoolAccountingError, match="release it first"):
        pool.reserve(0, 4), pool.reserve(1, 4), pool.move(0, 1)


def test_reservations_reach_the_device_table_in_one_flush():
    """A step's reservations are written together (`flush`); any read of `table` flushes first, so nothing reads a
    stale row — and without the flush the device table would still point at the null block (the control)."""
    pool = KVPool(num_blocks=11, block_size=4, max_batch=3, max_positions=20, device=torch.device("cpu"))
    assert pool.reserve(0, 5) and pool.reserve(1, 3) and pool.reserve(0, 9)
    assert pool._table.eq(NULL_BLOCK).all()  # (pending: the device table not yet written)
    assert len(pool._pending) == 4
    assert pool.table[0, :3].tolist() == pool.blocks[0] and pool.table[1, :1].tolist() == pool.blocks[1]
    assert not pool._pending
    pool.reserve(1, 8)
    pool.release(1)  # (a release after a pending reservation: flushed first, then the row is nulled)
    assert pool.table[1].tolist() == [NULL_BLOCK] * 5
    pool.check()


def test_the_budget_is_bytes_a_fraction_or_a_default():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kv_budget(1000, 10**12, 10**9, cpu) == 1000
    assert kv_budget(0.25, 10**12, 8 * 10**9, cpu) == 2 * 10**9
    assert kv_budget(None, 10**6, 10**9, cpu) == 10**6  # the static layout's bytes when they are few
    assert kv_budget(None, 10**12, 10**10, cpu) == CPU_DEFAULT_BUDGET  # at most 2 GiB on CPU
    assert kv_budget(None, 10**12, 10**9, cpu) == 10**9 // 2  # and half the free memory
    assert kv_budget(None, 10**12, 10**10, cuda) == int(0.9 * 10**10)
    with pytest.raises(ValueError, match="fraction of free memory"):
        kv_budget(0.5, 10**6, None, cpu)
    assert pool_blocks(10 * 64, 64, max_batch=2, max_blocks=3) == 7  # capped at every row's whole table + null
    with pytest.raises(ValueError, match=r"kv_cache_memory \(--kv-cache-memory\) of 100 bytes holds 1 KV blocks"):
        pool_blocks(100, 64, 2, 3)
