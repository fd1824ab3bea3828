"""min_p (a filter after top-p, as transformers' MinPLogitsWarper): exact on both runners.

The same standardization as transformers' warper chain, one config or per-row; min_p = 1 turns sampling into
the argmax path (equal to transformers' greedy generate, on the loop and on the engine); and the sampled
two-token law is the min-p-filtered target law (chi-square, with the unfiltered law as negative control).
"""

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import specdec
from helpers import hf_greedy
from specdec.core import SamplingConfig, standardize_logits, standardize_rows
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import PROMPT, exact_two_token_law

CONFIGS = [SamplingConfig(1.0, min_p=0.1), SamplingConfig(0.7, top_k=20, min_p=0.05),
           SamplingConfig(1.5, top_p=0.9, min_p=0.2), SamplingConfig(1.0, min_p=1.0)]


def _hf(logits: torch.Tensor, c: SamplingConfig) -> torch.Tensor:
    """transformers' warpers in generate's order → probabilities."""
    warpers = [TemperatureLogitsWarper(c.temperature)]
    warpers += [TopKLogitsWarper(c.top_k)] if c.top_k else []
    warpers += [TopPLogitsWarper(c.top_p)] if c.top_p < 1.0 else []
    warpers += [MinPLogitsWarper(c.min_p)] if c.min_p > 0 else []
    for w in warpers:
        logits = w(None, logits)
    return logits.softmax(-1)


def _logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g) * 3
    logits[1, 10:20] = logits[1, 3]  # ties
    logits[2, :25] = -float("inf")  # masked tokens
    return logits


@pytest.mark.parametrize("config", CONFIGS)
def test_min_p_standardizes_as_transformers_warpers(config):
    logits = _logits()
    ours, ref = standardize_logits(logits, config), _hf(logits.clone(), config)
    assert torch.equal(ours > 0, ref > 0)  # the same tokens survive
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


def test_min_p_per_row_equals_one_config_per_row():
    logits = _logits()[:4, None, :]  # [B, 1, V]
    configs = CONFIGS
    values = {name: torch.tensor([getattr(c, name) for c in configs], dtype=torch.long if name == "top_k" else
                                 torch.float32) for name in ("top_k", "top_p", "min_p")}
    rows = standardize_rows(logits, torch.tensor([c.temperature for c in configs]), values)
    for i, c in enumerate(configs):
        torch.testing.assert_close(rows[i, 0], standardize_logits(logits[i, 0], c), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_min_p_one_is_the_greedy_path_of_transformers(llama, llama_draft, engine):
    """min_p = 1 keeps only the most likely token: sampling at any temperature is transformers' greedy."""
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    res = specdec.generate(llama, prompts, llama_draft, max_new_tokens=10, temperature=1.3, min_p=1.0, seed=0,
                           num_draft_tokens=3, eos_token_id=[], engine=engine)
    assert res.sequences == [hf_greedy(llama, p, 10, []) for p in prompts]


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


@pytest.mark.parametrize("engine, rows", [("hf", 6000), ("fast", 6000)])
def test_min_p_two_token_law(pair, engine, rows):
    target, draft = pair
    # these random models are nearly flat: at T = 0.3 and top-k 14, min_p = 0.4 moves 28% of the two-token mass
    config = SamplingConfig(0.3, top_k=14, min_p=0.4)
    res = specdec.generate(target, [PROMPT] * rows, drafter=draft, max_new_tokens=2, temperature=0.3, top_k=14,
                           min_p=0.4, num_draft_tokens=2, seed=4, eos_token_id=[], engine=engine)
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, config)) > 1e-3
    assert 0 < res.stats.alpha < 1
    # negative control: the same samples against the law without min_p must fail
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(0.3, top_k=14))) < 1e-8


def test_min_p_is_checked_and_exposed_where_requests_are_built(llama):
    for bad in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="min_p"):
            SamplingParams(min_p=bad)
    with pytest.raises(ValueError, match="min_p"):
        specdec.generate(llama, [[1, 2]], max_new_tokens=2, min_p=2.0)
    assert SamplingParams(temperature=0.5, min_p=0.3).sampling.filters == ("min_p",)
    assert SamplingParams(temperature=0, min_p=0.3).sampling.filters == ()


@pytest.mark.parametrize("runner", ["auto", "fallback"])
def test_min_p_through_the_text_api(ckpt, runner):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, runner=runner) as llm:
        greedy = llm.generate("w1 w2 w3", max_new_tokens=6, temperature=0)
        one = llm.generate("w1 w2 w3", max_new_tokens=6, temperature=1.0, min_p=1.0, seed=1)
        assert one.token_ids == greedy.token_ids
        with pytest.raises(ValueError, match="min_p"):
            llm.generate("w1", min_p=-1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_min_p_under_cuda_graphs(make_llama):
    """The engine's captured graphs with a min-p row next to a plain sampled row: min_p = 1 is still the
    argmax path (a tie would be shown by `assert_same_greedy`), and the other row keeps its own law."""
    from helpers import assert_same_greedy
    from specdec.engine import Engine, EngineConfig

    target, draft = make_llama(0).cuda(), make_llama(1, layers=1).cuda()
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=3))
    assert engine.cuda_graphs
    prompt = [1, 2, 3, 4]
    ids = [engine.add_request(prompt, SamplingParams(temperature=1.2, min_p=1.0, max_new_tokens=12, seed=1)),
           engine.add_request(prompt, SamplingParams(temperature=1.0, max_new_tokens=12, seed=2))]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    assert_same_greedy(target, prompt, out[ids[0]], hf_greedy(target, prompt, 12, []))
    assert len(out[ids[1]]) == 12
