"""Greedy speculative decoding is token for token the target's own greedy decoding (and HF generate)."""

import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy

MAX_NEW = 24


def drafters_for(draft_model, target):
    corpus = [[(i * 7 + j) % 64 for i in range(100)] for j in range(3)]
    return {
        "none": None,
        "model": draft_model,
        "self": target,
        "bigram": specdec.NGramDrafter(2).fit(corpus, 64),
        "unigram": specdec.NGramDrafter(1).fit(corpus, 64),
        "prompt_lookup": specdec.PromptLookupDrafter(),
    }


CASES = [("llama", g, d) for g in (1, 3, 8) for d in ("none", "model", "self", "bigram", "unigram", "prompt_lookup")]
CASES += [(f, 3, d) for f in ("gpt2", "qwen2") for d in ("none", "model", "bigram", "prompt_lookup")]
CASES += [(f, g, "model") for f in ("gpt2", "qwen2") for g in (1, 8)]


@pytest.mark.parametrize("family, gamma, drafter_kind", CASES)
def test_greedy_matches_hf_generate_ragged(family, gamma, drafter_kind, request):
    target = request.getfixturevalue(family)
    draft = request.getfixturevalue("gpt2_draft" if family == "gpt2" else "llama_draft")
    eos = [2]
    refs = [hf_greedy(target, p, MAX_NEW, eos) for p in RAGGED_PROMPTS]
    drafter = drafters_for(draft, target)[drafter_kind]
    res = specdec.generate(
        target, RAGGED_PROMPTS, drafter=drafter, temperature=0, max_new_tokens=MAX_NEW,
        num_draft_tokens=gamma, eos_token_id=eos,
    )
    for prompt, ours, ref in zip(RAGGED_PROMPTS, res.sequences, refs):
        assert_same_greedy(target, prompt, ours, ref)


def test_same_model_drafter_accepts_everything(llama):
    # 36 tokens = a whole number of (γ + 1)-token steps: the last step is not clamped to the tokens left
    for gamma in (1, 3, 8):
        res = specdec.generate(
            llama, RAGGED_PROMPTS, drafter=llama, temperature=0, max_new_tokens=36, num_draft_tokens=gamma,
            eos_token_id=[],
        )
        assert res.stats.alpha == pytest.approx(1.0)
        assert res.stats.mean_accepted_length == pytest.approx(gamma + 1)
        assert res.stats.acceptance_per_position == [1.0] * gamma


def test_same_model_drafter_sampling_alpha_is_one(llama):
    res = specdec.generate(
        llama, RAGGED_PROMPTS, drafter=llama, temperature=1.0, max_new_tokens=40, num_draft_tokens=4, seed=0,
        eos_token_id=[],
    )
    assert res.stats.alpha == pytest.approx(1.0, abs=1e-5)
    assert res.stats.mean_accepted_length == pytest.approx(5.0, abs=0.05)


def test_batched_equals_one_by_one(llama, llama_draft):
    prompts = [[(3 * i + j) % 60 + 3 for j in range(1 + (i * 5) % 13)] for i in range(6)]
    batched = specdec.generate(llama, prompts, drafter=llama_draft, temperature=0, max_new_tokens=30, num_draft_tokens=3)
    for prompt, row in zip(prompts, batched.sequences):
        alone = specdec.generate(llama, [prompt], drafter=llama_draft, temperature=0, max_new_tokens=30, num_draft_tokens=3)
        assert_same_greedy(llama, prompt, row, alone.sequences[0])


def test_eos_cuts_each_row_independently(llama):
    base = specdec.generate(llama, RAGGED_PROMPTS, temperature=0, max_new_tokens=20, eos_token_id=[]).sequences
    # make the 3rd generated token of row 0 the EOS: row 0 stops there, other rows continue
    eos = base[0][2]
    res = specdec.generate(llama, RAGGED_PROMPTS, drafter=llama, temperature=0, max_new_tokens=20, eos_token_id=eos)
    for ours, full in zip(res.sequences, base):
        cut = full[: full.index(eos) + 1] if eos in full else full
        assert ours == cut
    assert res.sequences[0] == base[0][: base[0].index(eos) + 1]


def test_default_eos_comes_from_generation_config(make_llama):
    model = make_llama(3)
    base = specdec.generate(model, [[4, 5, 6]], temperature=0, max_new_tokens=12, eos_token_id=[]).sequences[0]
    model.generation_config.eos_token_id = base[4]
    res = specdec.generate(model, [[4, 5, 6]], temperature=0, max_new_tokens=12)
    assert res.sequences[0] == base[: base.index(base[4]) + 1]


def test_tensor_prompts_with_attention_mask(llama):
    ragged = [[5, 6, 7], [9, 10, 11, 12, 13]]
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    a = specdec.generate(llama, ids, attention_mask=mask, temperature=0, max_new_tokens=10).sequences
    b = specdec.generate(llama, ragged, temperature=0, max_new_tokens=10).sequences
    assert a == b


def test_thousands_of_ragged_rows(llama, llama_draft):
    prompts = [[(i % 50) + 3] * (1 + i % 7) for i in range(2000)]
    res = specdec.generate(llama, prompts, drafter=llama_draft, temperature=0, max_new_tokens=6, num_draft_tokens=3)
    assert len(res.sequences) == 2000
    # identical prompts give identical greedy outputs, wherever they sit in the batch
    by_prompt = {}
    for p, s in zip(prompts, res.sequences):
        by_prompt.setdefault(tuple(p), set()).add(tuple(s))
    assert all(len(v) == 1 for v in by_prompt.values())
    some = list(by_prompt)[:5]
    for p in some:
        alone = specdec.generate(llama, [list(p)], temperature=0, max_new_tokens=6).sequences[0]
        assert_same_greedy(llama, list(p), list(next(iter(by_prompt[p]))), alone)


def test_streaming_yields_every_token_in_order(llama, llama_draft):
    events = []
    res = specdec.generate(
        llama, RAGGED_PROMPTS, drafter=llama_draft, temperature=0, max_new_tokens=15, on_tokens=events.append,
    )
    rebuilt = [[] for _ in RAGGED_PROMPTS]
    for ev in events:
        for row, toks in zip(ev.rows, ev.tokens):
            rebuilt[row].extend(toks)
    assert rebuilt == res.sequences
    run = specdec.stream(llama, RAGGED_PROMPTS, drafter=llama_draft, temperature=0, max_new_tokens=15)
    streamed = [[] for _ in RAGGED_PROMPTS]
    for ev in run:
        for row, toks in zip(ev.rows, ev.tokens):
            streamed[row].extend(toks)
    assert streamed == res.sequences == run.result.sequences


def test_stats_count_what_happened(llama, llama_draft):
    res = specdec.generate(llama, [[5, 6, 7]], drafter=llama_draft, temperature=0, max_new_tokens=30, num_draft_tokens=4, eos_token_id=[])
    s = res.stats
    assert s.num_generated_tokens == 30 == len(res.sequences[0])
    assert s.algorithm_tokens == s.accepted_tokens + s.num_steps
    assert s.algorithm_tokens >= 30
    assert 1.0 <= s.mean_accepted_length <= 5.0
    # γ = 4 until fewer than 5 tokens are left, then only what the step can still commit
    assert s.max_num_draft_tokens == 4 and s.num_steps - 4 <= s.drafter_calls / 4 <= s.num_steps
    assert len(s.acceptance_per_position) == 4
    plain = specdec.generate(llama, [[5, 6, 7]], temperature=0, max_new_tokens=30, eos_token_id=[]).stats
    assert plain.mean_accepted_length == 1.0 and plain.alpha is None and plain.num_steps == 30
