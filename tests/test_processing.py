"""Logits processors under speculation on the transformers loop (`specdec.processing`, `loop.chain._decode`).

Greedy: speculative decoding with processors (several γ, a model drafter and prompt lookup) gives exactly
transformers' own `generate` with its processors (`repetition_penalty`, `sequence_bias`, `min_new_tokens`, and
OpenAI's frequency / presence penalties as a custom `LogitsProcessor`). Sampled: the two-token law is the processed
target's (chi-square), with negative controls: the unprocessed law, and a runner whose processor state is not
advanced along the draft, must fail.
"""

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

import specdec
from specdec import processing
from specdec.core import SamplingConfig, standardize_logits
from specdec.core.processors import ProcessorRows, advance, history_of, process_draft
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from stats_utils import chi2_pvalue
from test_distribution import PROMPT

PROMPTS = [[1, 2, 3, 4, 1, 2], [5, 6], [7, 8, 9, 7, 8]]


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's frequency / presence penalties over the generated tokens (the reference for ours)."""

    def __init__(self, prompt_length: int, frequency: float, presence: float):
        self.start, self.frequency, self.presence = prompt_length, frequency, presence

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        counts.scatter_add_(1, input_ids[:, self.start:], torch.ones_like(input_ids[:, self.start:], dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def hf_processed(model, prompt, n, eos, *, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                 logit_bias=None, min_tokens=0, allowed_token_ids=None, no_repeat_ngram_size=0, bad_words_ids=()):
    kwargs = {"no_repeat_ngram_size": no_repeat_ngram_size} if no_repeat_ngram_size else {}
    if bad_words_ids:
        kwargs["bad_words_ids"] = [list(w) for w in bad_words_ids]
    if allowed_token_ids is not None:
        kwargs["prefix_allowed_tokens_fn"] = lambda batch_id, ids: list(allowed_token_ids)
    if repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = repetition_penalty
    if logit_bias:
        kwargs["sequence_bias"] = {(t,): b for t, b in logit_bias.items()}
    if min_tokens:
        kwargs["min_new_tokens"] = min_tokens
    extra = LogitsProcessorList([OpenAIPenalties(len(prompt), frequency_penalty, presence_penalty)]) \
        if frequency_penalty or presence_penalty else None
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=n, pad_token_id=0, eos_token_id=eos or None,
                         logits_processor=extra, **kwargs)[0, len(prompt):].tolist()
    for i, tok in enumerate(out):
        if tok in eos:
            return out[: i + 1]
    return out


CASES = [
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.6, logit_bias={5: 2.5, 9: -100.0}),
    dict(frequency_penalty=1.5, presence_penalty=0.7),
    dict(min_tokens=8, logit_bias={17: 6.0}, repetition_penalty=1.3, frequency_penalty=-0.5),
    dict(allowed_token_ids=list(range(1, 64, 3)), repetition_penalty=1.5),
    dict(no_repeat_ngram_size=2),
    dict(no_repeat_ngram_size=3, frequency_penalty=0.3),
    dict(bad_words_ids=[[13], [40, 41], [2, 3, 4]], no_repeat_ngram_size=4),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_with_processors_is_transformers_generate(llama, llama_draft, case, gamma):
    eos = [17] if "min_tokens" in case else []
    for prompt in PROMPTS:
        ref = hf_processed(llama, prompt, 12, eos, **case)
        for drafter in (llama_draft, PromptLookupDrafter()):
            ours = specdec.generate(llama, [prompt], drafter, max_new_tokens=12, temperature=0, eos_token_id=eos,
                                    num_draft_tokens=gamma, engine="hf", **case).sequences[0]
            assert ours == ref, (case, gamma, type(drafter).__name__)
        plain = specdec.generate(llama, [prompt], None, max_new_tokens=12, temperature=0, eos_token_id=eos,
                                 num_draft_tokens=0, engine="hf", **case).sequences[0]
        assert plain == ref
    # the processors change these outputs (a check that could fail)
    assert any(hf_processed(llama, p, 12, eos, **case) != hf_processed(llama, p, 12, eos) for p in PROMPTS)


def test_min_tokens_masks_eos_then_lets_it_stop(llama, llama_draft):
    plain = specdec.generate(llama, [PROMPTS[0]], llama_draft, max_new_tokens=12, temperature=0, engine="hf",
                             eos_token_id=[], num_draft_tokens=3).sequences[0]
    eos = plain[1]  # the greedy text would stop at its second token
    short = specdec.generate(llama, [PROMPTS[0]], llama_draft, max_new_tokens=12, temperature=0, engine="hf",
                             eos_token_id=[eos], num_draft_tokens=3).sequences[0]
    long = specdec.generate(llama, [PROMPTS[0]], llama_draft, max_new_tokens=12, temperature=0, engine="hf",
                            eos_token_id=[eos], num_draft_tokens=3, min_tokens=5).sequences[0]
    assert len(short) == 2 and len(long) >= 5 and eos not in long[:4]


def test_processor_arguments_are_checked(llama):
    with pytest.raises(TypeError, match="repetiton_penalty"):
        specdec.generate(llama, [[1]], max_new_tokens=2, repetiton_penalty=1.2)
    with pytest.raises(ValueError, match="logit_bias token id 64"):
        specdec.generate(llama, [[1]], max_new_tokens=2, logit_bias={64: 1.0}, engine="hf")
    with pytest.raises(ValueError, match="draft_tree"):
        specdec.generate(llama, [[1]], llama, max_new_tokens=2, repetition_penalty=1.2, draft_tree=[2])


# ----------------------------------------------------------------------------------------------- the law
LAW = dict(repetition_penalty=2.5, presence_penalty=1.2, logit_bias={3: 1.5, 7: -1.0}, min_tokens=1)
STOP = [5]


def processed_two_token_law(model, sampling, advanced=True):
    """P(t1, t2) under the processors (t1's occurrence penalizes t2 only when `advanced`)."""
    vocab = model.config.vocab_size
    rows = ProcessorRows.uniform(1, vocab, "cpu", repetition=LAW["repetition_penalty"],
                                 presence=LAW["presence_penalty"], min_tokens=LAW["min_tokens"], stop_ids=STOP,
                                 logit_bias=list(LAW["logit_bias"].items()))
    history = history_of([PROMPT], vocab, "cpu")
    with torch.no_grad():
        first = model(torch.tensor([PROMPT])).logits[:, -1:]
        p1 = standardize_logits(process_draft(first, first.new_zeros(1, 0).long(), rows, history)[0, 0], sampling)
        second = model(torch.tensor([PROMPT + [t] for t in range(vocab)])).logits[:, -1:]
        law = []
        for t in range(vocab):
            h = advance(history, torch.tensor([[t]])) if advanced else \
                advance(history, torch.tensor([[t]]), torch.tensor([0]))  # frozen, but one token later
            law.append(standardize_logits(process_draft(second[t:t + 1], second.new_zeros(1, 0).long(), rows, h)[0, 0],
                                          sampling))
    return (p1[:, None] * torch.stack(law)).flatten().double().numpy()


def _pairs(target, draft, rows, seed, sampling=SamplingConfig(1.0), engine="hf"):
    res = specdec.generate(target, [PROMPT] * rows, drafter=draft, max_new_tokens=3, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=2, seed=seed,
                           eos_token_id=STOP, engine=engine, **LAW)
    return np.array([s[0] * 16 + s[1] for s in res.sequences if len(s) >= 2]), res


def test_two_token_law_is_the_processed_target(make_llama):
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    pairs, res = _pairs(target, draft, 6000, seed=3)
    sampling = SamplingConfig(1.0)
    assert chi2_pvalue(pairs, processed_two_token_law(target, sampling)) > 1e-3
    assert 0 < res.stats.alpha < 1
    # negative controls: the unprocessed law, and the law of a history not advanced by t1
    raw = np.zeros(256)
    with torch.no_grad():
        p1 = standardize_logits(target(torch.tensor([PROMPT])).logits[0, -1], sampling)
        p2 = standardize_logits(target(torch.tensor([PROMPT + [t] for t in range(16)])).logits[:, -1], sampling)
    raw = (p1[:, None] * p2).flatten().double().numpy()
    assert chi2_pvalue(pairs, raw) < 1e-8
    assert chi2_pvalue(pairs, processed_two_token_law(target, sampling, advanced=False)) < 1e-8


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_processors_before_temperature_and_filters(make_llama, engine):
    """The processors come before temperature, top-k and top-p (transformers' and vLLM's order): on both runners
    the law is the processed logits' standardized law (negative control: the history frozen along the draft)."""
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    sampling = SamplingConfig(0.6, top_k=10, top_p=0.9)
    pairs, _ = _pairs(target, draft, 6000, seed=7, sampling=sampling, engine=engine)
    assert chi2_pvalue(pairs, processed_two_token_law(target, sampling)) > 1e-3
    assert chi2_pvalue(pairs, processed_two_token_law(target, sampling, advanced=False)) < 1e-8


def test_a_history_frozen_along_the_draft_breaks_the_law(make_llama, monkeypatch):
    """Negative control on the runner: p̃ at every drafted position computed from the committed history alone
    (the bug this module exists to avoid) must fail the same test."""
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)

    def frozen(self, logits, draft_tokens):
        zero = draft_tokens[:, :0]
        return torch.cat([process_draft(logits[:, i:i + 1], zero, self.rows, self.history)
                          for i in range(logits.shape[1])], 1)

    monkeypatch.setattr(processing.BatchProcessors, "target", frozen)
    pairs, _ = _pairs(target, draft, 6000, seed=3)
    assert chi2_pvalue(pairs, processed_two_token_law(target, SamplingConfig(1.0))) < 1e-8


def test_a_drafter_without_the_hook_stays_exact(make_llama, monkeypatch):
    """q need not be processed for exactness — only reported as drawn: the model drafter with the hook off
    (raw q, processed p) still gives the processed law, at a lower acceptance."""
    from specdec.drafters.model import ModelDrafter

    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    drafter = ModelDrafter(draft)
    drafter.accepts_processor = False
    pairs, res = _pairs(target, drafter, 6000, seed=5)
    assert chi2_pvalue(pairs, processed_two_token_law(target, SamplingConfig(1.0))) > 1e-3


# ------------------------------------------------------------------------------------ host constraints
class StrideRule:
    """A `ConstraintSpec` for tests: a toy grammar whose allowed set depends on the whole output so far —
    every third token is even, the others lie within 10 ids after the previous token (mod V)."""

    def __init__(self, vocab: int = 64):
        self.vocab = vocab
        self.started: list = []

    def allowed_after(self, output: list[int], last: int) -> list[int]:
        if len(output) % 3 == 2:
            return list(range(0, self.vocab, 2))
        return [(last + k) % self.vocab for k in range(1, 11)]

    def start(self, vocab_size):
        state = StrideState(self)
        self.started.append(state)
        return state


class StrideState:
    def __init__(self, rule: StrideRule):
        self.rule, self.output, self.last = rule, [], 0

    def allowed(self, draft):
        out, last = list(self.output), self.last
        mask = torch.zeros(len(draft) + 1, self.rule.vocab, dtype=torch.bool)
        broken = False
        for i in range(len(draft) + 1):
            if broken:
                mask[i] = True  # never read: past a draft token the rule refuses
                continue
            mask[i, self.rule.allowed_after(out, last)] = True
            if i < len(draft):
                broken = not bool(mask[i, draft[i]])
                out, last = out + [draft[i]], draft[i]
        return mask

    def commit(self, tokens):
        for t in tokens:
            assert t in self.rule.allowed_after(self.output, self.last), "committed a token the rule refuses"
            self.output.append(t)
            self.last = t


def hf_constrained(model, prompt, n, rule: StrideRule):
    def allowed(batch_id, ids):
        output = ids[len(prompt):].tolist()
        return rule.allowed_after(output, output[-1] if output else 0)

    return model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=n, pad_token_id=0, eos_token_id=None,
                          prefix_allowed_tokens_fn=allowed)[0, len(prompt):].tolist()


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_with_a_constraint_is_transformers_prefix_constrained(llama, llama_draft, gamma):
    for prompt in PROMPTS:
        rule = StrideRule()
        ref = hf_constrained(llama, prompt, 14, rule)
        for drafter in (llama_draft, PromptLookupDrafter()):
            rule = StrideRule()
            ours = specdec.generate(llama, [prompt], drafter, max_new_tokens=14, temperature=0, eos_token_id=[],
                                    num_draft_tokens=gamma, engine="hf", constraint=rule,
                                    repetition_penalty=1.0).sequences[0]
            assert ours == ref
            assert rule.started[0].output == ours  # committed exactly the output: rejected drafts rolled back
    assert ref != hf_processed(llama, PROMPTS[0], 14, [])


def test_sampled_output_keeps_the_constraint(llama, llama_draft):
    rule = StrideRule()
    res = specdec.generate(llama, PROMPTS * 4, llama_draft, max_new_tokens=12, temperature=1.0, eos_token_id=[],
                           num_draft_tokens=3, engine="hf", constraint=rule, seed=0)
    assert [s.output for s in rule.started] == res.sequences  # StrideState.commit asserts every token is allowed


@pytest.mark.parametrize("maker", ["t5", "bart"])
def test_encoder_decoder_greedy_with_processors_is_transformers_generate(maker):
    """Encoder-decoder targets: the repetition penalty covers the decoder's text (its start token and the output),
    as transformers' generate does; drafts from a smaller encoder-decoder."""
    from seq2seq_models import make_bart, make_t5

    make = make_t5 if maker == "t5" else make_bart
    target, draft = make(0, vocab=64), make(1, layers=1, vocab=64)
    case = dict(repetition_penalty=1.7, logit_bias={9: 1.5}, frequency_penalty=0.4)
    for prompt in PROMPTS:
        kwargs = dict(repetition_penalty=1.7, sequence_bias={(9,): 1.5},
                      logits_processor=LogitsProcessorList([OpenAIPenalties(1, 0.4, 0.0)]))
        ref = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10, eos_token_id=None,
                              pad_token_id=0, **kwargs)[0, 1:].tolist()
        plain = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10, eos_token_id=None,
                                pad_token_id=0)[0, 1:].tolist()
        ours = specdec.generate(target, [prompt], draft, max_new_tokens=10, temperature=0, eos_token_id=[],
                                num_draft_tokens=3, engine="hf", **case).sequences[0]
        assert ours == ref
    assert ref != plain
