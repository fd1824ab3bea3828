"""Hostile uses of the Python API: shared state, eager validation, numpy inputs, padded drafts, bad numerics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec.drafters.base import Drafter, Proposal
from specdec.policy import HeuristicPolicy, OptimalPolicy, resolve_policy

PROMPTS = [[5, 6, 7, 8], [9, 10]]


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(30), make_llama(31, layers=1)


def test_a_policy_instance_starts_every_call_afresh(pair):
    target, draft = pair
    policy = HeuristicPolicy(initial=2, max_draft_tokens=6)
    runs = [specdec.generate(target, PROMPTS, drafter=draft, max_new_tokens=12, temperature=0,
                             num_draft_tokens=policy, eos_token_id=[]).stats for _ in range(2)]
    assert (runs[0].num_steps, runs[0].drafter_calls) == (runs[1].num_steps, runs[1].drafter_calls)
    optimal = OptimalPolicy(initial=3)
    optimal.gamma, optimal.estimates.accepted = 9, 5.0
    assert resolve_policy(optimal) is optimal and optimal.num_draft_tokens() == 3 and optimal.estimates.alpha is None


def test_a_drafter_shared_by_interleaved_streams_is_refused_clearly(pair):
    target, draft = pair
    shared = specdec.ModelDrafter(draft)
    first = iter(specdec.stream(target, PROMPTS, drafter=shared, max_new_tokens=8, temperature=0))
    second = iter(specdec.stream(target, PROMPTS[:1], drafter=shared, max_new_tokens=8, temperature=0))
    next(first)
    next(second)  # takes the drafter over
    with pytest.raises(ValueError, match="drafter.*another generate/stream"):
        next(first)
    rest = list(second)  # the call that holds it finishes normally
    assert rest and rest[-1].finished
    # sequential calls may share a drafter freely
    a = specdec.generate(target, PROMPTS, drafter=shared, max_new_tokens=6, temperature=0).sequences
    assert a == specdec.generate(target, PROMPTS, drafter=shared, max_new_tokens=6, temperature=0).sequences


def test_stream_checks_everything_before_the_first_step(pair, make_gpt2):
    target, draft = pair
    with pytest.raises(ValueError, match="context of 256"):
        specdec.stream(target, PROMPTS, drafter=draft, max_new_tokens=1000)  # raised at the call, not at next()
    with pytest.raises(ValueError, match="context of 16"):
        specdec.stream(make_gpt2(0, n_positions=16), [list(range(10))], max_new_tokens=10)
    with pytest.raises(TypeError, match="generator"):
        specdec.stream(target, PROMPTS, generator=42)
    with pytest.raises(TypeError, match="on_tokens"):
        specdec.generate(target, PROMPTS, on_tokens="print")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdec.stream(target, PROMPTS, num_draft_tokens="nonsense")  # checked even without a drafter


def test_numpy_and_torch_integers_are_tokens_seeds_and_lengths(pair):
    target, draft = pair
    ragged = [np.array(p, dtype=np.int64) for p in PROMPTS]
    got = specdec.generate(target, ragged, drafter=draft, max_new_tokens=np.int32(5), seed=np.uint16(3),
                           num_draft_tokens=np.int64(4), eos_token_id=[np.int64(t) for t in [2]])
    assert got.sequences == specdec.generate(target, PROMPTS, drafter=draft, max_new_tokens=5, seed=3,
                                             eos_token_id=[2]).sequences
    assert specdec.generate(target, np.array([PROMPTS[0]]), max_new_tokens=3, temperature=0).sequences == \
        specdec.generate(target, [PROMPTS[0]], max_new_tokens=3, temperature=0).sequences


class MinusOnePaddedDrafter(Drafter):
    """Proposes a fixed number of the target's own greedy tokens per row and pads the rest with -1 (vLLM's
    placeholder), reporting the real count in `lengths`."""

    deterministic = True

    def __init__(self, model):
        self.model_ = model

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        batch = context.batch_size
        tokens = torch.full((batch, num_draft_tokens), -1, dtype=torch.long)
        lengths = torch.tensor([min(b + 1, num_draft_tokens) for b in range(batch)])
        for b in range(batch):
            row = context.row(b)
            for i in range(int(lengths[b])):
                with torch.no_grad():
                    nxt = int(self.model_(torch.tensor([row])).logits[0, -1].argmax())
                tokens[b, i] = nxt
                row = row + [nxt]
        return Proposal(tokens=tokens, probs=None, lengths=lengths)


def test_a_drafter_padding_with_minus_one_is_exact(pair):
    target, _ = pair
    plain = specdec.generate(target, PROMPTS, max_new_tokens=10, temperature=0, eos_token_id=[])
    spec = specdec.generate(target, PROMPTS, drafter=MinusOnePaddedDrafter(target), max_new_tokens=10, temperature=0,
                            num_draft_tokens=3, eos_token_id=[])
    assert spec.sequences == plain.sequences and spec.stats.alpha == pytest.approx(1.0)
    sampled = specdec.generate(target, PROMPTS, drafter=MinusOnePaddedDrafter(target), max_new_tokens=6,
                               num_draft_tokens=3, seed=0, eos_token_id=[])
    assert all(len(row) == 6 for row in sampled.sequences)


def test_overflowing_float16_target_is_an_error_not_token_zero(make_llama):
    model = make_llama(32)
    with torch.no_grad():
        model.lm_head.weight.mul_(3e5)  # fine in float32, +inf logits in float16
    model = model.half()
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"\+inf"):
            specdec.generate(model, PROMPTS, max_new_tokens=3, temperature=temperature)


def test_a_tiny_temperature_is_greedy(pair):
    target, draft = pair
    greedy = specdec.generate(target, PROMPTS, drafter=draft, max_new_tokens=6, temperature=0).sequences
    for t in (1e-38, 1e-6):
        assert specdec.generate(target, PROMPTS, drafter=draft, max_new_tokens=6, temperature=t, seed=1).sequences == greedy
    assert specdec.SamplingParams(temperature=1e-9).greedy


def test_sliding_window_is_refused_by_the_loop_before_any_compute_and_runs_on_the_engine(monkeypatch, pair):
    transformers = pytest.importorskip("transformers")
    config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    model = transformers.MistralForCausalLM(config).eval()

    def no_compute(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(model, "forward", no_compute)
    with pytest.raises(ValueError, match="target: mistral.*sliding.*engine"):
        specdec.generate(model, PROMPTS, max_new_tokens=2, engine="hf")
    with pytest.raises(ValueError, match="drafter: mistral"):
        specdec.generate(pair[0], PROMPTS, drafter=model, max_new_tokens=2, engine="hf")
    out = specdec.generate(model, PROMPTS, max_new_tokens=2, temperature=0)  # "auto": the engine runs the window
    assert [len(s) for s in out.sequences] == [2, 2]
