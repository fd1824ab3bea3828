"""The engine with CUDA graphs (skipped without a GPU): the wave-1 crash (a new cache size or prompt length
after earlier requests) is gone, greedy stays exact, seeds repeat, graphs are captured once per shape."""

import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def cuda_pair(make_llama):
    return make_llama(0).cuda(), make_llama(1, layers=1).cuda()


def test_alternating_plain_and_speculative_with_new_lengths(cuda_pair):
    target, draft = cuda_pair
    calls = [(None, [[5, 6, 7]], 16), (draft, [[1] * 30], 256 - 40), (None, [[2, 3] * 20], 200),
             (draft, RAGGED_PROMPTS, 40), (None, [[9] * 70], 100), (draft, [[4, 5, 6, 7]] * 3, 150)]
    for drafter, prompts, new in calls:
        res = specdec.generate(target, prompts, drafter=drafter, max_new_tokens=new, temperature=0, eos_token_id=[])
        for prompt, out in zip(prompts, res.sequences):
            assert_same_greedy(target, prompt, out, hf_greedy(target, prompt, new, []))


def test_graphs_are_captured_once_per_shape(cuda_pair):
    target, draft = cuda_pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=256, num_draft_tokens=3))
    assert engine.cuda_graphs
    for length in (3, 9, 17, 33, 5, 12):
        engine.add_request(list(range(1, length + 1)), SamplingParams(temperature=0, max_new_tokens=20))
        while engine.has_unfinished():
            engine.step()
    shapes = len(engine._steps)
    for length in (4, 8, 16, 30, 6):
        engine.add_request(list(range(1, length + 1)), SamplingParams(temperature=0, max_new_tokens=20))
        while engine.has_unfinished():
            engine.step()
    assert len(engine._steps) == shapes  # new prompt lengths in known length buckets: nothing captured


def test_seeded_sampling_repeats_with_graphs(cuda_pair):
    target, draft = cuda_pair
    runs = [specdec.generate(target, RAGGED_PROMPTS, drafter=draft, max_new_tokens=24, temperature=0.8, top_p=0.9,
                             seed=5, eos_token_id=[]).sequences for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    eager = specdec.generate(target.cpu(), RAGGED_PROMPTS, drafter=draft.cpu(), max_new_tokens=24, temperature=0.8,
                             top_p=0.9, seed=5, eos_token_id=[], engine="fast").sequences
    target.cuda(), draft.cuda()
    agree = sum(a == b for a, b in zip(runs[0], eager))
    assert agree >= 2  # same counter randomness on CPU and GPU (float round-off may flip a rare token)


def test_a_warmed_auto_engine_captures_nothing_under_traffic(cuda_pair):
    """Issue 21: after `text.warmup.warm_up`, "auto" keeps to the captured shapes — no graph is captured while
    requests of mixed lengths and temperatures come and go, and the policy records no capture."""
    from specdec.text.warmup import graph_captures, warm_up

    target, draft = cuda_pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=256, num_draft_tokens="auto"))
    report = warm_up(engine, 8)
    assert report["complete"] and graph_captures(engine) == report["shapes"] and engine.policy.only_ready
    gen = torch.Generator().manual_seed(0)
    for i in range(24):  # more requests than slots, admitted as slots free
        n = int(torch.randint(3, 150, (1,), generator=gen))
        engine.add_request(torch.randint(1, 60, (n,), generator=gen).tolist(),
                           SamplingParams(temperature=float(i % 2), seed=i, max_new_tokens=int(5 + i * 3)))
        if i % 3 == 2:
            for _ in range(4):
                engine.step()
    while engine.has_unfinished():
        engine.step()
    assert graph_captures(engine) == report["shapes"] and engine.policy.capture_events == []
