"""Encoder-decoder targets (T5, BART): exact greedy equivalence with transformers, cache layouts, bad inputs."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

import seq2seq_models
import specdec
from seq2seq_models import teacher_forced_logits
from specdec.models.seq2seq import HFSeq2SeqLM

transformers = pytest.importorskip("transformers")

VOCAB = 64
MAX_NEW = 20
random.seed(0)
PROMPTS = [[random.randrange(2, VOCAB) for _ in range(n)] for n in (7, 1, 3, 11, 5, 9)]


make_t5 = partial(seq2seq_models.make_t5, vocab=VOCAB)
make_bart = partial(seq2seq_models.make_bart, vocab=VOCAB)
MAKERS = {"t5": make_t5, "bart": make_bart}


def noisy_copy(model, scale: float = 0.2, seed: int = 5):
    """The target with every weight perturbed: a drafter that agrees often but not always (α ≈ 0.4–0.6)."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.std())
    return copy


@pytest.fixture(scope="module")
def models():
    out = {}
    for family, make in MAKERS.items():
        out[family] = make(0)
        out[family + "_draft"] = make(1, layers=1, d_model=16)
        out[family + "_noisy"] = noisy_copy(out[family])
    return out


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    """transformers' own greedy generate for one encoder input: decoder tokens after the start token, cut at EOS."""
    out = model.generate(
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
        max_new_tokens=max_new_tokens, eos_token_id=eos or None,
    )[0, 1:].tolist()
    for i, tok in enumerate(out):
        if tok in eos:
            return out[: i + 1]
    return out


def assert_same_greedy(model, prompt: list[int], ours: list[int], ref: list[int]) -> None:
    """Token equality; where they first differ, the target's top-2 logit margin must be a float tie (< 1e-4)."""
    if ours == ref:
        return
    i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    start = specdec.models.seq2seq.decoder_start_token_id(model)
    top2 = teacher_forced_logits(model, prompt, [start] + ref[:i])[-1].topk(2).values
    margin = float(top2[0] - top2[1])
    assert margin < 1e-4, f"outputs differ at token {i} with a clear margin {margin}: ours={ours} ref={ref}"


def eos_for(model) -> list[int]:
    """An EOS id that some rows emit early and others never: finished rows leave the batch mid-run."""
    refs = [hf_greedy(model, p, MAX_NEW, []) for p in PROMPTS]
    counts = {}
    for ref in refs:
        for tok in set(ref[1:MAX_NEW // 2]):
            counts[tok] = counts.get(tok, 0) + 1
    rows_hit = {tok: c for tok, c in counts.items() if 1 <= c < len(PROMPTS)}
    return [max(rows_hit, key=rows_hit.get)] if rows_hit else [1]


def drafters_for(family: str, models: dict, target):
    corpus = [hf_greedy(target, p, MAX_NEW, []) for p in PROMPTS[:3]]  # target-side text, as in the paper
    return {
        "none": None,
        "self": target,
        "small_model": models[family + "_draft"],
        "noisy_copy": models[family + "_noisy"],
        "bigram": specdec.NGramDrafter(2).fit(corpus, VOCAB),
        "prompt_lookup": specdec.PromptLookupDrafter(),
    }


@pytest.mark.parametrize("family", ["t5", "t5_prefix", "bart"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_matches_hf_generate_ragged(family, gamma, models):
    base = family.split("_")[0]
    model = models[base]
    target = HFSeq2SeqLM(model, layout="prefix") if family == "t5_prefix" else model
    eos = eos_for(model)
    refs = [hf_greedy(model, p, MAX_NEW, eos) for p in PROMPTS]
    assert len({len(r) for r in refs}) > 1, "the EOS choice should finish rows at different steps"
    for name, drafter in drafters_for(base, models, model).items():
        res = specdec.generate(
            target, PROMPTS, drafter=drafter, temperature=0, max_new_tokens=MAX_NEW, num_draft_tokens=gamma,
            eos_token_id=eos,
        )
        for prompt, ours, ref in zip(PROMPTS, res.sequences, refs):
            assert_same_greedy(model, prompt, ours, ref)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_prompt_tensor_with_attention_mask(family, models):
    model = models[family]
    ids = torch.zeros(len(PROMPTS), max(map(len, PROMPTS)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = torch.tensor(p)
        mask[b, : len(p)] = 1
    ours = specdec.generate(model, ids, attention_mask=mask, drafter=models[family + "_draft"], temperature=0,
                            max_new_tokens=8, num_draft_tokens=3, eos_token_id=[]).sequences
    for prompt, row in zip(PROMPTS, ours):
        assert_same_greedy(model, prompt, row, hf_greedy(model, prompt, 8, []))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_same_model_drafter_accepts_everything(family, models):
    model = models[family]
    # 36 (and 30 below) tokens = a whole number of (γ + 1)-token steps: no step is clamped to the tokens left
    for gamma in (1, 3, 8):
        res = specdec.generate(
            model, PROMPTS, drafter=model, temperature=0, max_new_tokens=36, num_draft_tokens=gamma, eos_token_id=[]
        )
        assert res.stats.alpha == pytest.approx(1.0, abs=1e-5)
        assert res.stats.mean_accepted_length == pytest.approx(gamma + 1)
    res = specdec.generate(
        model, PROMPTS * 4, drafter=model, temperature=1.0, max_new_tokens=30, num_draft_tokens=4, seed=0,
        eos_token_id=[],
    )
    assert res.stats.alpha == pytest.approx(1.0, abs=1e-5)
    assert res.stats.mean_accepted_length == pytest.approx(5.0, abs=0.05)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_batched_equals_one_by_one(family, models):
    model, draft = models[family], models[family + "_draft"]
    kwargs = dict(drafter=draft, temperature=0, max_new_tokens=MAX_NEW, num_draft_tokens=3, eos_token_id=eos_for(model))
    batched = specdec.generate(model, PROMPTS, **kwargs).sequences
    alone = [specdec.generate(model, [p], **kwargs).sequences[0] for p in PROMPTS]
    for prompt, a, b in zip(PROMPTS, batched, alone):
        assert_same_greedy(model, prompt, a, b)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_stream_events_rebuild_the_result(family, models):
    model = models[family]
    run = specdec.stream(model, PROMPTS, drafter=models[family + "_draft"], temperature=0.8, top_p=0.9,
                         max_new_tokens=MAX_NEW, num_draft_tokens=3, seed=1)
    rebuilt = [[] for _ in PROMPTS]
    for event in run:
        for row, tokens in zip(event.rows, event.tokens):
            rebuilt[row].extend(tokens)
    assert rebuilt == run.result.sequences
    assert all(len(r) >= 1 for r in rebuilt)


@pytest.mark.parametrize("family", ["t5", "bart"])
@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=3), dict(temperature=1.3, top_p=0.6)])
def test_sampled_tokens_stay_in_the_standardized_support(family, sampling, models):
    """Every sampled token has p > 0 under the same temperature/top-k/top-p at its prefix."""
    model = models[family]
    res = specdec.generate(model, PROMPTS, drafter=models[family + "_draft"], max_new_tokens=MAX_NEW,
                           num_draft_tokens=4, seed=3, eos_token_id=[], **sampling)
    config = specdec.SamplingConfig(**sampling)
    start = specdec.models.seq2seq.decoder_start_token_id(model)
    for prompt, row in zip(PROMPTS, res.sequences):
        assert len(row) == MAX_NEW
        probs = specdec.standardize_logits(teacher_forced_logits(model, prompt, [start] + row[:-1]), config)
        assert bool((probs.gather(1, torch.tensor(row)[:, None]) > 0).all())


# -- the adapter on its own: per-row validity, crop and select_rows are exact -----------------------------


@pytest.mark.parametrize("family,layout", [("t5", "relative"), ("t5", "prefix"), ("bart", "prefix")])
def test_adapter_matches_teacher_forcing_through_ragged_steps(family, layout, models):
    model = models[family]
    lm = HFSeq2SeqLM(model, layout=layout)
    gen = torch.Generator().manual_seed(0)
    prompts = PROMPTS[:4]
    context = lm.begin(prompts, max_new_tokens=40)
    texts = [context.row(b) for b in range(len(prompts))]  # each row's decoder text fed so far
    for step in range(8):
        # Feed a ragged block: row b feeds its unseen text plus 0..3 new random tokens (left-padded block).
        extra = torch.randint(0, 4, (len(prompts),), generator=gen).tolist()
        new = [texts[b][int(lm.lengths[b]):] + torch.randint(2, VOCAB, (extra[b],), generator=gen).tolist()
               for b in range(len(prompts))]
        width = max(len(n) for n in new)
        block = torch.zeros(len(prompts), width, dtype=torch.long)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool)
        for b, n in enumerate(new):
            if n:
                block[b, width - len(n):] = torch.tensor(n)
                valid[b, width - len(n):] = True
        logits = lm.forward(block, valid)
        for b, n in enumerate(new):
            texts[b] = texts[b][: int(lm.lengths[b]) - len(n)] + n
            if not n:
                continue
            ref = teacher_forced_logits(model, prompts[b], texts[b])[-len(n):]
            torch.testing.assert_close(logits[b, width - len(n):], ref, atol=1e-4, rtol=1e-4)
        # Roll back each row to a random shorter length (at least the start token).
        keep = [int(torch.randint(1, int(lm.lengths[b]) + 1, (1,), generator=gen)) for b in range(len(prompts))]
        lm.crop(torch.tensor(keep))
        texts = [t[:k] for t, k in zip(texts, keep)]
        if step == 4:  # drop a row mid-way: decoder cache, cross cache and encoder states follow
            index = torch.tensor([0, 2, 3])
            lm.select_rows(index)
            prompts = [prompts[i] for i in index.tolist()]
            texts = [texts[i] for i in index.tolist()]


def test_layout_defaults():
    assert HFSeq2SeqLM(make_t5(0)).layout == "relative"
    assert HFSeq2SeqLM(make_bart(0)).layout == "prefix"
    with pytest.raises(ValueError, match="relative"):
        HFSeq2SeqLM(make_bart(0), layout="relative")


def test_begin_returns_start_tokens_and_source(models):
    lm = HFSeq2SeqLM(models["bart"])
    context = lm.begin(PROMPTS, max_new_tokens=5)
    assert [context.row(b) for b in range(len(PROMPTS))] == [[2]] * len(PROMPTS)  # BART starts with </s>
    assert context.source == PROMPTS
    assert lm.encoder_states.shape[:2] == (len(PROMPTS), max(map(len, PROMPTS)))


# -- bad inputs ---------------------------------------------------------------------------------------------


def test_decoder_only_drafter_with_encoder_decoder_target_is_rejected(models):
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match="encoder-decoder"):
        specdec.generate(models["t5"], PROMPTS, drafter=gpt2, max_new_tokens=4)
    with pytest.raises(ValueError, match="encoder-decoder"):
        specdec.generate(gpt2, PROMPTS, drafter=models["t5_draft"], max_new_tokens=4)


def test_bad_prompts_are_rejected(models):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        specdec.generate(models["t5"], [[3, 4], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        specdec.generate(models["t5"], [], max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        HFSeq2SeqLM(models["t5"]).begin([[5], []], max_new_tokens=4)


def test_vocabulary_mismatch_is_rejected(models):
    with pytest.raises(ValueError, match="vocabularies differ"):
        specdec.generate(models["t5"], PROMPTS, drafter=make_t5(2, layers=1, d_model=16, vocab=VOCAB + 8), max_new_tokens=4)


def test_context_limits_and_missing_start_token(models):
    with pytest.raises(ValueError, match="max_new_tokens 200 exceeds"):
        specdec.generate(models["bart"], PROMPTS, max_new_tokens=200)
    with pytest.raises(ValueError, match="encoder's context"):
        specdec.generate(models["bart"], [[5] * 129], max_new_tokens=4)
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    no_start = transformers.T5ForConditionalGeneration(cfg)
    no_start.config.decoder_start_token_id = None
    no_start.generation_config.decoder_start_token_id = None
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        HFSeq2SeqLM(no_start)
    with pytest.raises(TypeError, match="encoder-decoder"):
        HFSeq2SeqLM(transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)))


def test_drafts_past_the_decoder_context_are_harmless(models):
    """max_new_tokens == BART's position table: drafts beyond it are dropped, the output is still exact."""
    model = models["bart"]
    limit = model.config.max_position_embeddings
    ref = hf_greedy(model, PROMPTS[0], limit, [])
    for drafter in (model, models["bart_noisy"]):
        res = specdec.generate(model, PROMPTS[:1], drafter=drafter, temperature=0, max_new_tokens=limit,
                               num_draft_tokens=5, eos_token_id=[])
        assert_same_greedy(model, PROMPTS[0], res.sequences[0], ref)
