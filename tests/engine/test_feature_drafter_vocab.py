"""A feature head with a reduced draft vocabulary: exact greedy output, q = the reduced softmax mapped into the full
vocabulary (zero elsewhere) and the law of its drafts, the target's two-token law, save/load, bad vocabularies."""

from types import SimpleNamespace

import pytest
import torch

import specdec
from engine.test_feature_drafter import FAIL, PASS, ROWS, _two_token_pairs, start_head
from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.core import SamplingConfig
from specdec.engine import Engine, EngineConfig
from specdec.engine.drafters import StepView
from specdec.fast.head import FeatureHead
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import exact_two_token_law

SMALL = [0, 2, 3, 5, 7, 8, 11, 13, 14]  # the draft vocabulary of the 16-token pair


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(0)


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(10, vocab=16)
    return target, start_head(target).set_draft_vocab(torch.tensor(SMALL))


def test_greedy_is_the_targets_with_a_reduced_vocabulary(target):
    head = start_head(target).set_draft_vocab(torch.arange(0, target.config.vocab_size, 3))
    prompts = RAGGED_PROMPTS + [list(range(3, 50))]
    refs = [hf_greedy(target, p, 24, []) for p in prompts]
    for gamma in (1, 4):
        res = specdec.generate(target, prompts, drafter=head, max_new_tokens=24, temperature=0,
                               num_draft_tokens=gamma, eos_token_id=[], engine="fast")
        assert res.sequences == refs, gamma


def test_logits_are_the_reduced_scores_and_the_minimum_elsewhere(pair):
    target, head = pair
    engine = Engine(target, head, EngineConfig(max_batch_size=1, max_seq_len=32, num_draft_tokens=2))
    bound = engine.drafter.head
    hidden = torch.randn(2, 3, bound.config.dim)
    logits = bound.logits(hidden)
    full = hidden @ engine.model.lm_head.T
    inside = torch.zeros(16, dtype=torch.bool)
    inside[SMALL] = True
    torch.testing.assert_close(logits[..., inside], full[..., inside])
    assert (logits[..., ~inside] == torch.finfo(torch.float32).min).all()
    q = torch.softmax(logits, -1)
    assert (q[..., ~inside] == 0).all()
    torch.testing.assert_close(q[..., inside], torch.softmax(full[..., inside], -1))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, max_new_tokens=4),
                                    SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4)])
def test_kit_reported_q_is_the_law_of_the_drafts_and_zero_outside(pair, params):
    from drafters.test_drafter_kit import check_reported_q, engine_proposals

    proposal = engine_proposals(*pair, params)
    tokens, probs = proposal.tokens, proposal.probs
    outside = torch.ones(16, dtype=torch.bool)
    outside[SMALL] = False
    assert (probs[..., outside] == 0).all() and not torch.isin(tokens, torch.nonzero(outside)[:, 0]).any()
    check_reported_q(SimpleNamespace(tokens=tokens, probs=probs))
    full = probs.clone()
    full[..., outside] += 0.05  # negative control: the full-vocabulary law reported for reduced-vocabulary draws
    with pytest.raises(AssertionError):
        check_reported_q(SimpleNamespace(tokens=tokens, probs=full / full.sum(-1, keepdim=True)))


def test_two_token_law_is_the_targets(pair):
    """Drafts never propose 7 of the 16 tokens; the rejection rule's residual still gives them their p mass."""
    target, head = pair
    pairs, stats = _two_token_pairs(target, head)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) > PASS
    assert 0 < stats.alpha < 1 and stats.accepted_tokens > ROWS // 10


def test_two_token_law_negative_control(pair, monkeypatch):
    """The same test fails when q is misreported: the drafts come from the reduced softmax, the rule is told a law
    that puts mass on the tokens outside it (a head that forgot to map its q into the full vocabulary)."""
    target, head = pair
    real = StepView.draw

    def misreported(self, logits, position):
        token, q = real(self, logits, position)
        return token, None if q is None else 0.5 * q + 0.5 / q.shape[-1]

    monkeypatch.setattr(StepView, "draw", misreported)
    pairs, _ = _two_token_pairs(target, head, ROWS // 3)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) < FAIL


def test_save_load_keeps_the_vocabulary(pair, tmp_path):
    target, head = pair
    head.save(tmp_path / "h")
    loaded = FeatureHead.load(tmp_path / "h")
    assert loaded.config.draft_vocab_size == len(SMALL) and loaded.draft_vocab.tolist() == SMALL
    head.save(tmp_path / "half", dtype=torch.bfloat16)
    half = FeatureHead.load(tmp_path / "half")
    assert half.dtype == torch.float32 and half.draft_vocab.tolist() == SMALL
    torch.testing.assert_close(half.fc, head.fc.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="dtype"):
        head.save(tmp_path / "x", dtype=torch.int8)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    a = specdec.generate(target, prompts, drafter=head, max_new_tokens=12, temperature=1.0, seed=3,
                         num_draft_tokens=3, eos_token_id=[], engine="fast")
    b = specdec.generate(target, prompts, drafter=tmp_path / "h", max_new_tokens=12, temperature=1.0, seed=3,
                         num_draft_tokens=3, eos_token_id=[], engine="fast")
    assert a.sequences == b.sequences and a.stats.accepted_tokens == b.stats.accepted_tokens


@pytest.mark.parametrize("ids, match", [([], "lie in"), ([1, 1, 2], "distinct"), ([3, 99], "lie in"),
                                        ([-1, 2], "lie in")])
def test_bad_vocabularies_are_refused(pair, ids, match):
    _, head = pair
    with pytest.raises(ValueError, match=match):
        head.copy_to("cpu", torch.float32).set_draft_vocab(torch.tensor(ids, dtype=torch.long))
