"""Run by test_tensor_parallel_paged.py under `torchrun --nproc-per-node 2`: the engine on the paged pool, sharded.

argv: OUT.json TARGET_DIR DRAFT_DIR [mixed | auto]; the device is $TP_DEVICE ("cpu": gloo, default; "cuda": nccl, fp32).
Every rank builds one `Engine` over its shard of the target (a model drafter
replicated) with a tiny paged pool — so running requests are preempted and recomputed —, prefix caching on, and
requests of different draft caps (plain, γ 2, γ 3), temperatures and seeds, some sharing a prompt prefix, some
arriving while others run. Rank 0 writes each request's tokens, the pool's counters, and whether every rank
produced the same; `traffic` is the one definition of that workload, which the test replays in one process.
With "mixed": the mixed prefill/decode step's runs instead (`mixed_runs`: `traffic` over longer prompts); with
"auto": the "auto" γ policy's runs (`auto_runs`: each rank's choice scripted apart, then the real policy).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)

from specdec.distributed import (init_tensor_parallel, is_main_rank, load_sharded,  # noqa: E402
                                 shutdown_tensor_parallel)
from specdec.engine import Engine, EngineConfig  # noqa: E402
from specdec.request import SamplingParams  # noqa: E402

SHARED = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # three blocks of 4: what later prompts find cached
REQUESTS = [  # (prompt, num_draft_tokens, temperature, seed, arrives at step)
    (SHARED + [20, 21], 3, 0.0, 0, 0),
    ([12, 3], 0, 1.0, 7, 0),
    ([7, 7, 8, 9, 7, 7], 2, 1.0, 8, 0),
    (SHARED + [30], 2, 0.0, 0, 4),
    (SHARED + [31, 32, 33], 0, 0.0, 0, 6),
    ([40, 41, 42, 43, 44], 3, 1.0, 9, 6),
]
MAX_NEW = 14
CONFIG = dict(max_batch_size=4, max_seq_len=64, max_draft_tokens=3, kv_layout="paged", block_size=4,
              kv_cache_memory=None, enable_prefix_caching=True)


def pool_bytes(target, drafter, blocks: int = 16) -> int:
    """The bytes of a pool of `blocks` blocks of 4 positions: this rank's shard of the target's K/V and the
    replicated drafter's, every layer, fp32 — 16: room for about two running requests of this workload, so the
    others wait and running ones are preempted. The same blocks on every rank and in one process."""
    shape, config = target.shape, drafter.config
    target_position = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * 4
    head_dim = config.hidden_size // config.num_attention_heads
    draft_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    return blocks * 4 * (target_position + draft_position)


def traffic(target, drafter, kv_cache_memory: int, requests=REQUESTS, **config) -> dict:
    """The workload (`requests`) on one engine (`config` overrides `CONFIG`): {request index: tokens}, plus the
    pool's counters and what the mixed steps fed (`chunk_counts`)."""
    engine = Engine(target, drafter, EngineConfig(**{**CONFIG, "kv_cache_memory": kv_cache_memory, **config}))
    chunks = record_chunks(engine)
    tokens: dict[str, list[int]] = {}
    ids: dict[str, int] = {}
    step = 0
    pending = list(enumerate(requests))
    while pending or engine.has_unfinished():
        while pending and pending[0][1][4] <= step:
            index, (prompt, gamma, temperature, seed, _) = pending.pop(0)
            params = SamplingParams(temperature=temperature, seed=seed, max_new_tokens=MAX_NEW,
                                    num_draft_tokens=gamma)
            ids[engine.add_request(prompt, params)] = index
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        step += 1
    usage = engine.kv_cache_usage
    return {"tokens": {str(ids[k]): v for k, v in tokens.items()}, "preemptions": usage.num_preemptions,
            "prefix_hits": engine.prefix_cache.hits if engine.prefix_cache is not None else 0,
            "kv_heads": target.shape.n_kv_heads, **chunk_counts(chunks)}


# ------------------------------------------------------------------ the mixed prefill/decode step under TP
MIXED_REQUESTS = [  # prompts longer than the budget, arriving while others run: fed in chunks in their verify steps
    (list(range(3, 27)), 3, 0.0, 0, 0),
    ([9, 4] * 15, 2, 1.0, 11, 1),
    (list(range(30, 50)), 0, 1.0, 12, 2),
    (list(range(20, 60)) + [5], 3, 1.0, 13, 4),
    ([7] * 17 + [8, 9], 2, 0.0, 0, 6),
    (list(range(3, 20)) + [50] * 10, 3, 1.0, 14, 8),
]
BUDGET = 16  # prompt tokens a step (EngineConfig's smallest budget)
MIXED = dict(mixed_step=True, prefill_budget=BUDGET, max_seq_len=96,
             enable_prefix_caching=False)  # (no hits: a preempted request is re-fed in chunks too)
WHOLE = {**MIXED, "mixed_step": False, "prefill_budget": None}  # whole prefills at admission
MIXED_BLOCKS = 28  # two or three running requests: the others wait, running ones are preempted


def record_chunks(engine) -> list[tuple[int, int]]:
    """Each chunk a mixed step of `engine` feeds, as (its end, the prompt's end: its length − 1), appended while
    the engine runs (the runner's `run` wrapped: the StepInput's `prefill`)."""
    chunks, runner, real = [], engine.runner, engine.runner.run

    def run(step, shape):
        if step.prefill is not None:
            ends = {r.slot: len(r.prompt) - 1 for r in engine.scheduler.filling}
            chunks.extend((e, ends[s]) for s, e in zip(step.prefill.slots, step.prefill.ends))
        return real(step, shape)

    runner.run = run
    return chunks


def chunk_counts(chunks) -> dict:
    """What the mixed steps fed: their chunks, and those that stopped before their prompt's end (a prompt split
    over steps)."""
    return {"chunks": len(chunks), "split_chunks": sum(end < last for end, last in chunks)}


def mixed_runs(model, drafter) -> dict:
    """This rank's runs of the mixed workload: "mixed" (budget 16), "whole" (mixed_step off), "auto" (the "auto"
    budget, sized apart on each rank: rank r's own would be 16·(r + 1); the engine must feed rank 0's — the budgets
    it asked for and agreed on are recorded), and two negative controls: "no_reduce" (the mixed forward's
    row-parallel products not all-reduced, on every rank) and "rank1_shifted" (rank 1 alone feeds each chunk's
    tokens one position off: its heads' K/V of those blocks wrong, rank 0's right)."""
    from specdec.engine import mixed_step
    from specdec.engine.mixed_step import MixedStepRunner
    from specdec.engine.prefill_budget import AutoBudget

    pool = pool_bytes(model, drafter, MIXED_BLOCKS)
    out = {name: traffic(model, drafter, pool, MIXED_REQUESTS, **config)
           for name, config in (("mixed", MIXED), ("whole", WHOLE))}
    asked = []
    model.leader_int = lambda value: asked.append((value, type(model).leader_int(model, value))) or asked[-1][1]
    real_budget, AutoBudget.budget = AutoBudget.budget, lambda self, step_seconds=None: BUDGET * (model.rank + 1)
    try:
        out["auto"] = traffic(model, drafter, pool, MIXED_REQUESTS, **{**MIXED, "prefill_budget": "auto"})
    finally:
        AutoBudget.budget = real_budget
        del model.leader_int
    out["budgets"] = sorted(set(asked))  # (rank r's own: (asked, agreed) pairs; the ranks differ here by design)
    real_forward = MixedStepRunner.target_forward

    def unreduced(self, tokens, cache):
        reduce, model.reduce = model.reduce, lambda partial: partial
        try:
            return real_forward(self, tokens, cache)
        finally:
            model.reduce = reduce

    MixedStepRunner.target_forward = unreduced
    try:
        out["no_reduce"] = traffic(model, drafter, pool, MIXED_REQUESTS, **MIXED)
    finally:
        MixedStepRunner.target_forward = real_forward
    build = mixed_step.mixed_batch

    def shifted(meta, verify, lengths, table, block_size, tokens, *args, **kwargs):  # (the same shapes: no collective
        return build(meta, verify, lengths, table, block_size, tokens.roll(-1, 1) if model.rank == 1 else tokens,
                     *args, **kwargs)  # differs)

    mixed_step.mixed_batch = shifted
    try:
        out["rank1_shifted"] = traffic(model, drafter, pool, MIXED_REQUESTS, **MIXED)
    finally:
        mixed_step.mixed_batch = build
    return out


# ------------------------------------------------------------------ "auto" γ under TP: rank 0's choice on every rank
AUTO_REQUESTS = [(p, None if g == 3 else g, t, s, a) for p, g, t, s, a in REQUESTS]  # (None: the engine's "auto")
AUTO = dict(num_draft_tokens="auto")
SCRIPTS = {0: (3, 1, 2, 0, 3, 2), 1: (1, 3, 0, 2, 2, 1)}  # each rank's scripted γ per decision (they differ)


def scripted_policy(script):
    """`GammaPolicy.choose` replaced by a script: a step with an "auto" row takes decision k → γ = script[k % len]
    and, every third decision, per-row caps of min(1, the row's cap) (`row_caps`) — a stand-in for the clock-driven
    choice, which differs by rank; a step of fixed caps alone takes the largest, as the real policy does.
    → (patch, restore)."""
    from specdec.engine.policy import GammaPolicy

    real = GammaPolicy.choose

    def choose(self, batch, running, estimates=None, length=None, ready=None, caps=None):
        rows = list(caps) if caps is not None else [None] * len(running)
        if None not in rows:  # (no "auto" row: the real rule, every row its own cap, the same on every rank)
            self._row_caps = None
            return max(rows, default=0)
        k = self.__dict__.setdefault("_scripted", 0)
        self._scripted = k + 1
        self._row_caps = tuple(min(1, 3 if c is None else c) for c in rows) if k % 3 == 2 else None
        return script[k % len(script)]

    return (lambda: setattr(GammaPolicy, "choose", choose)), (lambda: setattr(GammaPolicy, "choose", real))


def auto_runs(model, drafter) -> dict:
    """This rank's "auto" γ runs: "scripted" (each rank's policy scripted apart, `SCRIPTS[rank]`: the engine must run
    rank 0's choices and caps — each broadcast's (asked, agreed) recorded) and "timed" (the real policy, each rank
    timing its own steps)."""
    pool = pool_bytes(model, drafter)
    asked = []
    model.leader_ints = lambda values: asked.append(
        (tuple(values), type(model).leader_ints(model, values))) or asked[-1][1]
    patch, restore = scripted_policy(SCRIPTS[model.rank])
    patch()
    try:
        out = {"scripted": traffic(model, drafter, pool, AUTO_REQUESTS, **AUTO)}
    finally:
        restore()
    out["agreed"] = [list(a) for _, a in asked]
    out["asked_apart"] = sum(q != a for q, a in asked)
    del asked[:]
    out["timed"] = traffic(model, drafter, pool, AUTO_REQUESTS, **AUTO)
    out["timed_agreed"] = [list(a) for _, a in asked]
    del model.leader_ints
    return out


def pool_agreement(target, drafter) -> int:
    """The blocks of a pool sized as a fraction of free memory when each rank sees different free memory (rank r:
    (r + 1) × 64 MiB; the fraction buys 16 blocks on rank 0, 32 on rank 1): the ranks must agree on one pool."""
    from specdec.engine import memory

    free = (dist.get_rank() + 1) * (64 << 20)
    fraction = pool_bytes(target, drafter) / (64 << 20)
    real, memory.available_memory = memory.available_memory, lambda device: free
    try:
        engine = Engine(target, drafter, EngineConfig(**{**CONFIG, "kv_cache_memory": fraction}))
    finally:
        memory.available_memory = real
    return engine.kv_cache_usage.num_blocks


def main() -> None:
    from transformers import AutoModelForCausalLM

    out, target_dir, draft_dir, *mode = sys.argv[1:]  # mode "mixed": the mixed step's runs (`mixed_runs`)
    device = init_tensor_parallel(int(os.environ["WORLD_SIZE"]), os.environ.get("TP_DEVICE", "cpu"))  # (cuda: nccl)
    drafter = AutoModelForCausalLM.from_pretrained(draft_dir, local_files_only=True).eval().to(device)
    model = load_sharded(target_dir, device=device, dtype=torch.float32)
    if mode == ["mixed"]:
        result = mixed_runs(model, drafter)
    elif mode == ["auto"]:
        result = auto_runs(model, drafter)
        apart = result.pop("asked_apart")
        result["budgets"] = apart if model.rank else None  # (rank-specific: kept out of the ranks' comparison)
    else:
        result = traffic(model, drafter, pool_bytes(model, drafter))
        result["blocks_from_a_fraction"] = pool_agreement(model, drafter)
    budgets = result.pop("budgets", None)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (result, budgets))  # (equal results include equal pools)
    if is_main_rank():
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"result": result, "ranks_agree": all(g == result for g, _ in gathered),
                       "budgets": [b for _, b in gathered], "clean_shutdown": shutdown_tensor_parallel(model)}, fh)
    else:
        shutdown_tensor_parallel(model)


if __name__ == "__main__":
    main()
