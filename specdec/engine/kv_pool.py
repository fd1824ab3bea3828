"""The paged KV pool (`EngineConfig(kv_layout="paged")`): fixed-size blocks of positions shared by every request.

Terms (vLLM's):
  block        `block_size` consecutive positions of one request (16 by default); block b of the pool holds them in
               every model's cache at once (`PagedSlotCache`: the target's, a cached drafter's), so one table
               serves them all and each model's blocks are sized by its own shape
  block table  `[max_batch, max_blocks]` int32 on the device: row r's position t lives in block
               table[r, t // block_size] at offset t % block_size; entries past a row's blocks are the null block
  null block   block 0, never handed out: padding tokens write there and unused table entries point there (read
               only under the attention mask)

`BlockAllocator` owns which blocks are free (a reference count per block, ready for blocks shared by several
requests: a prefix cache) in two lists, each in order of release: free blocks that hold nothing anyone may ask for,
handed out first, and free blocks a prefix cache names, handed out (evicted) only when the first list is empty,
least recently released first; `KVPool` owns the table and which blocks each row holds (host lists, the
table their device copy). Rollback is a length move (blocks stay with the row); moving a request between rows
is a table-row edit (`move`, `swap`), never a K/V copy; `release` returns a row's blocks. `check` is the
accounting: every block is free or held, as many times as its count says (a leak or a double free is named).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import torch

from specdec.fast.cache import PagedKVCache

__all__ = ["BlockAllocator", "KVPool", "PagedSlotCache", "PoolAccountingError", "NULL_BLOCK", "blocks_for",
           "kv_budget", "pool_blocks"]

NULL_BLOCK = 0


class PoolAccountingError(RuntimeError):
    """The pool's books do not balance: a block leaked (held by nobody, not free) or was freed twice."""


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks that hold positions [0, positions)."""
    return -(-max(int(positions), 0) // block_size)


class BlockAllocator:
    """Free lists over blocks 1..num_blocks−1 (block 0 is the null block) with a reference count per block: the
    plain free list, and the cached one (free blocks for which `cached(block)` held when they were freed: a prefix
    cache's), handed out only once the plain one is empty, least recently released first."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"the KV pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self._free: deque[int] = deque(range(1, self.num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # free and cached, oldest release first
        self._refs = [0] * self.num_blocks
        self.evict = None  # a prefix cache's hook: called with blocks handed out again (`engine/prefix_cache.py`)
        self.cached = None  # a prefix cache's test: whether a block being freed is in its index

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._cached)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks a prefix cache names (handed out only when no other block is free)."""
        return len(self._cached)

    def uncache(self) -> None:
        """The prefix cache forgot every block (`PrefixCache.reset`): its free ones join the plain free list."""
        self._free.extend(self._cached)
        self._cached.clear()

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can hold (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of the usable blocks held, in [0, 1] (vLLM's `kv_cache_usage_perc` is this fraction)."""
        return self.num_used_blocks / self.num_usable_blocks

    def allocate(self, n: int) -> list[int] | None:
        """n free blocks (reference count 1 each), or None (nothing taken) when fewer than n are free: the plain
        free list's first, then cached ones, least recently released first (evicted: `evict`)."""
        if n > self.num_free_blocks:
            return None
        plain = min(n, len(self._free))
        blocks = [self._free.popleft() for _ in range(plain)]
        blocks += [self._cached.popitem(last=False)[0] for _ in range(n - plain)]
        for b in blocks:
            self._refs[b] = 1
        if self.evict is not None:  # (the index forgets them: overwritten now)
            self.evict(blocks)
        return blocks

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def touch(self, blocks: list[int]) -> None:
        """One more holder of each block, a free one (cached, unreferenced) taken off its free list (a prefix hit)."""
        for b in blocks:
            if self._refs[b] == 0:
                if b in self._cached:
                    del self._cached[b]
                else:  # (a scan of the plain list: never a hit's case)
                    self._free.remove(b)
            self._refs[b] += 1

    def share(self, blocks: list[int]) -> None:
        """One more holder of each block (a prefix shared by another request)."""
        for b in blocks:
            if self._refs[b] <= 0:
                raise PoolAccountingError(f"block {b} is shared while free")
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        """One holder fewer of each block; a block nobody holds goes back to the free list."""
        for b in blocks:
            if b == NULL_BLOCK or self._refs[b] <= 0:
                raise PoolAccountingError(f"block {b} freed but not held (a double free)")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if self.cached is not None and self.cached(b):
                    self._cached[b] = None
                else:
                    self._free.append(b)

    def check(self, holders: list[list[int]]) -> None:
        """The books balance for these holders' blocks (each list one holder's): every block is free xor held, and
        held as many times as its count; raises `PoolAccountingError` naming the blocks otherwise."""
        held = [0] * self.num_blocks
        for blocks in holders:
            for b in blocks:
                held[b] += 1
        free = set(self._free) | set(self._cached)
        if len(free) != self.num_free_blocks or NULL_BLOCK in free:
            raise PoolAccountingError("the free lists hold a block twice or the null block")
        leaked = [b for b in range(1, self.num_blocks) if b not in free and held[b] == 0]
        if leaked:
            raise PoolAccountingError(f"{len(leaked)} blocks leaked (neither free nor held): {leaked[:16]}")
        wrong = [b for b in range(1, self.num_blocks) if held[b] != self._refs[b] or (b in free and held[b])]
        if wrong:
            raise PoolAccountingError(f"blocks held a number of times other than their counts: {wrong[:16]}")


def _to_device(blocks: list[int], device: torch.device) -> torch.Tensor:
    """Block ids as an int32 tensor on `device`, copied without a stream synchronization (a pageable source is
    consumed before the copy call returns; a blocking copy would wait for the device at every new block)."""
    return torch.tensor(blocks, dtype=torch.int32).to(device, non_blocking=True)


class KVPool:
    """Block tables for `max_batch` rows over one `BlockAllocator`: `table [max_batch, max_blocks]` int32 on
    `device`, and each row's blocks on the host (`blocks[row]`)."""

    def __init__(self, num_blocks: int, block_size: int, max_batch: int, max_positions: int, device: torch.device):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = int(block_size)
        self.max_blocks = blocks_for(max_positions, block_size)
        self._table = torch.full((max_batch, self.max_blocks), NULL_BLOCK, dtype=torch.int32, device=device)
        self._pending: list[tuple[int, int, int]] = []  # (row, column, block) reserved, not yet in the device table
        self.blocks: list[list[int]] = [[] for _ in range(max_batch)]
        self.num_preemptions = 0  # requests whose blocks were taken back to make room (engine's count)
        self.stashes: dict[int, list[int]] = {}  # blocks held for a beam group's rows, by its first row (beam_blocks)

    @property
    def table(self) -> torch.Tensor:
        """`[max_batch, max_blocks]` int32 on the device, every reservation written (see `flush`)."""
        self.flush()
        return self._table

    def flush(self) -> None:
        """Write the blocks `reserve` handed out since the last flush into the device table, in one transfer: a step
        reserves a block for each row crossing a block boundary (at batch 64, several a step), and one copy per
        block cost the step more host time than the paged attention saved. Every read of `table` flushes first; the
        engine flushes before a step whose CUDA graph reads the table by address (`admission.reserve_blocks`)."""
        if self._pending:
            rows, cols, ids = torch.tensor(self._pending, dtype=torch.int64).T.to(self._table.device, non_blocking=True)
            self._pending.clear()
            self._table[rows, cols] = ids.to(torch.int32)

    @property
    def num_positions(self) -> int:
        """Positions one row's table spans (the last of them is the row's junk slot, see `fast.cache.PagedKVCache`)."""
        return self.max_blocks * self.block_size

    def blocks_needed(self, row: int, positions: int) -> int:
        """Blocks row must still take to hold positions [0, positions)."""
        return max(blocks_for(min(positions, self.num_positions), self.block_size) - len(self.blocks[row]), 0)

    def reserve(self, row: int, positions: int) -> bool:
        """Give `row` blocks for positions [0, positions) (capped at the table's span); False (nothing taken) when
        the pool has too few free blocks."""
        n = self.blocks_needed(row, positions)
        if n == 0:
            return True
        new = self.allocator.allocate(n)
        if new is None:
            return False
        have = len(self.blocks[row])
        self.blocks[row].extend(new)
        self._pending.extend((row, have + i, block) for i, block in enumerate(new))
        return True

    def share_row(self, row: int, blocks: list[int], owned: list[int] = ()) -> None:
        """Row (holding none) starts with these blocks, one more holder of each (a prefix cache's hit), then the
        `owned` ones (already held for it: a hit's copies)."""
        if self.blocks[row]:
            raise PoolAccountingError(f"row {row} still holds {len(self.blocks[row])} blocks: release it first")
        self.allocator.touch(blocks)
        blocks = list(blocks) + list(owned)
        self.blocks[row] = blocks
        self.table[row, : len(blocks)] = _to_device(blocks, self.table.device)

    def release(self, row: int) -> None:
        """Return row's blocks to the pool, last first (a prefix cache evicts a text's tail before its head); its
        table row points at the null block again."""
        if self.blocks[row]:
            self.allocator.free(self.blocks[row][::-1])
            self.blocks[row] = []
            self.table[row].fill_(NULL_BLOCK)

    def move(self, src: int, dst: int) -> None:
        """Row `src`'s blocks become row `dst`'s (dst holds none); src holds none after."""
        if self.blocks[dst]:
            raise PoolAccountingError(f"row {dst} still holds {len(self.blocks[dst])} blocks: release it first")
        self.blocks[dst], self.blocks[src] = self.blocks[src], []
        self.table[dst] = self.table[src]
        self.table[src].fill_(NULL_BLOCK)

    def swap(self, a: int, b: int) -> None:
        self.blocks[a], self.blocks[b] = self.blocks[b], self.blocks[a]
        self.table[[a, b]] = self.table[[b, a]]

    def check(self) -> None:
        """`BlockAllocator.check` over every row's blocks and every beam group's stash, and the table equal to the
        rows' blocks."""
        self.allocator.check(self.blocks + list(self.stashes.values()))
        host = torch.full(self.table.shape, NULL_BLOCK, dtype=torch.int32)
        for row, blocks in enumerate(self.blocks):
            host[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        if not torch.equal(host, self.table.cpu()):
            raise PoolAccountingError("the device block table differs from the rows' blocks")


class PagedSlotCache:
    """One model's K/V blocks over a `KVPool`'s tables: `SlotCache`'s interface for the engine (`view`, `lengths`,
    `num_positions`, `nbytes`, `allocate`), keys/values `[L, num_blocks, block_size, H_kv, D]`. Rows are moved by
    the pool (`KVPool.move`, a table edit, once for every model); `move` / `swap` here move the write lengths."""

    def __init__(self, model, pool: KVPool):
        s = model.shape
        self.pool = pool
        self.num_positions = pool.num_positions
        self.size = (s.n_layers, pool.allocator.num_blocks, pool.block_size, s.n_kv_heads, s.head_dim)
        self._device, self._dtype = model.device, model.dtype
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.lengths = torch.zeros(pool.table.shape[0], dtype=torch.long, device=model.device)

    keys = property(lambda self: self._keys)  # [L, num_blocks, block_size, H_kv, D] (None until allocated)
    values = property(lambda self: self._values)

    @staticmethod
    def block_bytes(model, block_size: int) -> int:
        """Bytes one block of `model`'s keys and values takes (every layer)."""
        s = model.shape
        return 2 * s.n_layers * block_size * s.n_kv_heads * s.head_dim * model.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return 2 * math.prod(self.size) * self._dtype.itemsize

    def allocate(self) -> None:
        if self._keys is None:
            self._keys = torch.zeros(self.size, device=self._device, dtype=self._dtype)
            self._values = torch.zeros(self.size, device=self._device, dtype=self._dtype)

    def view(self, rows: slice, num_positions: int) -> PagedKVCache:
        """Rows `rows` over their first `num_positions` positions (a multiple of the block size; the last is the
        junk slot) → a `fast.cache.PagedKVCache`."""
        self.allocate()
        blocks = blocks_for(num_positions, self.pool.block_size)
        return PagedKVCache(list(self._keys.unbind(0)), list(self._values.unbind(0)), self.lengths[rows],
                            self.pool.table[rows, :blocks])

    def move(self, src: int, dst: int, num_positions: int | None = None) -> None:
        self.lengths[dst] = self.lengths[src]

    def copy_block(self, src: int, dst: int) -> None:
        """Block `src`'s keys and values into block `dst` (a prefix cache's copy-on-write)."""
        self.allocate()
        self._keys[:, dst] = self._keys[:, src]
        self._values[:, dst] = self._values[:, src]

    def swap(self, a: int, b: int, num_positions: int | None = None) -> None:
        self.lengths[[a, b]] = self.lengths[[b, a]]

    def copy_positions(self, rows: slice, num_positions: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Each row's positions src `[b, k]` into its positions dst `[b, k]`, every layer, keys and values: a gather
        then a scatter over the pool's flat entries through the block table (a token tree's accepted path into
        chain order). Reads all before writing, so a row may read positions it also writes."""
        view = self.view(rows, num_positions)
        src, dst = view.write_index(src), view.write_index(dst)  # flat pool entries [b·k]
        for pool in (self._keys, self._values):
            flat = pool.view(pool.shape[0], -1, *pool.shape[3:])  # [L, num_blocks · block_size, H_kv, D]
            flat.index_copy_(1, dst, flat.index_select(1, src))


def pool_blocks(budget: int, block_bytes: int, max_batch: int, max_blocks: int) -> int:
    """Blocks (the null block included) a byte budget buys at `block_bytes` a block, at most what every row's whole
    table needs; a ValueError naming `kv_cache_memory` when it buys fewer than one row's worth of one block."""
    blocks = int(budget) // block_bytes
    if blocks < 2:
        raise ValueError(f"kv_cache_memory (--kv-cache-memory) of {int(budget)} bytes holds {blocks} KV blocks of "
                         f"{block_bytes} bytes; the paged pool needs at least 2 (one is the null block)")
    return min(blocks, max_batch * max_blocks + 1)


CPU_DEFAULT_BUDGET = 2 << 30  # bytes: the paged pool's default on CPU (vLLM's CPU backend: VLLM_CPU_KVCACHE_SPACE)
CUDA_DEFAULT_FRACTION = 0.9  # of the free memory (vLLM's gpu_memory_utilization default)


def kv_budget(kv_cache_memory: int | float | None, static_bytes: int, free: int | None,
              device: torch.device | None = None) -> int:
    """The pool's bytes: an int is bytes; a float in (0, 1] that fraction of the free memory (vLLM's
    gpu_memory_utilization, of what is free now); None = what the static layout would take (every slot's whole
    context), at most `CUDA_DEFAULT_FRACTION` of the free memory on CUDA, and on CPU at most `CPU_DEFAULT_BUDGET`
    and half the free memory."""
    if isinstance(kv_cache_memory, float):
        if free is None:
            raise ValueError(f"kv_cache_memory={kv_cache_memory} is a fraction of free memory, which this device "
                             "does not report: give bytes")
        return int(kv_cache_memory * free)
    if kv_cache_memory is not None:
        return int(kv_cache_memory)
    if device is not None and torch.device(device).type == "cuda":
        return static_bytes if free is None else min(static_bytes, int(CUDA_DEFAULT_FRACTION * free))
    return min(static_bytes, CPU_DEFAULT_BUDGET, (free // 2) if free is not None else CPU_DEFAULT_BUDGET)


def paged_caches(cache, draft_cache, feature_dim: int, config, max_batch: int
                 ) -> tuple[KVPool, PagedSlotCache, PagedSlotCache | None]:
    """kv_layout="paged": the engine's pool (`config.kv_cache_memory`, `config.block_size`) and the target's and a
    cached drafter's caches over it, in place of their static `SlotCache`s (`cache`, `draft_cache` or None — a
    hierarchy's `slot_group.CacheGroup` one per model; sized, never allocated). One block holds the same positions
    of all and of the stored target features (`feature_dim` per position, 0 = none), so a block's bytes are theirs
    together; the default budget is the static layout's."""
    from specdec.engine import memory  # (looked up at call: tests replace `available_memory`)

    size, num_positions = config.block_size, cache.num_positions
    drafts = [] if draft_cache is None else list(getattr(draft_cache, "parts", [draft_cache]))  # (a `CacheGroup`)
    models = [cache.model] + [c.model for c in drafts]
    feature_bytes = feature_dim * cache.model.dtype.itemsize  # (the target's dtype: `FeatureStore`)
    static = sum(c.nbytes for c in [cache, *drafts]) + max_batch * num_positions * feature_bytes
    block_bytes = sum(PagedSlotCache.block_bytes(m, size) for m in models) + size * feature_bytes
    static += block_bytes  # (the null block: every row's whole context, as the static layout holds, still fits)
    budget = kv_budget(config.kv_cache_memory, static, memory.available_memory(cache.model.device), cache.model.device)
    num_blocks = pool_blocks(budget, block_bytes, max_batch, num_positions // size)
    agree = getattr(cache.model, "all_ranks_min", None)  # a tensor-parallel shard: every rank the same pool
    if agree is not None:
        num_blocks = agree(num_blocks)
    pool = KVPool(num_blocks, size, max_batch, num_positions, cache.model.device)
    paged = [PagedSlotCache(m, pool) for m in models[1:]]  # (a hierarchy's group: one per model, the same blocks)
    draft = None if draft_cache is None else draft_cache.with_parts(paged) if hasattr(draft_cache, "parts") else paged[0]
    return pool, PagedSlotCache(models[0], pool), draft
