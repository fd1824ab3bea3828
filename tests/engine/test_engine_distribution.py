"""The engine samples the target's standardized law exactly: chi-square on the joint law of two tokens,
with per-row parameters, counter-based randomness and a negative control."""

import numpy as np
import pytest
import torch

import specdec
from specdec import rng
from specdec.core import SamplingConfig
from stats_utils import chi2_pvalue
from test_distribution import PROMPT, exact_two_token_law, model_probs

PASS, FAIL = 1e-3, 1e-8
ROWS = 6000


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


@pytest.mark.parametrize("sampling, gamma", [(SamplingConfig(1.0), 3), (SamplingConfig(0.7, top_k=6), 2),
                                             (SamplingConfig(1.3, top_p=0.8), 4)])
def test_two_token_law(pair, sampling, gamma):
    target, draft = pair
    # 3 new tokens so that a step may draft 2 (a row never drafts past what it can commit): the first two tokens' law
    # then involves two verified positions
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=draft, max_new_tokens=3, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=gamma, seed=1,
                           eos_token_id=[], engine="fast")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) > PASS
    assert 0 < res.stats.alpha < 1


def test_two_token_law_with_prompt_lookup(pair):
    target, _ = pair
    prompt = PROMPT + [3, 1]
    res = specdec.generate(target, [prompt] * ROWS, drafter=specdec.PromptLookupDrafter(max_ngram_size=2),
                           max_new_tokens=2, temperature=1.0, num_draft_tokens=3, seed=2, eos_token_id=[],
                           engine="fast")
    with torch.no_grad():
        law = (model_probs(target, prompt)[:, None] * torch.stack([model_probs(target, prompt + [t]) for t in range(16)]))
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, law.flatten().double().numpy()) > PASS
    assert res.stats.accepted_tokens > 0


def test_two_token_law_of_rows_with_their_own_caps_in_shared_steps(pair):
    """Plain, cap-1 and cap-3 rows in the same steps of one engine (default γ 4, steps at γ 3): each group samples the
    exact law. Fixed caps only, every request seeded by its index: the sample, and the p-value, are the same on every
    run ("auto" would make them follow the measured step times)."""
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=64, max_seq_len=32, num_draft_tokens=4))
    caps = [0, 1, 3]
    index = {engine.add_request(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=3, seed=i,
                                                       num_draft_tokens=caps[i % 3])): i for i in range(3 * ROWS // 2)}
    tokens = [[] for _ in index]
    drafted = [0, 0, 0]
    while engine.has_unfinished():
        for out in engine.step():
            tokens[index[out.request_id]] += out.new_token_ids
            drafted[index[out.request_id] % 3] += out.num_drafted
    law = exact_two_token_law(target, SamplingConfig(1.0))
    for group in range(3):
        pairs = np.array([t[0] * 16 + t[1] for t in tokens[group::3]])
        assert chi2_pvalue(pairs, law) > PASS, caps[group]
    assert drafted[0] == 0 < drafted[1] < drafted[2]  # (plain rows drafted nothing; cap 1 less than cap 3)


def test_negative_control_reused_randomness_fails(pair, monkeypatch):
    """If every position drew the same uniforms (a broken counter), the law must visibly break."""
    target, draft = pair
    real = rng._row_keys
    monkeypatch.setattr(rng, "_row_keys", lambda seed, position, stream: real(seed, position * 0, 0))
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=draft, max_new_tokens=3, temperature=1.0,
                           num_draft_tokens=3, seed=1, eos_token_id=[], engine="fast")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) < FAIL


def test_counter_uniforms_are_uniform_and_distinct():
    seeds = torch.arange(2000, dtype=torch.long) * 7919
    u = rng.uniforms(seeds, torch.arange(50)[None, :].expand(2000, -1), rng.ACCEPT).flatten()
    assert 0 < float(u.min()) and float(u.max()) < 1
    counts = np.histogram(u.numpy(), bins=64, range=(0, 1))[0]
    assert chi2_pvalue(np.repeat(np.arange(64), counts), np.full(64, 1 / 64)) > PASS
    e = rng.exponentials(seeds[:100], torch.zeros(100, 1, dtype=torch.long), rng.NEXT, 500).flatten()
    assert abs(float(e.mean()) - 1.0) < 0.02
    other_stream = rng.uniforms(seeds, torch.arange(50)[None, :].expand(2000, -1), rng.DRAFT).flatten()
    assert abs(float(torch.corrcoef(torch.stack([u, other_stream]))[0, 1])) < 0.01
