"""EngineConfig(kernels=...) reaches the target and the model drafter; the engine's greedy output on the fused
kernels (Triton interpreter on CPU) is transformers' greedy output."""

import pytest

from helpers import hf_greedy
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

pytest.importorskip("triton")


def test_engine_runs_the_fused_kernels(make_llama):
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=32, num_draft_tokens=3,
                                                kernels="triton"))
    assert engine.model.kernels == "triton" and engine.drafter.model.kernels == "triton"
    prompts = [[5, 6, 7, 8], [9, 3]]
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=4)): i for i, p in enumerate(prompts)}
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    for i, prompt in enumerate(prompts):
        assert outputs[i] == hf_greedy(target, prompt, 4, [])
    assert Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=32, kernels="reference")).model.kernels \
        == "reference"
