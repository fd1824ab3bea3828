"""`specdec.beam_search(..., engine="fast" or "auto")`: the prompts as beam requests of one engine (`engine/beam.py`),
on whichever body the engine's build gives the model (a fast family body or the transformers backend).

Each prompt is one beam group (w slots); the engine holds w × prompts slots up to the engine's default 64 (or w),
so they run side by side (more wait for slots). The engine runs each group's pass as its own forwards, so P
prompts cost P target passes per step where the transformers path (`search.beam.beam_search`) batches them into
one: per prompt the search, its passes and its beams are the same.
"""

from __future__ import annotations

import time

from specdec.engine.beam import BeamOutput, BeamParams
from specdec.engine.config import EngineConfig
from specdec.engine.engine import Engine
from specdec.fast.kernels.attention import MAX_TREE_SLOTS
from specdec.search.beam import BeamRequest, BeamSearchResult, BeamStats
from specdec.request import SamplingParams

__all__ = ["engine_beam_search"]


def engine_beam_search(target, prompts, drafter=None, *, config: EngineConfig | None = None,
                       **options) -> BeamSearchResult:
    """`search.beam.beam_search`'s arguments (`BeamRequest.of`) and result, run inside an `Engine` built here (config:
    its settings; None = sized for these prompts: max_seq_len = the longest prompt + max_new_tokens, one run of slots
    per prompt, up to 64 slots or w)."""
    started = time.perf_counter()
    request = BeamRequest.of(target, prompts, drafter, **options)
    rules, rows, u, gamma = request.config, request.prompts, request.draft_beams, request.num_draft_tokens
    w, n = rules.num_beams, rules.max_new_tokens
    beams = BeamParams(w, u, gamma, rules.length_penalty, rules.early_stopping, num_return_sequences=w)
    if config is None:
        slots = min(max(EngineConfig.max_batch_size, w), w * len(rows))  # (more prompts wait for slots)
        config = EngineConfig(max_batch_size=slots, max_seq_len=max(len(p) for p in rows) + n,
                              max_tree_nodes=min(MAX_TREE_SLOTS, u * gamma + 1) if gamma else 0)
    engine = Engine(request.target, request.drafter, config)
    params = SamplingParams(max_new_tokens=n, temperature=0, eos_token_ids=rules.eos)
    ids = [engine.add_request(prompt, params, beams=beams) for prompt in rows]
    finals: dict[str, BeamOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    stats = BeamStats()
    for rid in ids:
        stats.merge(finals[rid].beam_stats)
    stats.set_wall_time(time.perf_counter() - started)
    return BeamSearchResult([[list(b) for b in finals[rid].beams] for rid in ids],
                            [list(finals[rid].beam_scores) for rid in ids], stats)
