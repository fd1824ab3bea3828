"""The engine with a feature head (EAGLE-style) as drafter, CPU, no graphs: exact greedy output (γ 1, 3,
"auto", requests joining mid-flight), the target features it keeps, the first draft against the head run
offline, the joint law of two tokens at T=1 (chi-square, with a negative control), and the errors."""

from types import SimpleNamespace

import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, hf_greedy
from specdec import rng
from specdec.core import SamplingConfig
from specdec.engine import Engine, EngineConfig, UnsupportedModel
from specdec.engine.drafters import Flavor, StepView
from specdec.engine.slots import SlotCache, prefill_rows
from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import LlamaShape
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import engine_two_token_pairs, exact_two_token_law

PASS, FAIL = 1e-3, 1e-8
ROWS = 6000


def start_head(target) -> FeatureHead:
    """An untrained head that starts as the zoo trainer does (the target's last layer, fc passing features on):
    it drafts well enough on a tiny random target that steps accept several tokens."""
    from specdec.zoo.feature_head import TrainableHead

    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)
    return head.to_feature_head()


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(0)


@pytest.fixture(scope="module")
def head(target):
    return start_head(target)


def _text_features(engine, tokens):
    """The target's final-normed states over `tokens`, computed from scratch: `[len, dim]`."""
    model = engine.model
    cache = model.new_cache(1, len(tokens) + 8)
    _, hidden = model(torch.tensor([tokens]), cache, return_hidden=True, compute_logits=False)
    return hidden[0]


def test_greedy_is_the_targets_for_fixed_and_auto_gamma(target, head):
    prompts = RAGGED_PROMPTS + [list(range(3, 50))]
    refs = [hf_greedy(target, p, 24, []) for p in prompts]
    accepted = 0
    for gamma in (1, 3, "auto"):
        res = specdec.generate(target, prompts, drafter=head, max_new_tokens=24, temperature=0,
                               num_draft_tokens=gamma, eos_token_id=[], engine="fast")
        assert res.sequences == refs, gamma
        accepted += res.stats.accepted_tokens
    assert accepted > 0  # steps committed several tokens (the features of accepted drafts were written)


def test_requests_join_mid_flight_and_features_stay_the_targets(target, head):
    engine = Engine(target, head, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=3,
                                               kv_layout="static"))  # (its stored features compared per slot)
    prompts = RAGGED_PROMPTS + [[4, 4, 9], [11, 12, 13, 14, 15, 16, 17, 18]]
    outputs, ids = {}, {}
    pending = list(enumerate(prompts))
    checked = 0
    while pending or engine.has_unfinished():
        if pending:  # one new request per step, while others run (finished ones free slots: moves)
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=9 + i))] = i
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
        for slot in range(engine.num_running):  # known features: positions [0, L − 1), as a fresh pass gives
            length = int(engine.state.lengths[slot])
            text = engine.state.tokens[slot, :length].tolist()
            kept = engine.state.feature_store.read(slice(slot, slot + 1), torch.arange(length - 1)[None])[0]  # (any layout)
            torch.testing.assert_close(kept, _text_features(engine, text)[: length - 1], atol=1e-5, rtol=1e-5)
            checked += 1
    assert checked > 5
    for i, prompt in enumerate(prompts):
        assert outputs[i] == hf_greedy(target, prompt, 9 + i, [])


def test_plain_steps_between_speculative_ones_leave_only_true_head_entries(target, head):
    """After speculative steps, plain steps and the catch-up, the head's cache below the proposal window holds
    exactly the entries (f_t, x_{t+1}) a fresh prefill writes (none left from drafts' predicted features)."""
    engine = Engine(target, head, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens="auto",
                                               kv_layout="static"))  # (its cache compared per slot)
    for prompt in RAGGED_PROMPTS:
        engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=40))
    drafter = engine.drafter
    for gamma in [3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]:
        engine.policy.set_fixed(gamma)
        engine.step()
    with torch.inference_mode():
        engine._catch_up_drafter(3)  # what the next speculative step does first
        n = engine.num_running
        fresh = SlotCache(drafter.head.layer, engine.max_batch, engine.num_positions)
        lengths = engine.state.lengths[:n].tolist()
        prefill_rows(drafter.head.layer, fresh, engine.state, slice(0, n), [0] * n, [L - 1 for L in lengths], 512,
                     embeds=drafter._entries)
    assert n >= 2
    for slot, length in enumerate(lengths):
        below = length - 1 - drafter.window  # the next proposal re-feeds the window itself
        assert below > 4
        torch.testing.assert_close(drafter.cache.keys[:, slot, :, :below], fresh.keys[:, slot, :, :below])


def test_first_draft_is_the_head_over_true_features(target, head):
    engine = Engine(target, head, EngineConfig(max_batch_size=1, max_seq_len=64, num_draft_tokens=3))
    prompt = [5, 9, 2, 33, 7, 7, 12, 40, 3, 1, 8, 21]
    engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=4))
    with torch.inference_mode():
        engine._admit([])
        view = StepView(engine.state, 1, 64, Flavor(True))
        proposal = engine.drafter.propose(view, 3)
        drafts, probs, lengths = proposal.tokens, proposal.probs, proposal.lengths
        bound = engine.drafter.head
        features = _text_features(engine, prompt)[None]
        cache = bound.layer.new_cache(1, 64)
        hidden = bound(features[:, :-1], torch.tensor([prompt[1:]]), cache)[:, -1:]  # entries 0..L−2 → f̂_{L−1}
        expected = []
        for _ in range(3):
            expected.append(int(bound.logits(hidden).argmax(-1)))
            hidden = bound(hidden, torch.tensor([[expected[-1]]]), cache)
    assert probs is None and lengths is None
    assert drafts[0].tolist() == expected
    assert proposal.forward_passes == 3  # one head call per draft


def test_saved_head_drafts_the_same_and_a_wrong_target_is_refused(target, head, make_llama, tmp_path):
    head.save(tmp_path / "head")
    kwargs = dict(max_new_tokens=12, temperature=1.0, num_draft_tokens=3, seed=3, eos_token_id=[], engine="fast")
    a = specdec.generate(target, RAGGED_PROMPTS, drafter=head, **kwargs)
    b = specdec.generate(target, RAGGED_PROMPTS, drafter=str(tmp_path / "head"), **kwargs)
    assert a.sequences == b.sequences
    wider = make_llama(0, hidden=48)
    with pytest.raises(ValueError, match="drafter: the feature head was trained for a target of dim 32"):
        Engine(wider, str(tmp_path / "head"))
    with pytest.raises(ValueError, match="target: the feature head"):
        FeatureHead.load(tmp_path / "head", target=Engine(wider).model)
    with pytest.raises(UnsupportedModel, match="engine='fast'"):
        specdec.generate(target, RAGGED_PROMPTS, drafter=head, max_new_tokens=4, engine="hf")


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(10, vocab=16)
    return target, start_head(target)


def _two_token_pairs(target, head, rows: int = ROWS):
    """The first two tokens of `rows` T=1 requests (seeded 0..rows-1) for PROMPT on an engine over the head."""
    engine = Engine(target, head, EngineConfig(max_batch_size=256, max_seq_len=32, num_draft_tokens=3))
    return engine_two_token_pairs(engine, rows), engine.stats


def test_two_token_law(pair):
    target, head = pair
    pairs, stats = _two_token_pairs(target, head)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) > PASS
    assert 0 < stats.alpha < 1 and stats.accepted_tokens > ROWS // 10


def test_negative_control_reused_randomness_fails(pair, monkeypatch):
    """A third of the sample size detects a broken law: every position drawing the same uniforms."""
    target, head = pair
    real = rng._row_keys
    monkeypatch.setattr(rng, "_row_keys", lambda seed, position, stream: real(seed, position * 0, 0))
    pairs, _ = _two_token_pairs(target, head, ROWS // 3)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) < FAIL


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, max_new_tokens=4),
                                    SamplingParams(temperature=0.7, top_k=5, max_new_tokens=4)])
def test_kit_reported_q_is_the_law_of_the_drafts(pair, params):
    """The drafter kit's check (`check_reported_q`) on the engine drafter: many rows, one context, own seeds."""
    from drafters.test_drafter_kit import check_reported_q, engine_proposals

    proposal = engine_proposals(*pair, params)
    check_reported_q(proposal)
    tokens, probs = proposal.tokens, proposal.probs
    sharper = probs**2 / (probs**2).sum(-1, keepdim=True)  # negative control: a misreported q fails the check
    with pytest.raises(AssertionError):
        check_reported_q(SimpleNamespace(tokens=tokens, probs=sharper))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_keep_greedy_exact_and_seeds_repeating(make_llama):
    from helpers import assert_same_greedy

    target = make_llama(0).cuda()
    head = start_head(target)  # on the CPU: the engine copies it to the target's device
    prompts = RAGGED_PROMPTS + [[1] * 30, list(range(2, 60))]
    for gamma in (1, 3, "auto"):
        res = specdec.generate(target, prompts, drafter=head, max_new_tokens=40, temperature=0,
                               num_draft_tokens=gamma, eos_token_id=[])
        for prompt, out in zip(prompts, res.sequences):
            assert_same_greedy(target, prompt, out, hf_greedy(target, prompt, 40, []))
    engine = Engine(target, head, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3))
    assert engine.cuda_graphs and engine.state.features.is_cuda
    kwargs = dict(max_new_tokens=30, temperature=1.0, num_draft_tokens=3, seed=7, eos_token_id=[])
    first = specdec.generate(target, prompts, drafter=head, **kwargs)
    assert specdec.generate(target, prompts, drafter=head, **kwargs).sequences == first.sequences
    assert first.stats.accepted_tokens > 0
