"""A beam group's rows over the paged KV pool: the prompt's blocks forked by table, reorders as table edits,
copy-on-write where a beam extends a block other beams hold.

The group holds rows start .. start + w − 1 of a `kv_pool.KVPool` (their host block lists and table rows). Every
model's cache (the target's, a draft model's) lives in the same blocks, so one table edit moves a beam in all of
them; the target's `beam_slots.SlotTreeLM` makes the edits, a draft model's follows them (it only gathers its own
lengths). Sharing is the allocator's reference counts:

  fork       after the prompt is prefilled into the first row (by every model), the other rows take its blocks,
             one more holder each (lazily: at the first write or reorder, so each model's prefill lands first)
  reorder    row i continues row index[i]: its block list becomes a copy of that row's (shared), the old ones
             dropped — no K/V moves
  ensure     before a model writes positions [lo, hi) of a row: each block there the row does not hold yet is
             taken, and each it shares (count > 1) is copied first (every model's K/V of that block) and replaced
             in the row — so a shared block is never written

Blocks come from a stash taken at admission: the most distinct blocks the rows can ever hold (the prompt's full
blocks, never written and always shared, plus each row's own blocks up to the group's positions), so a running
group never meets an empty pool and is never preempted. A block a row drops while nobody else holds it returns to
the stash; `release` gives everything back. `KVPool.check` counts the stash as a holder.
"""

from __future__ import annotations

import torch

from specdec.engine.kv_pool import NULL_BLOCK, KVPool, PoolAccountingError, blocks_for

__all__ = ["BeamBlocks", "group_blocks"]


def group_blocks(prompt_positions: int, need: int, width: int, block_size: int) -> int:
    """The stash of a group of `width` rows whose prompt fills positions [0, prompt_positions) and whose rows reach
    `need` positions: the prompt's full blocks once, each row's others apiece."""
    full = prompt_positions // block_size
    return full + width * (blocks_for(need, block_size) - full)


class BeamBlocks:
    """Rows `start .. start + width − 1` of `pool` for one beam group (see the module doc). `caches`: every model's
    `PagedSlotCache` over the pool (a copied block is copied in each)."""

    def __init__(self, pool: KVPool, caches: list, start: int, width: int, prompt_positions: int, need: int):
        self.pool, self.caches, self.start, self.width = pool, caches, start, width
        self.size = pool.block_size
        for row in range(start, start + width):
            if pool.blocks[row]:
                raise PoolAccountingError(f"row {row} still holds {len(pool.blocks[row])} blocks")
        total = group_blocks(prompt_positions, need, width, self.size)
        stash = pool.allocator.allocate(total)
        if stash is None:
            raise RuntimeError(f"a beam group needs {total} free KV blocks, the pool has "
                               f"{pool.allocator.num_free_blocks} (admission checks this first)")
        self.stash = stash
        pool.stashes[start] = stash  # (held: `KVPool.check` counts it)
        self.forked = width == 1
        self.num_copies = 0  # blocks copied on write (statistics, tests)

    @property
    def rows(self) -> range:
        return range(self.start, self.start + self.width)

    def _sync(self) -> None:
        """The group's table rows from its host lists (one copy)."""
        table = torch.full((self.width, self.pool.max_blocks), NULL_BLOCK, dtype=torch.int32)
        for i, row in enumerate(self.rows):
            blocks = self.pool.blocks[row]
            table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        self.pool.table[self.start : self.start + self.width] = table.to(self.pool.table.device, non_blocking=True)

    def _take(self) -> int:
        return self.stash.pop()

    def _drop(self, block: int) -> None:
        """One holder (a row) fewer; the last one's block goes back to the stash."""
        if self.pool.allocator.ref_count(block) == 1:
            self.stash.append(block)
        else:
            self.pool.allocator.free([block])

    def _fork(self) -> None:
        first = self.pool.blocks[self.start]
        for row in self.rows[1:]:
            self.pool.blocks[row] = list(first)
            self.pool.allocator.share(first)
        self.forked = True

    def prefill_row(self, positions: int) -> None:
        """The first row holds blocks for positions [0, positions) (before the fork: its own)."""
        if self.forked and self.width > 1:
            raise RuntimeError("the prompt is prefilled before the group's rows fork")
        self._extend(self.start, 0, positions)
        self._sync()

    def _extend(self, row: int, lo: int, hi: int) -> None:
        blocks, allocator = self.pool.blocks[row], self.pool.allocator
        for j in range(lo // self.size, blocks_for(hi, self.size)):
            while j >= len(blocks):
                blocks.append(self._take())
            old = blocks[j]
            if allocator.ref_count(old) > 1:  # shared: copied before this row writes it
                new = self._take()
                for cache in self.caches:
                    cache.copy_block(old, new)
                allocator.free([old])
                blocks[j] = new
                self.num_copies += 1

    def ensure(self, lo: list[int], hi: list[int]) -> None:
        """Row start + i may write positions [lo[i], hi[i]): those blocks held and held by it alone."""
        if not self.forked:
            self._fork()
        for i, row in enumerate(self.rows):
            if hi[i] > lo[i]:
                self._extend(row, lo[i], hi[i])
        self._sync()

    def reorder(self, index: list[int]) -> None:
        """Row start + i continues row start + index[i] (a row may repeat): a table edit."""
        if not self.forked:
            self._fork()
        old = [self.pool.blocks[row] for row in self.rows]
        new = [list(old[i]) for i in index]
        for blocks in new:  # (shared first: a block kept by some row never reaches a count of 0)
            self.pool.allocator.share(blocks)
        for blocks in old:
            for b in blocks:
                self._drop(b)
        for row, blocks in zip(self.rows, new):
            self.pool.blocks[row] = blocks
        self._sync()

    def release(self) -> None:
        """Every row's blocks and the stash back to the pool."""
        for row in self.rows:
            self.pool.release(row)
        self.pool.allocator.free(self.stash)
        self.stash = []
        del self.pool.stashes[self.start]
