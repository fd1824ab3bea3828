"""Logits processors on the engine: per-slot history on the device, p and q processed along the draft.

Greedy: the engine (model, prompt-lookup and n-gram drafters, several γ, plain) gives transformers' own processed
`generate`, for requests with different processors in one batch (and plain rows beside them). Sampled: the two-token
law is the processed target's (chi-square), with negative controls (the unprocessed law; a history frozen along the
draft).
"""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig
from specdec.core.processors import process_draft
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.engine import Engine, EngineConfig
from specdec.engine.drafters import StepView
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import PROMPT
from test_processing import CASES, LAW, PROMPTS, STOP, hf_processed, processed_two_token_law


def _run(engine, requests):
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return [out[i] for i in ids]


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_engine_greedy_with_processors_is_transformers_generate(llama, llama_draft, gamma):
    """Every case and prompt in one batch (more requests than slots, so some join mid-flight), beside plain rows."""
    requests, refs = [], []
    for case in CASES:
        eos = [17] if "min_tokens" in case else []
        for prompt in PROMPTS:
            requests.append((prompt, SamplingParams(max_new_tokens=12, temperature=0, eos_token_ids=eos, **case)))
            refs.append(hf_processed(llama, prompt, 12, eos, **case))
    for prompt in PROMPTS:
        requests.append((prompt, SamplingParams(max_new_tokens=12, temperature=0)))
        refs.append(hf_processed(llama, prompt, 12, []))
    drafters = [llama_draft, PromptLookupDrafter()] if gamma else [None]
    for drafter in drafters:
        engine = Engine(llama, drafter, EngineConfig(max_batch_size=8, max_seq_len=64, num_draft_tokens=gamma or 1))
        assert _run(engine, requests) == refs, type(drafter).__name__


def test_engine_rejects_bias_outside_the_vocabulary(llama):
    engine = Engine(llama, None, EngineConfig(max_batch_size=2, max_seq_len=64))
    with pytest.raises(ValueError, match="logit_bias token id 64"):
        engine.add_request([1, 2], SamplingParams(max_new_tokens=4, logit_bias={64: 1.0}))


def _pairs(target, draft, rows, seed):
    res = specdec.generate(target, [PROMPT] * rows, drafter=draft, max_new_tokens=3, temperature=1.0,
                           num_draft_tokens=2, seed=seed, eos_token_id=STOP, engine="fast", **LAW)
    return np.array([s[0] * 16 + s[1] for s in res.sequences if len(s) >= 2]), res


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


def test_engine_two_token_law_is_the_processed_target(pair):
    target, draft = pair
    pairs, res = _pairs(target, draft, 6000, seed=3)
    assert chi2_pvalue(pairs, processed_two_token_law(target, SamplingConfig(1.0))) > 1e-3
    assert 0 < res.stats.alpha < 1
    assert chi2_pvalue(pairs, processed_two_token_law(target, SamplingConfig(1.0), advanced=False)) < 1e-8


def test_engine_history_frozen_along_the_draft_breaks_the_law(pair, monkeypatch):
    """Negative control: p̃ at every drafted position from the committed history alone must fail."""
    target, draft = pair

    def frozen(self, logits, draft_tokens):
        if self.processors is None:
            return logits
        zero = draft_tokens[:, :0]
        return torch.cat([process_draft(logits[:, i:i + 1], zero, self.processors, self.history)
                          for i in range(logits.shape[1])], 1)

    monkeypatch.setattr(StepView, "process", frozen)
    pairs, _ = _pairs(target, draft, 6000, seed=3)
    assert chi2_pvalue(pairs, processed_two_token_law(target, SamplingConfig(1.0))) < 1e-8


@pytest.mark.parametrize("gamma", [0, 3])
def test_engine_greedy_with_a_constraint_is_transformers_prefix_constrained(llama, llama_draft, gamma):
    """Constrained rows (eager steps, host masks) beside penalized and plain rows in one batch."""
    from test_processing import StrideRule, hf_constrained

    rules = [StrideRule() for _ in PROMPTS]
    requests = [(p, SamplingParams(max_new_tokens=14, temperature=0, constraint=r)) for p, r in zip(PROMPTS, rules)]
    requests += [(p, SamplingParams(max_new_tokens=14, temperature=0, repetition_penalty=1.8)) for p in PROMPTS]
    requests += [(p, SamplingParams(max_new_tokens=14, temperature=0)) for p in PROMPTS]
    refs = [hf_constrained(llama, p, 14, StrideRule()) for p in PROMPTS]
    refs += [hf_processed(llama, p, 14, [], repetition_penalty=1.8) for p in PROMPTS]
    refs += [hf_processed(llama, p, 14, []) for p in PROMPTS]
    for drafter in ([llama_draft, PromptLookupDrafter()] if gamma else [None]):
        rules[:] = [StrideRule() for _ in PROMPTS]
        requests[:3] = [(p, SamplingParams(max_new_tokens=14, temperature=0, constraint=r))
                        for p, r in zip(PROMPTS, rules)]
        engine = Engine(llama, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=gamma or 1))
        out = _run(engine, requests)
        assert out == refs, type(drafter).__name__
        assert [r.started[0].output for r in rules] == out[:3]


def test_engine_sampled_output_keeps_the_constraint(llama, llama_draft):
    from test_processing import StrideRule

    rules = [StrideRule() for _ in range(6)]
    engine = Engine(llama, llama_draft, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=3))
    out = _run(engine, [(PROMPTS[i % 3], SamplingParams(max_new_tokens=12, temperature=1.0, seed=i, constraint=r))
                        for i, r in enumerate(rules)])
    assert [r.started[0].output for r in rules] == out  # StrideState.commit asserts every token is allowed


def test_engine_top_logprobs_are_the_targets_top_n(llama, llama_draft):
    """Rows asking for N = 5, 2 and none in one batch: each committed token's N most likely (id, log p) of the
    target's raw law, as a plain forward pass over the output gives them (γ = 3: accepted, resampled and bonus
    tokens alike)."""
    engine = Engine(llama, llama_draft, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=3))
    asks = [5, 2, 0]
    requests = [(p, SamplingParams(max_new_tokens=10, temperature=t, seed=1, logprobs=n > 0, top_logprobs=n,
                                   repetition_penalty=1.3))
                for p, n, t in zip(PROMPTS, asks, (0.0, 1.0, 0.0))]
    ids = [engine.add_request(p, params) for p, params in requests]
    tokens = {i: [] for i in ids}
    tops = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.request_id] += o.new_token_ids
            assert (o.top_logprobs is None) == (requests[ids.index(o.request_id)][1].top_logprobs == 0)
            tops[o.request_id] += o.top_logprobs or []
    for (prompt, params), rid in zip(requests, ids):
        if not params.top_logprobs:
            continue
        with torch.no_grad():
            logits = llama(torch.tensor([prompt + tokens[rid]])).logits[0, len(prompt) - 1: -1].float()
        values, top_ids = logits.log_softmax(-1).topk(params.top_logprobs, dim=-1)
        assert [[t for t, _ in alt] for alt in tops[rid]] == top_ids.tolist()
        torch.testing.assert_close(torch.tensor([[v for _, v in alt] for alt in tops[rid]]), values, atol=1e-5,
                                   rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_processors_under_cuda_graphs(make_llama):
    """The processed flavor captured in the engine's graphs (and a constrained row running eagerly beside them):
    each row's greedy text is transformers' processed greedy text (a difference must be a float tie), twice over
    (the second run replays the captured graphs)."""
    from helpers import assert_same_greedy
    from test_processing import StrideRule, hf_constrained

    target, draft = make_llama(0).cuda(), make_llama(1, layers=1).cuda()
    engine = Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=128, num_draft_tokens=3))
    assert engine.cuda_graphs
    cpu = make_llama(0)
    for _ in range(2):
        requests = [(p, SamplingParams(max_new_tokens=16, temperature=0, **case)) for case in CASES[:3]
                    for p in PROMPTS[:2]]
        requests.append((PROMPTS[2], SamplingParams(max_new_tokens=16, temperature=0, constraint=StrideRule())))
        out = _run(engine, requests)
        for (prompt, params), got, case in zip(requests[:-1], out, [c for c in CASES[:3] for _ in range(2)]):
            assert_same_greedy(cpu, prompt, got, hf_processed(cpu, prompt, 16, [], **case))
        assert_same_greedy(cpu, PROMPTS[2], out[-1], hf_constrained(cpu, PROMPTS[2], 16, StrideRule()))
