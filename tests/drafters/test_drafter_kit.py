"""The drafter test kit: every drafter's reported q is the law it really samples from."""

from types import SimpleNamespace

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


def engine_proposals(target, drafter, params, gamma: int = 2) -> SimpleNamespace:
    """About ROWS drafts of `drafter` on the engine over `target` from CONTEXT (256 rows a step, fresh seeds each
    step) → (tokens `[N, γ]`, probs `[N, γ, V]`): the engine drafter's proposals for `check_reported_q`."""
    from specdec.engine import Engine, EngineConfig
    from specdec.engine.drafters import Flavor, StepView

    engine = Engine(target, drafter, EngineConfig(max_batch_size=256, max_seq_len=32, num_draft_tokens=gamma))
    for _ in range(256):
        engine.add_request(CONTEXT, params)
    tokens, probs = [], []
    with torch.inference_mode():
        engine._admit([])
        view = StepView(engine.state, 256, 32, Flavor.of(params))
        for i in range(ROWS // 256 + 1):
            engine.state.seed[:256] = torch.arange(256) + 256 * i  # fresh draws for the same context
            proposal = engine.drafter.propose(view, gamma)
            tokens.append(proposal.tokens)
            probs.append(proposal.probs)
    return SimpleNamespace(tokens=torch.cat(tokens), probs=torch.cat(probs))


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


@pytest.mark.parametrize("order", [1, 2])
def test_ngram_greedy_drafts_follow_the_argmax_of_q(order):
    """Greedy drafting reads a precomputed argmax table: it must chain argmax q(· | prev) exactly, and refit
    must rebuild the table."""
    corpus = [CONTEXT * 3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 4]
    drafter = specdec.NGramDrafter(order, top_k_successors=4).fit(corpus, 16)
    context = TokenBuffer([[3, 1], [7]], capacity=8)
    for _ in range(2):
        tokens = drafter.propose(context, 6, SamplingConfig(0.0), None).tokens
        prev = torch.tensor([1, 7])
        for i in range(6):
            prev = drafter._distribution(prev).argmax(-1)
            assert torch.equal(tokens[:, i], prev)
        drafter.fit([[5, 9, 5, 9, 5, 9]], 16)  # the second round checks the table of the new fit


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


# ------------------------------------------------------------------------------------------------
# Hierarchical drafts: the middle model decoded speculatively reports ITS law, which the samples follow.

from helpers import UnverifiedHierarchicalDrafter as _Unverified  # noqa: E402
from specdec.drafters.hierarchical import HierarchicalDrafter  # noqa: E402


def _inner(kind, make_llama):
    if kind == "bigram":
        return specdec.NGramDrafter(2, top_k_successors=4).fit([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 4], 16)
    return ModelDrafter(make_llama(6, layers=1, hidden=16, vocab=16))


@pytest.mark.parametrize(
    "inner, sampling",
    [("bigram", SamplingConfig(1.0)), ("model", SamplingConfig(0.8, top_k=6)), ("bigram", SamplingConfig(1.1, top_p=0.8))],
)
def test_hierarchical_drafter_reports_the_middle_models_law(make_llama, inner, sampling):
    middle = make_llama(5, layers=1, vocab=16)
    drafter = HierarchicalDrafter(middle, drafter=_inner(inner, make_llama), num_inner_draft_tokens=3)
    proposal = propose_many(drafter, 16, sampling, gamma=3)
    check_reported_q(proposal)
    # ... and that law is the middle model's own standardized distribution
    plain, one = ModelDrafter(middle), TokenBuffer([CONTEXT], 16)
    plain.begin(one, 16)
    plain = plain.propose(one, 1, sampling, torch.Generator().manual_seed(0))
    assert torch.allclose(proposal.probs[0, 0], plain.probs[0, 0], atol=1e-5)
    assert drafter.counters.inner_drafted > 0 and drafter.counters.middle_calls >= 1


def test_hierarchical_nests(make_llama):
    middle, lower = make_llama(5, layers=1, vocab=16), make_llama(7, layers=1, vocab=16)
    drafter = HierarchicalDrafter(middle, drafter=HierarchicalDrafter(lower, drafter=_inner("bigram", make_llama)))
    check_reported_q(propose_many(drafter, 16, SamplingConfig(1.0), gamma=2))


def test_negative_control_unverified_hierarchy_fails_the_kit(make_llama):
    middle = make_llama(5, layers=1, vocab=16)
    proposal = propose_many(_Unverified(middle, drafter=_inner("bigram", make_llama)), 16, SamplingConfig(1.0))
    assert chi2_pvalue(proposal.tokens[:, 0].numpy(), proposal.probs[0, 0].double().numpy()) < 1e-8
