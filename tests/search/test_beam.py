"""Speculative beam search returns transformers' own beams (tokens and scores), in fewer target passes."""

import functools

import pytest
import torch

from specdec.search.beam import beam_search
from helpers import hf_beams, hf_greedy, perturbed_copy

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5, 3, 4]]
N = 10


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target)  # a drafter that agrees often but not always: both paths get exercised


@functools.lru_cache(maxsize=None)
def _hf(model, prompt: tuple, w: int, eos: tuple, length_penalty: float = 1.0, early_stopping=False):
    return hf_beams(model, prompt, w, eos, N, length_penalty, early_stopping)


def assert_same_beams(model, res, w, eos=(), **kw):
    for prompt, beams, scores in zip(PROMPTS, res.sequences, res.scores):
        ref_beams, ref_scores = _hf(model, tuple(prompt), w, tuple(eos), **kw)
        assert beams == ref_beams
        assert scores == pytest.approx(ref_scores, abs=1e-4)


@pytest.mark.parametrize("w", [2, 4])
@pytest.mark.parametrize("u_factor", [1, 2])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_same_beams_as_transformers(pair, w, u_factor, gamma):
    target, draft = pair
    eos = (7,) if gamma == 3 else ()  # with and without EOS
    res = beam_search(target, PROMPTS, draft, num_beams=w, draft_beams=u_factor * w, num_draft_tokens=gamma,
                      max_new_tokens=N, eos_token_id=list(eos))
    assert_same_beams(target, res, w, eos)
    assert res.stats.passes <= res.stats.beam_steps  # never more passes than plain beam search


@pytest.mark.parametrize("u, gamma", [(1, 1), (2, 3), (2, 5)])
def test_one_beam_is_transformers_greedy(pair, u, gamma):
    # transformers runs greedy search for num_beams=1; the beam rules with w = 1 reduce to it (EOS included)
    target, draft = pair
    res = beam_search(target, PROMPTS, draft, num_beams=1, draft_beams=u, num_draft_tokens=gamma, max_new_tokens=N,
                      eos_token_id=[7])
    for prompt, beams in zip(PROMPTS, res.sequences):
        assert beams == [hf_greedy(target, prompt, N, [7])]


@pytest.mark.parametrize("length_penalty, early_stopping", [(0.5, False), (2.0, "never"), (1.0, True), (-1.0, False)])
def test_length_rules_match_transformers(pair, length_penalty, early_stopping):
    target, draft = pair
    res = beam_search(target, PROMPTS, draft, num_beams=3, draft_beams=4, num_draft_tokens=2, max_new_tokens=N,
                      eos_token_id=[7, 20], length_penalty=length_penalty, early_stopping=early_stopping)
    assert_same_beams(target, res, 3, (7, 20), length_penalty=length_penalty, early_stopping=early_stopping)


def test_plain_beam_search_without_a_drafter(pair):
    target, _ = pair
    res = beam_search(target, PROMPTS, None, num_beams=4, max_new_tokens=N, eos_token_id=[])
    assert_same_beams(target, res, 4)
    assert res.stats.passes == N and res.stats.steps_per_pass == 1.0


def test_a_perfect_drafter_advances_gamma_plus_one_steps_per_pass(pair):
    target, _ = pair
    res = beam_search(target, PROMPTS, target, num_beams=2, draft_beams=2, num_draft_tokens=4, max_new_tokens=N,
                      eos_token_id=[])
    assert_same_beams(target, res, 2)
    assert res.stats.passes == 2  # 5 + 5 steps
    assert res.stats.target_calls == 3  # prefill + 2 passes (transformers: prefill + 9 more)


def test_argument_errors(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(target, PROMPTS, draft, num_beams=0)
    with pytest.raises(ValueError, match="draft_beams"):
        beam_search(target, PROMPTS, draft, num_beams=4, draft_beams=2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        beam_search(target, PROMPTS, draft, num_draft_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(target, PROMPTS, draft, max_new_tokens=0)
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(target, PROMPTS, draft, early_stopping="sometimes")
    with pytest.raises(TypeError, match="drafter"):
        beam_search(target, PROMPTS, "ngram")
