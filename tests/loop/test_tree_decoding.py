"""Token-tree decoding end to end: greedy equality with transformers, the exact two-token law, batching."""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, sample, standardize_logits
from specdec.core.tree import TreeVerifyResult
from specdec.loop.tree_decoding import tree_generate
from helpers import RAGGED_PROMPTS, hf_greedy
from stats_utils import chi2_pvalue


@pytest.mark.parametrize("tree", [[2, 2, 1], [3, 1], [1, 1, 1, 1]])
def test_greedy_equals_transformers_over_a_ragged_batch(llama, llama_draft, tree):
    res = tree_generate(llama, RAGGED_PROMPTS, llama_draft, tree, max_new_tokens=14, temperature=0, eos_token_id=[])
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(llama, prompt, 14, [])
    assert res.stats.target_calls < 1 + 14 * len(RAGGED_PROMPTS)


def test_greedy_with_eos_and_gpt2(gpt2, gpt2_draft):
    eos = [int(hf_greedy(gpt2, RAGGED_PROMPTS[0], 6, [])[3])]  # a token the first row emits
    res = tree_generate(gpt2, RAGGED_PROMPTS, gpt2_draft, [2, 2], max_new_tokens=10, temperature=0, eos_token_id=eos)
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(gpt2, prompt, 10, eos)
    assert res.sequences[0][-1] == eos[0]


def test_a_perfect_drafter_is_always_accepted_to_full_depth(llama):
    # drafter = the target: its cache (kept along the accepted path) must stay right for every step
    res = tree_generate(llama, RAGGED_PROMPTS[:2], llama, [2, 2, 1], max_new_tokens=16, temperature=0, eos_token_id=[])
    assert res.stats.mean_accepted_length == pytest.approx(4.0)
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(llama, prompt, 16, [])


PROMPT = [3, 1, 4, 1, 5]
ROWS = 12_000


@pytest.fixture(scope="module")
def small_pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


def two_token_law(model, sampling):
    with torch.no_grad():
        p1 = standardize_logits(model(torch.tensor([PROMPT])).logits[0, -1], sampling)
        p2 = standardize_logits(model(torch.tensor([PROMPT + [t] for t in range(16)])).logits[:, -1], sampling)
    return (p1[:, None] * p2).flatten().double().numpy()


@pytest.mark.parametrize(
    "tree, mode, sampling",
    [
        ([2, 2], "without_replacement", SamplingConfig(1.0)),
        ([3, 1], "iid", SamplingConfig(1.0, top_k=5)),
        ([2, 2], "without_replacement", SamplingConfig(1.0, top_k=8, top_p=0.8)),
    ],
)
def test_two_token_joint_law_matches_target(small_pair, tree, mode, sampling):
    target, draft = small_pair
    res = tree_generate(target, [PROMPT] * ROWS, draft, tree, max_new_tokens=2, temperature=1.0, top_k=sampling.top_k,
                        top_p=sampling.top_p, eos_token_id=[], seed=3, tree_mode=mode)
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, two_token_law(target, sampling)) > 1e-3
    assert res.stats.accepted_tokens > 0


def first_child_without_residual(spec, tokens, draft_probs, target_probs, generator, mode):
    """Negative control for a one-level tree: accept the first child with r·q(x) < p(x) against the ORIGINAL p."""
    rows = torch.arange(tokens.shape[0])
    x, q, p = tokens[:, 1:], draft_probs[:, 0], target_probs[:, 0]
    ok = torch.rand(x.shape, generator=generator) * q.gather(1, x) < p.gather(1, x)
    found = ok.any(1)
    child = 1 + ok.long().argmax(1)
    residual = (p - q).clamp_min(0)
    bonus = sample(torch.where(found[:, None], target_probs[rows, child], residual / residual.sum(-1, keepdim=True)), generator)
    path = torch.where(found, child, -1)[:, None]
    return TreeVerifyResult(path=path, num_accepted=found.long(), next_token=bonus)


def test_negative_control_first_matching_child_without_residual_fails(small_pair, monkeypatch):
    target, draft = small_pair
    monkeypatch.setattr("specdec.loop.tree_decoding.verify_tree", first_child_without_residual)
    res = tree_generate(target, [PROMPT] * ROWS, draft, [3], max_new_tokens=2, temperature=1.0, eos_token_id=[],
                        seed=3, tree_mode="iid")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, two_token_law(target, SamplingConfig(1.0))) < 1e-8


def test_greedy_rows_do_not_depend_on_the_batch(small_pair):
    target, draft = small_pair
    alone = tree_generate(target, [PROMPT], draft, [2, 1], max_new_tokens=6, temperature=0, eos_token_id=[])
    batched = tree_generate(target, [[7, 7], PROMPT, [1]], draft, [2, 1], max_new_tokens=6, temperature=0, eos_token_id=[])
    assert alone.sequences[0] == batched.sequences[1]


def test_argument_errors(llama, llama_draft):
    with pytest.raises(ValueError, match="draft_tree"):
        tree_generate(llama, [[1]], llama_draft, [0])
    with pytest.raises(ValueError, match="tree_mode"):
        tree_generate(llama, [[1]], llama_draft, [2], tree_mode="beam")
    with pytest.raises(ValueError, match="drafter"):
        tree_generate(llama, [[1]], None, [2])
    with pytest.raises(TypeError, match="drafter"):
        tree_generate(llama, [[1]], specdec.PromptLookupDrafter(), [2])
    with pytest.raises(ValueError, match="max_new_tokens"):
        tree_generate(llama, [[1]], llama_draft, [2], max_new_tokens=-1)


def test_through_specdec_generate(llama, llama_draft):
    res = specdec.generate(llama, RAGGED_PROMPTS, drafter=llama_draft, max_new_tokens=8, temperature=0, eos_token_id=[],
                           draft_tree=[2, 1])
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(llama, prompt, 8, [])
    events = list(specdec.stream(llama, RAGGED_PROMPTS, drafter=llama_draft, max_new_tokens=8, temperature=0,
                                 eos_token_id=[], draft_tree=[2, 1]))
    assert sum(len(t) for e in events for t in e.tokens) == 8 * len(RAGGED_PROMPTS)
    with pytest.raises(ValueError, match="draft_tree"):  # the engine drafts trees with a draft model only
        specdec.generate(llama, [[1]], drafter=specdec.PromptLookupDrafter(), draft_tree=[2], engine="fast")
