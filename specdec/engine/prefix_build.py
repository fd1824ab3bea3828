"""The engine's prefix cache built for its models (`build_prefix_cache`): which caches share a block (the target's,
a cached drafter's, the stored target features of a feature drafter: `FeatureBlocks`), the hash chain's seed (the
models' key) and how far behind a request's length its blocks may enter (a drafter's re-fed window)."""

from __future__ import annotations

from specdec.drafters.protocol import CachedSlotDrafter
from specdec.engine.drafters import WINDOW
from specdec.engine.prefix_cache import PrefixCache, model_key

__all__ = ["FeatureBlocks", "build_prefix_cache"]


class FeatureBlocks:
    """The stored target features' side of a block (`features.FeatureStore` over the pool: a block's positions are
    entries [block · size, (block + 1) · size)), for copy-on-write beside every model's K/V; the store is read
    when a copy is made (the engine enables it after the cache is built)."""

    def __init__(self, state, block_size: int):
        self.state, self.block_size = state, block_size

    def copy_block(self, src: int, dst: int) -> None:
        data, size = self.state.feature_store.data, self.block_size
        data[dst * size : (dst + 1) * size] = data[src * size : (src + 1) * size]


def build_prefix_cache(config, pool, model, cache, drafter, features: bool) -> PrefixCache | None:
    """The engine's prefix cache (`config.enable_prefix_caching`, paged pool) over the target's `cache`, a cached
    drafter's and, for a drafter reading the target's hidden states (`features`), the stored features (in the
    same blocks), or None. A feature head (`EngineFeatureDrafter`) re-feeds a window of γ_max + 1 entries before
    each feed and each proposal: its blocks are shared only below that."""
    if not config.enable_prefix_caching:
        return None
    drafter_cached = isinstance(drafter, CachedSlotDrafter)
    draft = getattr(drafter, "model", None) if drafter_cached else None
    under = [s.model for s in getattr(drafter, "states", [])[1:]] if drafter_cached else []  # (a hierarchy's)
    seed = model_key(type(model).__name__, repr(model.shape), str(model.dtype), type(drafter).__name__,
                     None if draft is None else (repr(draft.shape), str(draft.dtype)),
                     getattr(drafter, "feature_layers", None) if features else None,
                     *[(repr(m.shape), str(m.dtype)) for m in under])
    caches = (cache, drafter.cache) if drafter_cached else (cache,)
    models = (model, draft, *under, getattr(drafter, "head", None), getattr(drafter, "heads", None))
    if features:
        caches += (FeatureBlocks(drafter.state, pool.block_size),)
        window = getattr(drafter, "window", 0) if drafter_cached else 0
        if window:  # a head: its proposal writes its entries from length − 1 − window
            return PrefixCache(pool, seed, window + 1, caches, refeed=window, models=models)
        if drafter_cached:
            raise ValueError(f"enable_prefix_caching: the feature drafter {type(drafter).__name__} keeps a cache "
                             "but names no re-feed window (`window`): which of its entries it rewrites is unknown")
        return PrefixCache(pool, seed, 1, caches, models=models)
    return PrefixCache(pool, seed, WINDOW if drafter_cached else 1, caches, models=models)
