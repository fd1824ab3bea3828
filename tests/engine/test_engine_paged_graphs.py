"""The paged engine under CUDA graphs (GPU only): steps captured over the block table — a persistent
`[max_batch, max_blocks]` device buffer the graphs read by address, a fixed number of blocks per length bucket — give
the eager paged engine's tokens and the static layout's (greedy = transformers, seeded samples, token trees), with
preemptions from a tiny pool, and no capture depends on where a request's blocks are (no new shape on reruns)."""

import pytest
import torch

from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.engine import Engine, EngineConfig
from specdec.engine.kv_pool import PagedSlotCache
from specdec.request import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = RAGGED_PROMPTS + [[4, 4, 9], list(range(3, 40))]
PARAMS = [SamplingParams(temperature=0, max_new_tokens=30),
          SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=26, seed=5),
          SamplingParams(temperature=0, max_new_tokens=24, draft_tree=(2, 2, 1)),
          SamplingParams(temperature=1.0, max_new_tokens=22, seed=9, draft_tree=(2, 2, 1))]


@pytest.fixture(scope="module")
def cuda_pair(make_llama):
    return make_llama(0).cuda(), make_llama(1, layers=1).cuda()


def _run(target, draft, config, params, prompts=PROMPTS):
    engine = Engine(target, draft, config)
    out = {}
    for i, p in enumerate(prompts):
        engine.add_request(p, params[i % len(params)], request_id=str(i))
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        if engine.kv_pool is not None:
            engine.kv_pool.check()
    return engine, [out[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("group", ["chains", "trees"])
def test_paged_graphs_are_the_eager_paged_and_the_static_tokens(cuda_pair, group):
    target, draft = cuda_pair
    params = PARAMS[:2] if group == "chains" else PARAMS[2:]
    base = dict(max_batch_size=4, max_seq_len=256, num_draft_tokens=3, max_tree_nodes=16)
    graphs, paged = _run(target, draft, EngineConfig(**base, kv_layout="paged", cuda_graphs=True), params)
    assert graphs.cuda_graphs and any(run.captured for run in graphs._steps.values())
    _, eager = _run(target, draft, EngineConfig(**base, kv_layout="paged", cuda_graphs=False), params)
    _, static = _run(target, draft, EngineConfig(**base, cuda_graphs=True), params)
    assert paged == eager  # the same kernels, captured or launched
    greedy = [i for i in range(len(PROMPTS)) if params[i % 2].temperature == 0]
    for i in greedy:
        assert paged[i] == static[i] == hf_greedy(target, PROMPTS[i], params[i % 2].max_new_tokens, [])
    sampled = [i for i in range(len(PROMPTS)) if i not in greedy]
    same = sum(paged[i] == static[i] for i in sampled)
    assert same >= len(sampled) - 1  # seeded samples: the same draws (fp32 round-off may flip a rare token)


def test_paged_graphs_with_preemptions_and_no_shape_per_placement(cuda_pair):
    target, draft = cuda_pair
    base = dict(max_batch_size=4, max_seq_len=128, num_draft_tokens=3, kv_layout="paged", cuda_graphs=True)
    roomy, free_run = _run(target, draft, EngineConfig(**base), PARAMS[:1])
    block = sum(PagedSlotCache.block_bytes(m, 16) for m in (roomy.model, roomy.drafter.model))
    tight, tight_run = _run(target, draft, EngineConfig(**base, kv_cache_memory=7 * block), PARAMS[:1])
    assert tight.kv_cache_usage.num_preemptions > 0 and tight_run == free_run
    shapes = len(tight._steps)
    for i, p in enumerate(PROMPTS):  # the same traffic over other blocks (the free list's order moved): replays
        tight.add_request(p, PARAMS[0], request_id=f"again{i}")
    again = {}
    while tight.has_unfinished():
        for o in tight.step():
            again.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert len(tight._steps) == shapes
    assert [again[f"again{i}"] for i in range(len(PROMPTS))] == free_run
