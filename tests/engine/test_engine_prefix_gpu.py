"""Prefix caching on CUDA in fp32 (the engine's CUDA graphs and Triton kernels over the block pool): a request that
hits cached blocks gives the tokens it gives with caching off — greedy and seeded sampling, with a model drafter
(its K/V cached in the same blocks) and with none. The CPU twin (`test_engine_prefix.py`) holds the negative
control (corrupted cached K/V change the output)."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SYSTEM = [(7 * i + 3) % 61 + 2 for i in range(53)]  # a shared "system prompt": 3 full blocks of 16, + 5
PROMPTS = [SYSTEM + [5, 6, 7], SYSTEM + [8, 9], SYSTEM + [5, 6, 7, 10, 11], SYSTEM[:40], SYSTEM + [9] * 20]


def _serve(engine, prompts, params):
    """Each prompt once the last finished (so later ones can hit) → tokens per prompt, the final outputs."""
    tokens, finals = [], []
    for i, prompt in enumerate(prompts):
        rid = engine.add_request(prompt, params[i % len(params)])
        out = []
        while engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid:
                    out.extend(o.new_token_ids)
                    if o.finished:
                        finals.append(o)
        tokens.append(out)
    return tokens, finals


@pytest.mark.parametrize("drafter", ["model", None])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_hit_on_cuda_gives_the_tokens_of_caching_off(make_llama, drafter, temperature):
    target = make_llama(0).to("cuda")
    draft = make_llama(1, layers=1).to("cuda") if drafter else None
    params = [SamplingParams(temperature=temperature, max_new_tokens=20 + 3 * i, seed=5 + i) for i in range(3)]
    config = dict(max_batch_size=2, max_seq_len=160, num_draft_tokens=3 if drafter else 0, block_size=16,
                  kv_layout="paged")
    off, _ = _serve(Engine(target, draft, EngineConfig(enable_prefix_caching=False, **config)), PROMPTS, params)
    engine = Engine(target, draft, EngineConfig(enable_prefix_caching=True, **config))
    on, finals = _serve(engine, PROMPTS, params)
    assert on == off
    cached = [f.num_cached_tokens for f in finals]
    assert cached[0] == 0 and all(c >= 48 for c in cached[1:3]) and cached[3] == 32 and cached[4] >= 48
    assert engine.prefix_cache_hits == sum(cached) > 0
