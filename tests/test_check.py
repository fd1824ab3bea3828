"""`specdec.check`: passes on a correct pair and runner, fails on a drafter that misreports q or a verifier with
the resample-from-p bug, says "underpowered" when a wrong law survives, and validates every argument."""

import json

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, sample, verify
from specdec.drafters.model import ModelDrafter
from specdec.exactness.laws import LAWS, build_tree, position_cells
from specdec.strict_json import dumps

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]
TRIALS = 1500  # the peaked tiny pair below rejects every wrong law far below 1e-4 with this many


@pytest.fixture(scope="module")
def pair(make_llama):
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    with torch.no_grad():  # peaked laws, as trained models have (random ones are near uniform)
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    return target, draft


class LyingDrafter(ModelDrafter):
    """Reports the uniform law as q while sampling from its model's q (the common public bug)."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = super().propose(context, num_draft_tokens, sampling, generator)
        uniform = torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return type(proposal)(proposal.tokens, uniform, proposal.lengths, proposal.forward_passes)


def resample_from_p(draft_tokens, draft_probs, target_probs, generator=None, *, draft_lengths=None, leniency=1.0,
                    **kw):
    """A mis-verified rule: after a rejection, sample from p instead of norm(max(0, p − q))."""
    result = verify(draft_tokens, draft_probs, target_probs, generator, draft_lengths=draft_lengths, leniency=leniency)
    lengths = draft_lengths
    if lengths is None:
        lengths = torch.full_like(result.num_accepted, draft_tokens.shape[1])
    rejected = result.num_accepted < lengths
    at = result.num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    redo = sample(target_probs.gather(1, at).squeeze(1), generator)
    return type(result)(result.num_accepted, torch.where(rejected, redo, result.next_token), result.beta)


@pytest.mark.parametrize("engine, sampling", [("hf", {}), ("fast", {}), ("hf", {"temperature": 0.8, "top_k": 5}),
                                              ("fast", {"temperature": 1.2, "top_p": 0.8})])
def test_a_correct_pair_passes_with_power(pair, engine, sampling):
    target, draft = pair
    result = specdec.check(target, draft, PROMPTS, engine=engine, trials=TRIALS, num_draft_tokens=3,
                           greedy_tokens=12, **sampling)
    assert result.status == "pass", result.reasons
    assert result.passed and result.power is True and result.reasons == () and result.runner == engine
    assert [p.position for p in result.positions] == [1, 2, 3]
    for pos in result.positions:
        assert pos.law.p_value >= 1e-4 and pos.law.impossible == 0 and pos.law.samples == TRIALS
        assert pos.drafter.p_value < 1e-4 and pos.resample_from_p.p_value < 1e-4  # the negative controls
    assert result.worst_p_value == min(p.law.p_value for p in result.positions)
    assert sum(result.trials_per_prompt) == TRIALS and len(result.prompts) == 4  # num_prompts, from 3 prompts
    assert result.greedy.identical == result.greedy.prompts == len(PROMPTS)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_a_table_drafter_passes(pair, engine):
    """A deterministic drafter (one-hot q, asked through `Drafter.propose`): the same law test and controls."""
    target, _ = pair
    bigram = specdec.NGramDrafter(2).fit([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5] * 4, list(range(16)) * 3], 16)
    result = specdec.check(target, bigram, [p * 2 for p in PROMPTS], engine=engine, trials=TRIALS,
                           num_draft_tokens=3, greedy_tokens=8)
    assert result.status == "pass", result.reasons
    assert all(p.resample_from_p.p_value < 1e-4 <= p.law.p_value for p in result.positions)


def test_without_q_power_comes_from_the_generic_wrong_law(pair, monkeypatch):
    """A drafter whose q cannot be computed outside the engine (a feature head): the cooler law is the control."""
    import specdec.exactness.certify as certify
    import specdec.exactness.laws as laws

    monkeypatch.setattr(laws, "drafter_laws", lambda *a, **k: None)
    monkeypatch.setattr(certify, "drafter_laws", lambda *a, **k: None)
    target, draft = pair
    result = specdec.check(target, draft, PROMPTS, engine="hf", trials=TRIALS, num_draft_tokens=3, greedy_tokens=0)
    assert result.status == "pass" and result.power is True
    assert all(p.drafter is None and p.resample_from_p is None and p.cooler.p_value < 1e-4 for p in result.positions)
    assert any("generic wrong law" in why for why in result.reasons)


def test_a_feature_head_on_the_engine_passes_with_the_generic_control(pair):
    """A real feature head (q only exists inside the engine, from the target's features): law tested, power shown by
    the generic wrong law."""
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    target, _ = pair
    trainable = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    trainable.init_from(target)
    result = specdec.check(target, trainable.to_feature_head(), PROMPTS[:2], engine="fast", trials=4000, positions=2,
                           num_draft_tokens=3, greedy_tokens=8)
    assert result.status == "pass", result.reasons
    assert all(p.drafter is None and p.cooler.p_value < 1e-4 <= p.law.p_value for p in result.positions)
    assert result.greedy.identical == 2 and result.runner == "fast"


def test_a_drafter_that_misreports_q_fails(pair):
    target, draft = pair
    result = specdec.check(target, LyingDrafter(draft), PROMPTS, engine="hf", trials=TRIALS, num_draft_tokens=3,
                           greedy_tokens=0)
    assert result.status == "fail" and not result.passed
    assert result.worst_p_value < 1e-4
    assert any("do not follow the target's law" in why for why in result.reasons)


def test_a_verifier_that_resamples_from_p_fails(pair, monkeypatch):
    import specdec.loop.chain

    target, draft = pair
    monkeypatch.setattr(specdec.loop.chain, "verify", resample_from_p)
    result = specdec.check(target, draft, PROMPTS, engine="hf", trials=TRIALS, num_draft_tokens=3, greedy_tokens=0)
    assert result.status == "fail", [p.law.p_value for p in result.positions]
    assert result.positions[0].law.p_value < 1e-4


def test_a_drafter_equal_to_the_target_is_underpowered(pair):
    """q = p: every wrong law is the target law, so no test on these trials could show a verification bug."""
    target, _ = pair
    result = specdec.check(target, target, PROMPTS, engine="hf", trials=300, greedy_tokens=4)
    assert result.status == "underpowered" and result.power is False
    assert all(p.law.p_value >= 1e-4 for p in result.positions)
    assert any("underpowered" in why for why in result.reasons)


def test_greedy_only_at_temperature_zero(pair):
    target, draft = pair
    result = specdec.check(target, draft, PROMPTS, temperature=0, engine="fast", greedy_tokens=16)
    assert result.status == "pass" and result.positions == () and result.power is None
    assert result.greedy.identical == 3 and result.greedy.new_tokens == 16 and result.trials == 0


def test_greedy_difference_fails(pair, monkeypatch):
    """A runner whose speculative greedy output differs from plain decoding is a failure, with the first difference."""
    import specdec.exactness.certify as certify

    target, draft = pair
    real = specdec.generate

    def off_by_one(target, prompts, drafter=None, **kw):
        result = real(target, prompts, drafter=drafter, **kw)
        if drafter is not None:
            result.sequences[1][2] = (result.sequences[1][2] + 1) % 16
        return result

    monkeypatch.setattr(specdec, "generate", off_by_one)
    result = certify.check(target, draft, PROMPTS, temperature=0, engine="hf", greedy_tokens=8)
    assert result.status == "fail" and result.greedy.identical == 2
    assert result.greedy.first_difference.prompt == 1 and result.greedy.first_difference.position == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_difference_at_an_exact_tie_fails_only_in_fp32(make_llama, monkeypatch, dtype):
    """All logits equal (a zeroed head): any token is an argmax. In fp32 a difference still fails (fp32 is exact
    on every runner); in bf16 it is reported as a near-tie, not a failure."""
    target, draft = make_llama(12, vocab=16).to(dtype), make_llama(13, layers=1, vocab=16).to(dtype)
    with torch.no_grad():
        target.lm_head.weight.zero_()
    real = specdec.generate

    def flip_one(target, prompts, drafter=None, **kw):
        result = real(target, prompts, drafter=drafter, **kw)
        if drafter is not None:
            result.sequences[0][1] = (result.sequences[0][1] + 1) % 16
        return result

    monkeypatch.setattr(specdec, "generate", flip_one)
    result = specdec.check(target, draft, PROMPTS, temperature=0, engine="hf", greedy_tokens=3)
    difference = result.greedy.first_difference
    assert difference.prompt == 0 and difference.position == 2 and difference.margin == 0.0
    if dtype == torch.float32:
        assert result.status == "fail" and not difference.tie and result.greedy.failed
    else:
        assert result.status == "pass" and difference.tie and result.greedy.ties == 1
        assert any("near-tie" in why for why in result.reasons)


def test_result_is_strict_json(pair):
    target, draft = pair
    result = specdec.check(target, draft, PROMPTS[:1], engine="hf", trials=200, positions=2, greedy_tokens=2)
    data = json.loads(dumps(result.to_dict()))
    assert data["status"] == result.status and data["positions"][0]["law"]["dof"] == result.positions[0].law.dof
    assert data["prompts"] == [list(p) for p in result.prompts] and data["timings"]["total_s"] > 0


def test_prompts_are_the_most_telling_prefixes(pair):
    target, draft = pair
    long = [list(range(1, 13)), [2, 4, 6, 8, 10, 12, 14]]
    result = specdec.check(target, draft, long, engine="hf", trials=100, positions=2, num_prompts=3,
                           max_prompt_tokens=5, greedy_tokens=0)
    assert len(result.prompts) == 3
    assert all(2 <= len(p) <= 5 for p in result.prompts)
    assert {tuple(p[:1]) for p in result.prompts} == {(1,), (2,)}  # one prefix of each prompt first


def test_law_cells_sum_to_the_trials(pair):
    """Under every law, the expected counts of each prompt's cells sum to its trials (the tree covers all mass)."""
    target, draft = pair
    trials = [400, 250]
    tree = build_tree(target, draft, PROMPTS[:2], trials, 3, SamplingConfig(1.0))
    samples = [[[0, 0, 0]] * n for n in trials]
    for depth in range(3):
        observed, expected, groups = position_cells(tree, depth, samples, trials)
        assert expected.shape == (len(LAWS), len(observed))
        for g, n in enumerate(trials):
            assert observed[groups == g].sum() == n
            np.testing.assert_allclose(expected[:, groups == g].sum(1), n, rtol=1e-9)


@pytest.mark.parametrize("kwargs, message", [
    ({"trials": 0}, "trials must be >= 1"), ({"trials": 10**7}, "trials must be <="),
    ({"positions": 7}, "positions must be <="), ({"positions": 1}, "positions must be >= 2"),
    ({"level": 0.7}, "level must be"), ({"engine": "vllm"}, "engine"),
    ({"num_draft_tokens": 0}, "num_draft_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"num_prompts": 0}, "num_prompts"), ({"greedy_tokens": -1}, "greedy_tokens"),
])
def test_arguments_are_checked_first(pair, kwargs, message):
    target, draft = pair
    with pytest.raises((ValueError, TypeError), match=message):
        specdec.check(target, draft, PROMPTS, **kwargs)


@pytest.mark.parametrize("prompts, drafter, message", [
    ([], "draft", "prompts"), ([[1, 99]], "draft", "outside the target's vocabulary"), ([[]], "draft", "prompts"),
    ([[1] * 5000], "draft", "at most 4096"),
    (PROMPTS, None, "needs a drafter"),
])
def test_bad_prompts_and_missing_drafter(pair, prompts, drafter, message):
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        specdec.check(target, draft if drafter else None, prompts)


def test_forbidden_tokens_fail_outright_only_in_fp32():
    """bf16 runners and reference passes round differently at a top-k / top-p cut: there a forbidden token only
    counts in the "other" cell; in fp32 it is an impossible outcome."""
    from specdec.exactness.laws import _node

    laws = np.array([[0.6, 0.4, 0.0, 0.0]] * 3)
    strict = _node(0, (), np.ones(3), laws, 100, expand=False)
    lenient = _node(0, (), np.ones(3), laws, 100, expand=False, strict_support=False)
    assert strict.forbidden == {2, 3} and strict.cell_of(3) == len(strict.tokens) + 1
    assert lenient.forbidden == frozenset() and lenient.cell_of(3) == len(lenient.tokens)
    np.testing.assert_allclose(strict.cells[0], [0.6, 0.4, 0.0, 0.0])
