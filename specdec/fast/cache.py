"""The fast model's KV caches (see `specdec.fast.model` for slots, lengths and the junk slot): `KVCache`, per-row
static (row b's slot t is entry t of its own `[H_kv, S, D]`), and `PagedKVCache`, rows over a pool of fixed-size
blocks through a block table (`specdec.engine.kv_pool`). A forward reaches either through the same three calls:
`span` (positions a row's view has, the last the junk slot), `write_index` + `write` (K/V of the fed tokens into
their slots), `layer` (one layer's keys and values as `[B, H_kv, span, D]`) and `attention_inputs` (what
`kernels.attention.slot_attention` reads: those, or a paged layer's pools and block table). `place_tokens` is where
one forward's fed tokens go (positions, slots, the tree mask, the length move): one definition for every model body
the engine runs (`FastLlama`, the transformers backend)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.fast.kernels.attention import TreeMask
from specdec.fast.kernels.paged_index import paged_slots

__all__ = ["KVCache", "PagedKVCache", "TreeNodes", "Placement", "place_tokens", "round_up"]


@dataclass
class KVCache:
    """keys/values: one `[B, H_kv, S, D]` tensor per layer (slot S−1 is the junk slot); lengths `[B]`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @classmethod
    def zeros(cls, shape, batch_size: int, num_slots: int, *, device, dtype: torch.dtype) -> "KVCache":
        """A zeroed cache for a model of `shape` (its n_layers, n_kv_heads, head_dim) with at least `num_slots` usable
        slots per row (+1 junk slot, rounded up to 16: aligned for the fused attention kernels)."""
        size = (batch_size, shape.n_kv_heads, round_up(num_slots + 1, 16), shape.head_dim)
        make = lambda: torch.zeros(size, device=device, dtype=dtype)  # noqa: E731
        return cls([make() for _ in range(shape.n_layers)], [make() for _ in range(shape.n_layers)],
                   torch.zeros(batch_size, dtype=torch.long, device=device))

    @property
    def num_slots(self) -> int:
        """Usable slots (the junk slot excluded)."""
        return self.keys[0].shape[2] - 1

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def span(self) -> int:
        """Positions of a row's view, the junk slot included."""
        return self.keys[0].shape[2]

    def write_index(self, slots: torch.Tensor) -> torch.Tensor:
        """The scatter index of slots `[B, k]` (computed once per forward, used by every layer's `write`)."""
        batch, k = slots.shape
        heads, dim = self.keys[0].shape[1], self.keys[0].shape[3]
        return slots[:, None, :, None].expand(batch, heads, k, dim)

    def write(self, layer: int, index: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """key/value `[B, k, H_kv, D]` of the fed tokens into their slots (`index` from `write_index`)."""
        self.keys[layer].scatter_(2, index, key.transpose(1, 2))
        self.values[layer].scatter_(2, index, value.transpose(1, 2))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values `[B, H_kv, S, D]` of one layer."""
        return self.keys[layer], self.values[layer]

    def attention_inputs(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, None]:
        """What `kernels.attention.slot_attention` takes for one layer: keys, values, block_table (None here)."""
        return self.keys[layer], self.values[layer], None

    def fused_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """What `kernels.rope.rope_cache_write` takes as the slots `[B, k]` of the fed tokens (the slots here)."""
        return slots

    def fused_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys, values `[B, H_kv, S, D]` `rope_cache_write` writes at `fused_slots` (the layer's own here)."""
        return self.keys[layer], self.values[layer]

    def select_rows(self, index: torch.Tensor) -> "KVCache":
        return KVCache(
            [k.index_select(0, index) for k in self.keys],
            [v.index_select(0, index) for v in self.values],
            self.lengths.index_select(0, index),
        )


@dataclass
class PagedKVCache:
    """Rows over a block pool: keys/values one `[num_blocks, block_size, H_kv, D]` tensor per layer (vLLM's block
    layout), block_table `[B, max_blocks]` int32 (row b's position t in block table[b, t // block_size] at offset
    t % block_size), lengths `[B]`. A row's view spans max_blocks · block_size positions; its last is the junk slot,
    which maps to the null block (block 0, never a request's): padding writes there, and the mask never reads it.
    Entries of the table past a row's blocks point at the null block too (read only under the mask)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    block_table: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.keys[0].shape[1]

    @property
    def span(self) -> int:
        return self.block_table.shape[1] * self.block_size

    @property
    def num_slots(self) -> int:
        return self.span - 1

    @property
    def batch_size(self) -> int:
        return self.block_table.shape[0]

    def write_index(self, slots: torch.Tensor) -> torch.Tensor:
        """Flat pool entries `[B·k]` (block · block_size + offset) of slots `[B, k]`; the junk slot → the null block."""
        return paged_slots(self.block_table, slots, self.block_size).reshape(-1)  # (one launch on CUDA)

    def write(self, layer: int, index: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        heads, dim = key.shape[-2:]
        self.keys[layer].view(-1, heads, dim).index_copy_(0, index, key.reshape(-1, heads, dim))
        self.values[layer].view(-1, heads, dim).index_copy_(0, index, value.reshape(-1, heads, dim))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values `[B, H_kv, span, D]`: each row's blocks gathered in table order (a copy)."""
        batch, blocks = self.block_table.shape
        size, heads, dim = self.keys[layer].shape[1:]
        table = self.block_table.long()

        def gather(pool: torch.Tensor) -> torch.Tensor:
            return pool[table].view(batch, blocks * size, heads, dim).transpose(1, 2)

        return gather(self.keys[layer]), gather(self.values[layer])

    def attention_inputs(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's pools and the block table: `slot_attention(block_table=...)` reads through it (the Triton
        kernel) or gathers (the reference)."""
        return self.keys[layer], self.values[layer], self.block_table

    def fused_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Slots `[B, k]` → the flat pool entries `[B, k]` `rope_cache_write` writes (`write_index`'s)."""
        return self.write_index(slots).view(slots.shape)

    def fused_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's pools seen as `[B, H_kv, num_blocks · block_size, D]` with batch stride 0 (every row the
        whole pool, views, no copy): `rope_cache_write`'s kernel writes row b's token at its flat entry."""
        batch = self.batch_size

        def rows(pool: torch.Tensor) -> torch.Tensor:
            blocks, size, heads, dim = pool.shape
            return pool.as_strided((batch, heads, blocks * size, dim), (0, dim, heads * dim, 1), pool.storage_offset())

        return rows(self.keys[layer]), rows(self.values[layer])


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class TreeNodes:
    """k nodes of a token tree fed by one forward (`FastLlama.forward(tree=...)`). Node t of the tree lives in slot
    root + t of each row, root = cache.lengths − first, so the call writes nodes first..first + k − 1 at the row's
    usual slots lengths..lengths + k − 1; node t sits at position root + depth(t) and attends to the text below
    root and to its own path (`kernels.attention.TreeMask`).

    depths     [k] long: the fed nodes' depths (0 = the root); or `[B, k]`, each row its own tree
    ancestors  [k] int64: bit t set when node t is the fed node or one of its ancestors; or `[B, k]`
    """

    first: int
    depths: torch.Tensor
    ancestors: torch.Tensor

    def place(self, lengths: torch.Tensor, junk: int) -> tuple[torch.Tensor, torch.Tensor, TreeMask]:
        """→ positions `[B, k]` (RoPE), slots `[B, k]` (where K/V go; the attention bound), the `TreeMask`."""
        k, batch = self.depths.shape[-1], lengths.shape[0]
        root = lengths - self.first
        slots = (lengths[:, None] + torch.arange(k, device=lengths.device)[None, :]).clamp(max=junk)
        positions = root[:, None] + self.depths.expand(batch, k)
        return positions, slots, TreeMask(root, self.ancestors.expand(batch, k))


@dataclass(frozen=True)
class Placement:
    """Where one forward's k fed tokens go (`place_tokens`).

    positions  [B, k] long: each token's position (RoPE, a learned table), clamped to the junk slot
    slots      [B, k] long: the slot its K/V are written to (padding: the junk slot); a tree node's attention bound
    tree       the token tree's `TreeMask`, or None for a chain
    added      how far each row's length moves: k, or `[B]` long (each row's valid tokens)
    """

    positions: torch.Tensor
    slots: torch.Tensor
    tree: TreeMask | None
    added: int | torch.Tensor


def place_tokens(lengths: torch.Tensor, k: int, junk: int, valid: torch.Tensor | None = None,
                 tree: TreeNodes | None = None) -> Placement:
    """k tokens fed to rows of `lengths [B]` (see `specdec.fast.model`): a chain at slots lengths..lengths + k − 1
    (past the end: the junk slot `junk`; callers size the cache so that never happens); with valid `[B, k]` bool each
    row's valid tokens written contiguously from its length, padding to the junk slot; or the nodes of `tree`."""
    tree_mask, added = None, k
    if tree is not None:
        positions, slots, tree_mask = tree.place(lengths, junk)
    elif valid is None:
        positions = lengths[:, None] + torch.arange(k, device=lengths.device)[None, :]
        slots = positions.clamp(max=junk)
    else:
        valid_long = valid.long()
        positions = (lengths[:, None] + valid_long.cumsum(1) - 1).clamp_min(0)
        slots = torch.where(valid, positions.clamp(max=junk), torch.full_like(positions, junk))
        added = valid_long.sum(1)
    return Placement(positions.clamp(max=junk), slots, tree_mask, added)
