"""Warm-up: capture the engine's graphs ahead of traffic (mixed into `Engine`).

`warmup` captures the decode step graphs for chosen batch sizes, γ values, length buckets and temperatures;
`_warm_prefill` the prefill graphs of a request admitted alone into slot 0 (`EngineConfig.prefill_graphs`).
"""

from __future__ import annotations

import torch

from specdec.engine.config import BATCH_BUCKETS, length_buckets
from specdec.engine.drafters import Flavor
from specdec.engine.request_checks import check_tree
from specdec.engine.slots import chunk_shapes
from specdec.request import SamplingParams, as_int

__all__ = ["Warmup"]


class Warmup:
    """`Engine`'s graph warm-up (see the module doc)."""

    def warmup(self, batch_sizes=(1,), gammas=None, max_length: int | None = None,
               temperatures=(0.0,), draft_trees=(), progress=None) -> int:
        """Capture the decode graphs ahead of traffic (as servers do at start-up) for these batch sizes,
        γ values (default: every γ the policy may pick), every length bucket up to `max_length` (default:
        max_seq_len) and these temperatures (no top-k/top-p), the token-tree steps of `draft_trees` (shapes
        requests will ask for in `SamplingParams.draft_tree`), and the prefill graphs of a request admitted
        alone (`EngineConfig.prefill_graphs`) for prompts up to `max_length`; returns how many step shapes
        were built. `progress(built, total)` is called after each shape (a start-up progress bar)."""
        gammas = gammas if gammas is not None else sorted({0, *self.policy.candidates})
        for size in batch_sizes:
            as_int(size, "batch_sizes", minimum=1, maximum=self.max_batch)
        for gamma in gammas:
            as_int(gamma, "gammas", minimum=0, maximum=self.max_draft_tokens)
        if max_length is not None:
            as_int(max_length, "max_length", minimum=1, maximum=self.max_seq_len)
        for temperature in temperatures:
            SamplingParams(temperature=temperature)  # a number >= 0, named in the error
        trees = []
        for tree in draft_trees:
            params = SamplingParams(draft_tree=tree)  # the shape checked, then what it needs of this engine
            check_tree(params, self.limits)
            trees.append(self._tree(params.draft_tree))
        written = max([self.max_draft_tokens] + [t.spec.num_nodes - 1 for t in trees])
        limit = min(self.num_positions, max_length + written + 2 if max_length else self.num_positions)
        flavors = {Flavor(t == 0) for t in temperatures}
        built = 0
        batches = sorted({next(b for b in BATCH_BUCKETS if b >= s) for s in batch_sizes})
        buckets = length_buckets(self.num_positions, limit)
        total = len(batches) * len(buckets) * (len(gammas) + len(trees)) * len(flavors)
        with torch.inference_mode():
            for batch in batches:
                for positions in buckets:
                    for gamma in gammas:
                        for flavor in flavors:
                            self._step_for(batch, gamma, positions, flavor).capture()
                            built += 1
                            if progress is not None:
                                progress(built, total)
                    for tree in trees:
                        for flavor in flavors:
                            self._step_for(batch, tree.spec.depth, positions, flavor, tree).capture()
                            built += 1
                            if progress is not None:
                                progress(built, total)
            self._warm_prefill(max_length or self.max_seq_len)
        self.policy.only_ready = True  # "auto" keeps to built shapes from now on (where any is built)
        return built

    def _warm_prefill(self, max_length: int) -> int:
        """Capture the prefill graphs of a request admitted alone into slot 0, for every prompt length up to
        `max_length` (one length per distinct set of chunk shapes; slot 0 must be free) → lengths run."""
        graphs = self.prefill_graphs
        if graphs is None or self._running:
            return 0
        capacity, runs = self.state.capacity, 0
        drafter_positions = self.drafter.cache.num_positions if self.drafter_cached else None
        seen: set = set()
        for n in range(2, max_length + 1):
            shapes = {("target", *x) for x in chunk_shapes([0], [n - 1], self.config.prefill_chunk, 0, capacity,
                                                           self.cache.num_positions)}
            if drafter_positions is not None:
                shapes |= {("drafter", *x) for x in chunk_shapes([0], [max(n - 2, 0)], self.config.prefill_chunk, 0,
                                                                 capacity, drafter_positions)}
            if shapes <= seen:
                continue
            seen |= shapes
            for _ in range(graphs.after + 1):  # seen `after` times, then captured
                self._prefill(slice(0, 1), [n], graphs)
            runs += 1
        return runs
