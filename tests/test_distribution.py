"""Speculative sampling reproduces the target's standardized law exactly (chi-square, fixed seeds).

Each test has a negative control: a deliberately wrong rule must fail the same test.
"""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, sample, standardize_logits, verify
from specdec.drafters.model import ModelDrafter
from stats_utils import chi2_pvalue

PASS = 1e-3  # fixed seeds make these deterministic; a correct rule passes far above this
FAIL = 1e-8

V = 8
P = torch.tensor(
    [
        [0.30, 0.05, 0.20, 0.00, 0.15, 0.10, 0.10, 0.10],
        [0.05, 0.40, 0.05, 0.20, 0.00, 0.10, 0.10, 0.10],
        [0.10, 0.10, 0.10, 0.10, 0.20, 0.20, 0.10, 0.10],
    ]
)  # p_1, p_2, p_3 (the last is the bonus law for γ = 2)
Q = torch.tensor(
    [
        [0.10, 0.30, 0.10, 0.20, 0.10, 0.10, 0.05, 0.05],
        [0.05, 0.60, 0.05, 0.05, 0.05, 0.05, 0.10, 0.05],
    ]
)
N = 200_000


def run_core(rule=verify, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = Q.expand(N, -1, -1)
    drafts = sample(q, g)  # [N, 2] drawn from q
    res = rule(drafts, q.contiguous(), P.expand(N, -1, -1).contiguous(), g)
    return drafts, res


def wrong_residual(drafts, q, p, g):
    """Bug: on rejection sample from p instead of norm(max(0, p − q))."""
    res = verify(drafts, q, p, g)
    redo = sample(p.gather(1, res.num_accepted[:, None, None].expand(-1, 1, V)).squeeze(1), g)
    return type(res)(res.num_accepted, torch.where(res.num_accepted < 2, redo, res.next_token), res.beta)


def test_first_token_follows_p1():
    drafts, res = run_core()
    first = torch.where(res.num_accepted > 0, drafts[:, 0], res.next_token).numpy()
    assert chi2_pvalue(first, P[0].numpy()) > PASS


def test_token_after_rejection_follows_residual():
    drafts, res = run_core()
    rejected_first = res.num_accepted == 0
    residual = (P[0] - Q[0]).clamp_min(0)
    assert chi2_pvalue(res.next_token[rejected_first].numpy(), (residual / residual.sum()).numpy()) > PASS
    # and the fraction rejected at position 1 is 1 − β
    beta = torch.minimum(P[0], Q[0]).sum()
    assert rejected_first.float().mean().item() == pytest.approx(1 - beta.item(), abs=0.005)


def test_bonus_token_follows_last_target_distribution():
    drafts, res = run_core()
    all_accepted = res.num_accepted == 2
    assert all_accepted.sum() > 5000
    assert chi2_pvalue(res.next_token[all_accepted].numpy(), P[2].numpy()) > PASS


def test_second_token_follows_p2():
    drafts, res = run_core()
    second = torch.where(res.num_accepted >= 2, drafts[:, 1], res.next_token)
    reached = res.num_accepted >= 1  # the second token came from step-1 drafts or the position-2 residual
    assert chi2_pvalue(second[reached].numpy(), P[1].numpy()) > PASS


def test_negative_control_wrong_residual_fails():
    drafts, res = run_core(wrong_residual)
    first = torch.where(res.num_accepted > 0, drafts[:, 0], res.next_token).numpy()
    assert chi2_pvalue(first, P[0].numpy()) < FAIL


# ------------------------------------------------------------------------------------------------
# End to end: the joint law of the first two generated tokens of a real (tiny) model.

PROMPT = [3, 1, 4, 1, 5]
ROWS = 12_000


def exact_two_token_law(model, sampling: SamplingConfig) -> np.ndarray:
    """P(t1, t2) = p(t1 | prompt) · p(t2 | prompt, t1), flattened to [V·V]."""
    vocab = model.config.vocab_size
    with torch.no_grad():
        p1 = standardize_logits(model(torch.tensor([PROMPT])).logits[0, -1], sampling)
        seqs = torch.tensor([PROMPT + [t] for t in range(vocab)])
        p2 = standardize_logits(model(seqs).logits[:, -1], sampling)
    return (p1[:, None] * p2).flatten().double().numpy()


def engine_two_token_pairs(engine, rows: int, vocab: int = 16) -> np.ndarray:
    """The first two tokens of `rows` T=1 requests for PROMPT on `engine`, as t1·V + t2: [rows].

    Request i is seeded with i, so the sample (and the test's p-value) is the same on every run: an unseeded request
    draws fresh OS randomness, and a correct rule then fails a 1e-3 threshold one run in a thousand."""
    from specdec.request import SamplingParams

    index = {engine.add_request(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=2, seed=i)): i
             for i in range(rows)}
    tokens = [[] for _ in range(rows)]
    while engine.has_unfinished():
        for out in engine.step():
            tokens[index[out.request_id]].extend(out.new_token_ids)
    return np.array([a * vocab + b for a, b in tokens])


@pytest.fixture(scope="module")
def small_vocab_pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


SAMPLING_CASES = [
    (SamplingConfig(temperature=1.0), 1),
    (SamplingConfig(temperature=1.0), 3),
    (SamplingConfig(temperature=0.7, top_k=6), 2),
    (SamplingConfig(temperature=1.3, top_p=0.8), 3),
]


@pytest.mark.parametrize("sampling, gamma", SAMPLING_CASES)
def test_two_token_joint_law_matches_target(small_vocab_pair, sampling, gamma):
    target, draft = small_vocab_pair
    res = specdec.generate(
        # 3 new tokens so that a step may draft γ = 2 (a step never drafts more than it can commit); the test
        # looks at the first two, whose law involves the first two verified positions
        target, [PROMPT] * ROWS, drafter=draft, max_new_tokens=3, temperature=sampling.temperature,
        top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=gamma, seed=1, eos_token_id=[],
    )
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) > PASS
    assert 0 < res.stats.alpha < 1


@pytest.mark.parametrize("drafter_kind", ["bigram", "prompt_lookup"])
def test_two_token_law_with_table_and_lookup_drafters(small_vocab_pair, drafter_kind):
    target, _ = small_vocab_pair
    drafter = (
        specdec.NGramDrafter(2).fit([PROMPT * 5, list(range(16)) * 3], 16)
        if drafter_kind == "bigram"
        else specdec.PromptLookupDrafter(max_ngram_size=2)
    )
    prompt = PROMPT + [3, 1]  # "3 1" occurs earlier: prompt lookup proposes "4 1 5"
    res = specdec.generate(
        target, [prompt] * ROWS, drafter=drafter, max_new_tokens=3, temperature=1.0, num_draft_tokens=3, seed=2,
        eos_token_id=[],
    )
    with torch.no_grad():
        p1 = model_probs(target, prompt)
        p2 = torch.stack([model_probs(target, prompt + [t]) for t in range(16)])
    law = (p1[:, None] * p2).flatten().double().numpy()
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, law) > PASS
    assert res.stats.accepted_tokens > 0  # the drafter really proposed accepted tokens


def model_probs(model, prefix):
    return standardize_logits(model(torch.tensor([prefix])).logits[0, -1], SamplingConfig())


class LyingDrafter(ModelDrafter):
    """The common public bug: report one q, sample from another (here: report the uniform law)."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = super().propose(context, num_draft_tokens, sampling, generator)
        uniform = torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return type(proposal)(proposal.tokens, uniform, proposal.lengths, proposal.forward_passes)


def test_negative_control_drafter_reporting_wrong_q_fails(small_vocab_pair):
    target, draft = small_vocab_pair
    sampling = SamplingConfig(temperature=1.0)
    res = specdec.generate(
        target, [PROMPT] * ROWS, drafter=LyingDrafter(draft), max_new_tokens=3, temperature=1.0,
        num_draft_tokens=3, seed=1, eos_token_id=[],
    )
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) < FAIL


def test_plain_sampling_follows_target(small_vocab_pair):
    target, _ = small_vocab_pair
    sampling = SamplingConfig(temperature=0.9, top_k=8)
    res = specdec.generate(target, [PROMPT] * ROWS, max_new_tokens=2, temperature=0.9, top_k=8, seed=3, eos_token_id=[])
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) > PASS


def test_seed_makes_runs_reproducible(small_vocab_pair):
    target, draft = small_vocab_pair
    a = specdec.generate(target, [PROMPT] * 50, drafter=draft, max_new_tokens=8, seed=7, eos_token_id=[],
                         temperature=1.0).sequences
    b = specdec.generate(target, [PROMPT] * 50, drafter=draft, max_new_tokens=8, seed=7, eos_token_id=[],
                         temperature=1.0).sequences
    c = specdec.generate(target, [PROMPT] * 50, drafter=draft, max_new_tokens=8, seed=8, eos_token_id=[],
                         temperature=1.0).sequences
    assert a == b and a != c
