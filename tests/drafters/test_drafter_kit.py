"""The drafter test kit: every drafter's reported q is the law it really samples from."""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig
from specdec.drafters.model import ModelDrafter
from specdec.sequences import TokenBuffer
from stats_utils import chi2_pvalue

ROWS = 20_000
CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6]


def propose_many(drafter, vocab, sampling, gamma=2, seed=0):
    context = TokenBuffer([CONTEXT] * ROWS, capacity=len(CONTEXT) + 8)
    drafter.begin(context, vocab)
    return drafter.propose(context, gamma, sampling, torch.Generator().manual_seed(seed))


def check_reported_q(proposal):
    tokens, probs = proposal.tokens, proposal.probs
    # x_1: every row has the same context, so the same q_1
    assert torch.allclose(probs[:, 0], probs[0:1, 0].expand_as(probs[:, 0]), atol=1e-6)
    assert chi2_pvalue(tokens[:, 0].numpy(), probs[0, 0].double().numpy()) > 1e-3
    # x_2 given the most frequent x_1: q_2 is shared by those rows
    x1 = int(torch.mode(tokens[:, 0]).values)
    rows = tokens[:, 0] == x1
    assert rows.sum() > 500
    assert chi2_pvalue(tokens[rows, 1].numpy(), probs[rows.nonzero()[0, 0], 1].double().numpy()) > 1e-3


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.6, top_k=5), SamplingConfig(1.2, top_p=0.7)])
def test_model_drafter_reports_the_q_it_samples(make_llama, sampling):
    drafter = ModelDrafter(make_llama(5, layers=1, vocab=16))
    check_reported_q(propose_many(drafter, 16, sampling))


@pytest.mark.parametrize("order", [1, 2])
def test_ngram_drafter_reports_the_q_it_samples(order):
    corpus = [CONTEXT * 3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 4]
    drafter = specdec.NGramDrafter(order, top_k_successors=4).fit(corpus, 16)
    check_reported_q(propose_many(drafter, 16, SamplingConfig(0.9, top_k=10)))


def test_ngram_q_is_a_distribution_over_the_vocabulary():
    drafter = specdec.NGramDrafter(2, top_k_successors=2).fit([[1, 2, 1, 3, 1, 4, 1, 2]], 8)
    q = drafter._distribution(torch.tensor([1, 7]))
    assert torch.allclose(q.sum(-1), torch.ones(2))
    assert q[0, 2] > q[0, 3] > q[0, 5]  # 1→2 twice, 1→3 once, 1→5 never
    assert (q > 0).all()  # smoothing: every token possible, so sampling stays exact


def test_ngram_fit_errors():
    with pytest.raises(ValueError, match="order"):
        specdec.NGramDrafter(3)
    with pytest.raises(ValueError, match="no tokens"):
        specdec.NGramDrafter(2).fit([[]], 8)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        specdec.NGramDrafter(2).fit([[1, 9]], 8)
    with pytest.raises(ValueError, match="not fitted"):
        specdec.NGramDrafter(2).begin(TokenBuffer([[1]], 4), 8)


def test_prompt_lookup_is_deterministic_and_copies_latest_match():
    drafter = specdec.PromptLookupDrafter(max_ngram_size=2)
    ctx = TokenBuffer([[1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2], [7, 8, 9], [5, 5]], capacity=20)
    a = drafter.propose(ctx, 3, SamplingConfig(), torch.Generator().manual_seed(0))
    b = drafter.propose(ctx, 3, SamplingConfig(), torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens) and a.probs is None
    assert a.tokens[0].tolist() == [4, 5, 6]  # "1 2" last occurred before "4 5 6"
    assert a.lengths.tolist() == [3, 0, 1]  # no match in row 1; row 2 copies the single 5
    assert a.tokens[2, 0].item() == 5


def test_prompt_lookup_argument_errors():
    with pytest.raises(ValueError, match="ngram"):
        specdec.PromptLookupDrafter(max_ngram_size=1, min_ngram_size=2)
