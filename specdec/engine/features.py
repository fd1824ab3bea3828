"""The target's stored features (its final-normed hidden state per committed position, what a feature head reads),
static per slot or paged like the KV caches.

`FeatureStore` is where the engine keeps them and the one way they are read and written (by positions `cols
[b, w]` of slots `rows`):
  static  `data [max_batch, capacity, dim]`: row r's position t is data[r, t]; it moves with its slot's state
  paged   `data [num_blocks · block_size, dim]` over a `kv_pool.KVPool`'s table, like the K/V: row r's position t is
          data[table[r, t // block_size] · block_size + t % block_size]; a row's move is the table's edit, and
          positions outside its blocks read and write the null block (their readers mask them)
"""

from __future__ import annotations

import torch

from specdec.sequences import write_rows

__all__ = ["FeatureStore"]


class FeatureStore:
    """Features of `dim` per (row, position); static when `pool` is None, else over the pool's blocks."""

    def __init__(self, max_batch: int, capacity: int, dim: int, dtype: torch.dtype, device: torch.device, pool=None):
        self.pool, self.dim = pool, dim
        if pool is None:
            self.data = torch.zeros(max_batch, capacity, dim, dtype=dtype, device=device)
        else:
            self.data = torch.zeros(pool.allocator.num_blocks * pool.block_size, dim, dtype=dtype, device=device)

    @classmethod
    def over(cls, data: torch.Tensor) -> "FeatureStore":
        """A static store over an existing `[max_batch, capacity, dim]` tensor."""
        store = cls.__new__(cls)
        store.pool, store.dim, store.data = None, data.shape[-1], data
        return store

    @staticmethod
    def nbytes_for(max_batch: int, capacity: int, dim: int, dtype: torch.dtype, pool=None) -> int:
        entries = max_batch * capacity if pool is None else pool.allocator.num_blocks * pool.block_size
        return entries * dim * dtype.itemsize

    def _flat(self, rows: slice, cols: torch.Tensor) -> torch.Tensor:
        """Pool entries `[b, w]` of positions `cols [b, w]` of `rows` (paged)."""
        size, table = self.pool.block_size, self.pool.table[rows]
        block = table.gather(1, (cols // size).clamp(0, table.shape[1] - 1)).long()
        return block * size + cols % size

    def read(self, rows: slice, cols: torch.Tensor) -> torch.Tensor:
        """Features at positions `cols [b, w]` (long, ≥ 0) of the slots `rows` → `[b, w, dim]`."""
        if self.pool is None:
            return self.data[rows].gather(1, cols[..., None].expand(-1, -1, self.dim))
        return self.data[self._flat(rows, cols)]

    def write(self, rows: slice, cols: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> None:
        """values `[b, w, dim]` at positions `cols [b, w]` where `valid [b, w]`; other entries keep what they hold
        (static: they rewrite their own value; paged: they write the null block)."""
        values = values.to(self.data.dtype)
        if self.pool is None:
            block = self.data[rows]  # [b, capacity, dim] view
            index = cols[..., None].expand(-1, -1, self.dim)
            block.scatter_(1, index, torch.where(valid[..., None], values, block.gather(1, index)))
            return
        flat = torch.where(valid, self._flat(rows, cols), torch.zeros_like(cols))
        self.data.index_copy_(0, flat.reshape(-1), values.reshape(-1, self.dim))

    def write_run(self, rows: slice, starts: torch.Tensor, values: torch.Tensor, counts: torch.Tensor) -> None:
        """The first `counts[b]` of `values [b, k, dim]` from position `starts[b]` on (a verify pass's committed
        prefix; `sequences.write_rows`' rule)."""
        if self.pool is None:
            write_rows(self.data[rows], starts, values, counts)
            return
        k = values.shape[1]
        arange = torch.arange(k, device=starts.device)[None, :]
        self.write(rows, (starts[:, None] + arange).clamp_min(0), values, arange < counts[:, None])
