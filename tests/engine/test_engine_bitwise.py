"""What the engine already gives bit for bit on a CPU in fp32 — the ground the bitwise-exact mode builds on
(issue 26, item 1): a request's tokens do not depend on what else is in the batch (admitted before it, mid-flight,
queued behind a full batch) nor, when greedy, on γ (plain decoding included). Its log-probabilities are not yet
bit-identical across batch shapes: the GEMMs of another batch size round differently (xfail below, the target of
the bitwise mode)."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

PROMPT = [5, 6, 7, 8]
OTHERS = [[1, 2], [9, 9, 9, 9], [3] * 12, [4, 4, 9], [11, 12, 13]]
#: (max batch, other requests, admitted mid-flight): alone; three admitted first; five admitted one per step while
#: it runs, with two slots (the others queue) and with eight (batch buckets 1 → 8 as they arrive)
BATCHES = [(1, 0, False), (4, 3, False), (2, 5, True), (8, 5, True)]


@pytest.fixture(scope="module")
def pair(make_llama):
    target, draft = make_llama(0), make_llama(1, layers=1)
    with torch.no_grad():  # peaked laws, so drafts are accepted and steps commit several tokens
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    return target, draft


def run(pair, gamma: int, max_batch: int, others: int, mid_flight: bool, params: SamplingParams):
    """The tokens and log-probabilities of the request on PROMPT, among `others` other requests."""
    target, draft = pair
    config = EngineConfig(max_batch_size=max_batch, max_seq_len=128, num_draft_tokens=max(gamma, 1))
    engine = Engine(target, draft if gamma else None, config)
    crowd = [(p, SamplingParams(temperature=0.9 if i % 2 else 0, top_p=0.9, max_new_tokens=9 + i, seed=i,
                                logprobs=True)) for i, p in enumerate(OTHERS[:others])]
    if not mid_flight:
        for prompt, other in crowd:
            engine.add_request(prompt, other)
        crowd = []
    rid = engine.add_request(PROMPT, params)
    tokens, logprobs = [], []
    while engine.has_unfinished():
        if crowd:
            engine.add_request(*crowd.pop(0))
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
                logprobs += list(out.logprobs)
    return tokens, logprobs


def test_greedy_tokens_are_identical_across_batches_and_gamma(pair):
    params = SamplingParams(temperature=0, max_new_tokens=16, logprobs=True)
    runs = {(gamma, *batch): run(pair, gamma, *batch, params)[0] for gamma in (0, 1, 3, 5) for batch in BATCHES}
    reference = runs[(0, 1, 0, False)]
    assert len(reference) == 16
    assert all(tokens == reference for tokens in runs.values()), runs


@pytest.mark.parametrize("gamma", [0, 3])
def test_seeded_tokens_are_identical_across_batches(pair, gamma):
    params = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, gamma, *batch, params)[0] for batch in BATCHES]
    assert len(runs[0]) == 16 and all(tokens == runs[0] for tokens in runs), runs


@pytest.mark.xfail(reason="fp32 GEMMs of another batch size round differently on CPU: log-probabilities differ in the "
                          "last bits (≈ 2e-7) across batch shapes; the bitwise-exact mode (issue 26, item 1) is to "
                          "make them identical", strict=False)
def test_logprobs_are_bit_identical_across_batches(pair):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, 0, *batch, params)[1] for batch in BATCHES]
    assert all(logprobs == runs[0] for logprobs in runs)
