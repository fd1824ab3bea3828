"""HierarchicalDrafter end to end: greedy equality with transformers and the exact two-token law."""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, standardize_logits
from specdec.drafters.hierarchical import HierarchicalDrafter
from helpers import RAGGED_PROMPTS, hf_greedy
from helpers import UnverifiedHierarchicalDrafter as _Unverified
from stats_utils import chi2_pvalue


def bigram(vocab):
    return specdec.NGramDrafter(2).fit([list(range(vocab)) * 3, [5, 6, 7, 8] * 10], vocab)


@pytest.mark.parametrize("gamma, inner_k", [(3, 2), (5, 4)])
def test_greedy_equals_transformers_over_a_ragged_batch(llama, llama_draft, make_llama, gamma, inner_k):
    lower = make_llama(3, layers=1, hidden=16)
    inner = HierarchicalDrafter(lower, drafter=bigram(64), num_inner_draft_tokens=2)  # two levels of nesting
    drafter = HierarchicalDrafter(llama_draft, drafter=inner, num_inner_draft_tokens=inner_k)
    res = specdec.generate(llama, RAGGED_PROMPTS, drafter=drafter, max_new_tokens=12, temperature=0,
                           num_draft_tokens=gamma, eos_token_id=[])
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(llama, prompt, 12, [])
    # the middle model's drafts are its own greedy tokens: same acceptance as drafting it directly
    plain = specdec.generate(llama, RAGGED_PROMPTS, drafter=llama_draft, max_new_tokens=12, temperature=0,
                             num_draft_tokens=gamma, eos_token_id=[])
    assert res.stats.accepted_tokens == plain.stats.accepted_tokens
    assert drafter.counters.middle_calls <= res.stats.num_steps * gamma


def test_a_perfect_inner_drafter_saves_middle_passes(llama, llama_draft):
    # Inner = the middle model itself: every inner draft is accepted, so one middle pass yields k + 1 tokens.
    gamma, k = 5, 2
    drafter = HierarchicalDrafter(llama_draft, drafter=specdec.ModelDrafter(llama_draft), num_inner_draft_tokens=k)
    res = specdec.generate(llama, RAGGED_PROMPTS[:1], drafter=drafter, max_new_tokens=10, temperature=0,
                           num_draft_tokens=gamma, eos_token_id=[])
    assert res.sequences[0] == hf_greedy(llama, RAGGED_PROMPTS[0], 10, [])
    assert drafter.counters.inner_acceptance_rate == 1.0
    # each step drafts γ_s ≤ γ tokens (fewer at the tail) in ceil(γ_s / (k + 1)) middle passes
    drafted, calls = res.stats.drafted_tokens, drafter.counters.middle_calls
    assert drafted / (k + 1) <= calls <= drafted / (k + 1) + res.stats.num_steps
    assert calls < drafted  # fewer middle passes than a plain model drafter's one per drafted token


PROMPT = [3, 1, 4, 1, 5]
ROWS = 12_000


@pytest.mark.parametrize(
    "sampling, kind",
    [(SamplingConfig(1.0, top_k=6), "exact"), (SamplingConfig(1.0, top_p=0.8), "exact"), (SamplingConfig(1.0), "unverified")],
)
def test_two_token_joint_law_matches_target(make_llama, sampling, kind):
    target, middle = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    cls = HierarchicalDrafter if kind == "exact" else _Unverified  # negative control: must fail
    drafter = cls(middle, drafter=bigram(16), num_inner_draft_tokens=2)
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=drafter, max_new_tokens=2, temperature=1.0,
                           top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=3, seed=5, eos_token_id=[],
                           engine="hf")  # (the loop's inner speculation; the engine's sampled step drafts M_m's chain)
    with torch.no_grad():
        p1 = standardize_logits(target(torch.tensor([PROMPT])).logits[0, -1], sampling)
        p2 = standardize_logits(target(torch.tensor([PROMPT + [t] for t in range(16)])).logits[:, -1], sampling)
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    pvalue = chi2_pvalue(pairs, (p1[:, None] * p2).flatten().double().numpy())
    if kind == "exact":
        assert pvalue > 1e-3 and res.stats.accepted_tokens > 0
    else:
        assert pvalue < 1e-8


def test_argument_errors(llama_draft):
    with pytest.raises(ValueError, match="num_inner_draft_tokens"):
        HierarchicalDrafter(llama_draft, drafter=bigram(64), num_inner_draft_tokens=0)
    with pytest.raises(TypeError, match="drafter"):
        HierarchicalDrafter(llama_draft, drafter="ngram")
    with pytest.raises(ValueError, match="vocabulary"):
        HierarchicalDrafter(llama_draft, drafter=bigram(32))
