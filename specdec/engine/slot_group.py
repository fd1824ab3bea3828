"""Several draft models' slot states as the engine's one cached drafter: a `HierarchicalDrafter` whose inner drafter
holds a model (a model drafter, another hierarchy) keeps a slot cache per model (`engine.hierarchy`).

The engine knows one drafter cache (`drafters.protocol.CachedSlotDrafter`: `cache`, `prefill`, `prefill_ragged`). A
`SlotGroup` is that drafter's state over the `SlotModel`s of every model in the hierarchy, middle model first; its
`cache` is a `CacheGroup` of their caches, which does to each what the engine does to a drafter cache — allocate,
move and swap a slot's row, copy a prefix-cache block (`engine.prefix_cache`), and on the paged pool
(`engine.kv_pool.paged_caches`) one `PagedSlotCache` per model over the same blocks — so every model is prefilled at
admission, caught up after plain steps and moved with its row exactly as a model drafter's one cache is.
"""

from __future__ import annotations

__all__ = ["CacheGroup", "SlotGroup"]


class CacheGroup:
    """The slot caches (`engine.slots.SlotCache` or `engine.kv_pool.PagedSlotCache`) of several draft models, the
    first the middle model's, as the engine's one drafter cache."""

    def __init__(self, parts):
        self.parts = tuple(parts)
        if not self.parts:
            raise ValueError("CacheGroup needs at least one cache")

    def with_parts(self, parts) -> "CacheGroup":
        """The same group over other caches (the paged pool's, one per model, in this order)."""
        return CacheGroup(parts)

    @property
    def model(self):
        return self.parts[0].model

    @property
    def num_positions(self) -> int:
        return self.parts[0].num_positions

    @property
    def lengths_all(self) -> list:
        """Every cache's lengths `[max_batch]` (what a warm-up run puts back)."""
        return [c.lengths for c in self.parts]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.parts)

    def allocate(self) -> None:
        for c in self.parts:
            c.allocate()

    def move(self, src: int, dst: int, num_positions: int | None = None) -> None:
        for c in self.parts:
            c.move(src, dst, num_positions)

    def swap(self, a: int, b: int, num_positions: int | None = None) -> None:
        for c in self.parts:
            c.swap(a, b, num_positions)

    def copy_block(self, src: int, dst: int) -> None:
        for c in self.parts:
            c.copy_block(src, dst)


class SlotGroup:
    """The engine's state of a hierarchy over models: `states`, the `SlotModel` of each (middle model first), fed
    together; `model` is the middle model's (what the engine sizes and keys the drafter by)."""

    on_engine = True

    def __init__(self, states):
        self.states = list(states)
        self.vocab_size = self.states[0].vocab_size
        for s in self.states[1:]:  # (the runner builds the middle model's RoPE tables; these are built here)
            s.model.rope_tables(s.cache.num_positions)

    @property
    def model(self):
        return self.states[0].model

    @property
    def cache(self) -> CacheGroup:
        return CacheGroup([s.cache for s in self.states])

    @cache.setter
    def cache(self, group: CacheGroup) -> None:  # (the engine swaps in the paged pool's caches)
        if len(group.parts) != len(self.states):
            raise ValueError(f"a hierarchy of {len(self.states)} models takes as many caches, got {len(group.parts)}")
        for s, c in zip(self.states, group.parts):
            s.cache = c

    def prefill(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                extent: int | None = None, graphs=None) -> None:
        """Every model fed committed positions [starts[i], ends[i]) of the slots in `rows` (`SlotModel.prefill`)."""
        for s in self.states:
            s.prefill(state, rows, starts, ends, chunk, extent=extent, graphs=graphs)

    def prefill_ragged(self, state, rows: slice, starts: list[int], ends: list[int], chunk: int, *,
                       extent: int | None = None) -> None:
        """`prefill` with each row's columns from its own start (`SlotModel.prefill_ragged`)."""
        for s in self.states:
            s.prefill_ragged(state, rows, starts, ends, chunk, extent=extent)
