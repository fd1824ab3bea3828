"""Warm-up: capture the runner's graphs ahead of traffic.

`warm_steps` captures the decode step graphs for chosen batch sizes, γ values, length buckets and temperatures,
and with `mixed_step` every mixed step shape of those batch sizes, γ values and temperatures (`mixed_shapes`: each
token bucket; captured on CUDA, else run once — the Triton builds, the code path);
`warm_prefill` the prefill graphs of a request admitted alone into slot 0 (`EngineConfig.prefill_graphs`).
Both run on a `Runner` (`Engine.warmup` calls them while no request runs).
"""

from __future__ import annotations

import torch

from specdec.engine.config import BATCH_BUCKETS, length_buckets
from specdec.engine.drafters import Flavor
from specdec.engine.mixed_shapes import mixed_keys
from specdec.engine.mixed_step import mixed_for
from specdec.engine.request_checks import check_tree
from specdec.engine.slots import chunk_shapes
from specdec.request import SamplingParams, as_int

__all__ = ["warm_prefill", "warm_steps"]


def warm_steps(runner, gammas, batch_sizes=(1,), max_length: int | None = None, temperatures=(0.0,),
               draft_trees=(), progress=None) -> int:
    """Capture the decode graphs for these batch sizes, γ values, every length bucket up to `max_length` (None:
    max_seq_len), these temperatures (no top-k/top-p), the token-tree steps of `draft_trees` and (`mixed_step`) the
    mixed steps of those batch sizes, γ values and temperatures at every token bucket → how many step shapes were
    built. `progress(built, total)` is called after each shape (a start-up progress bar)."""
    for size in batch_sizes:
        as_int(size, "batch_sizes", minimum=1, maximum=runner.max_batch)
    for gamma in gammas:
        as_int(gamma, "gammas", minimum=0, maximum=runner.max_draft_tokens)
    if max_length is not None:
        as_int(max_length, "max_length", minimum=1, maximum=runner.max_seq_len)
    for temperature in temperatures:
        SamplingParams(temperature=temperature)  # a number >= 0, named in the error
    trees = []
    for tree in draft_trees:
        params = SamplingParams(draft_tree=tree)  # the shape checked, then what it needs of this engine
        check_tree(params, runner.limits)
        trees.append(runner.tree(params.draft_tree))
    written = max([runner.max_draft_tokens] + [t.spec.num_nodes - 1 for t in trees])
    limit = min(runner.num_positions, max_length + written + 2 if max_length else runner.num_positions)
    flavors = {Flavor(t == 0) for t in temperatures}
    built = 0
    batches = sorted({next(b for b in BATCH_BUCKETS if b >= s) for s in batch_sizes})
    buckets = length_buckets(runner.num_positions, limit)
    mixed = mixed_keys(batches, gammas, sorted(flavors, key=repr), runner.config) if runner.config.mixed_step else []
    total = len(batches) * len(buckets) * (len(gammas) + len(trees)) * len(flavors) + len(mixed)
    with torch.inference_mode():
        for batch in batches:
            for positions in buckets:
                for gamma in gammas:
                    for flavor in flavors:
                        runner.step_for(batch, gamma, positions, flavor).capture()
                        built += 1
                        if progress is not None:
                            progress(built, total)
                for tree in trees:
                    for flavor in flavors:
                        runner.step_for(batch, tree.spec.depth, positions, flavor, tree).capture()
                        built += 1
                        if progress is not None:
                            progress(built, total)
        for key in mixed:  # every shape a mixed step can reach (`mixed_shapes`), its draft half the decode step's
            batch, gamma, flavor, _ = key
            mixed_for(runner, key).warm(runner.step_for(batch, gamma, buckets[0], flavor))
            built += 1
            if progress is not None:
                progress(built, total)
    return built


def warm_prefill(runner, max_length: int) -> int:
    """Capture the prefill graphs of a request admitted alone into slot 0, for every prompt length up to
    `max_length` (one length per distinct set of chunk shapes; slot 0 must be free) → lengths run. With a prefix
    cache, also the prefills that start past a hit (every block boundary a hit of that prompt may end at: its
    chunks start there and attend past it), until the graphs' `limit` is reached (later shapes run eagerly)."""
    graphs = runner.prefill_graphs
    if graphs is None:
        return 0
    capacity, runs, chunk = runner.state.capacity, 0, runner.config.prefill_chunk
    drafter_positions = runner.drafter.cache.num_positions if runner.drafter_cached else None
    window = getattr(runner.drafter, "window", 0) if runner.drafter_cached else 0  # (a head re-feeds its window)
    block = runner.kv_pool.block_size if getattr(runner, "prefix_cache", None) is not None else None
    seen: set = set()
    for hit in range(0, max_length, block or max_length):
        for n in range(max(2, hit + 2), max_length + 1):  # (a hit ends before the prompt's last token)
            if len(seen) >= graphs.limit:
                return runs
            draft_end = max(n - 2, 0)
            shapes = {("target", *x) for x in chunk_shapes([hit], [n - 1], chunk, 0, capacity,
                                                           runner.cache.num_positions)}
            if drafter_positions is not None:
                draft_start = max(hit - window, 0) if draft_end > hit else hit  # (as `EngineFeatureDrafter.prefill`)
                shapes |= {("drafter", *x) for x in chunk_shapes([draft_start], [draft_end], chunk, 0, capacity,
                                                                 drafter_positions)}
            if shapes <= seen:
                continue
            seen |= shapes
            for _ in range(graphs.after + 1):  # seen `after` times, then captured
                runner.prefill_target(slice(0, 1), [hit], [n - 1], graphs)
                if runner.drafter_cached:
                    runner.prefill_drafter(slice(0, 1), [hit], [draft_end], graphs)
            runs += 1
    return runs
