"""Drafters with encoder-decoder targets: the drafter's q is what it sampled from, caches stay in lockstep,
and the first two decoder tokens follow the target's exact law (chi-square, with negative controls)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import seq2seq_models
import specdec
from seq2seq_models import teacher_forced_logits
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.seq2seq import Seq2SeqModelDrafter
from specdec.models.seq2seq import HFSeq2SeqLM, decoder_start_token_id

transformers = pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

VOCAB = 16  # small, so that the joint law of two tokens (V² cells) is well covered by samples
NUM_ROWS = 20_000
PROMPT = [3, 7, 5, 9, 3, 7, 12]  # repeats, so that prompt lookup proposes something
RAGGED = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5], [7, 7, 7, 7, 8, 9, 7, 7, 7, 7, 8], [2, 3]]


make_t5 = partial(seq2seq_models.make_t5, vocab=VOCAB)
make_bart = partial(seq2seq_models.make_bart, vocab=VOCAB, max_positions=64)


@pytest.fixture(scope="module")
def models():
    return {
        "t5": make_t5(0),
        "t5_draft": make_t5(1, layers=1, d_model=16),
        "bart": make_bart(0),
        "bart_draft": make_bart(1, layers=1, d_model=16),
    }


# -- the exact law of the first two decoder tokens ---------------------------------------------------------


def exact_two_token_law(model, prompt, sampling: specdec.SamplingConfig) -> torch.Tensor:
    """P(t1, t2) = p(t1) · p(t2 | t1) under the standardized target, by teacher forcing → `[V, V]`."""
    start = decoder_start_token_id(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    decoder = torch.stack([torch.full((vocab,), start), torch.arange(vocab)], dim=1)  # [V, 2]: [start, t1]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt] * vocab), decoder_input_ids=decoder).logits  # [V, 2, V]
    probs = specdec.standardize_logits(logits.double(), sampling).double()
    return probs[0, 0][:, None] * probs[:, 1]


def two_token_counts(sequences, vocab) -> torch.Tensor:
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for seq in sequences:
        counts[seq[0], seq[1]] += 1
    return counts


def chi_square_pvalue(observed: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson chi-square of counts against a law; cells expecting < 5 are pooled. A sample outside the law's
    support gives 0."""
    observed, law = observed.flatten(), law.flatten()
    if bool((observed[law == 0] > 0).any()):
        return 0.0
    expected = law / law.sum() * observed.sum()
    big = expected >= 5
    obs = observed[big].tolist() + [float(observed[~big].sum())]
    exp = expected[big].tolist() + [float(expected[~big].sum())]
    if exp[-1] < 5:  # too little pooled mass to form a cell: fold it into the largest cell
        i = max(range(len(exp) - 1), key=exp.__getitem__)
        obs[i] += obs.pop()
        exp[i] += exp.pop()
    return float(scipy_stats.chisquare(obs, exp).pvalue)


class LyingDrafter(Drafter):
    """Negative control: samples from its model but reports a uniform q (the classic bug)."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.vocab_size = inner.vocab_size

    def begin(self, context, vocab_size):
        self.inner.begin(context, vocab_size)

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = self.inner.propose(context, num_draft_tokens, sampling, generator, confidence_threshold)
        uniform = torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return Proposal(proposal.tokens, uniform, proposal.lengths, proposal.forward_passes)

    def commit(self, context):
        self.inner.commit(context)

    def select_rows(self, index):
        self.inner.select_rows(index)


def run_two_tokens(target, drafter, sampling: dict, seed: int = 0, gamma: int = 3):
    # 3 new tokens so that the first step may draft γ (a step never drafts more than it can commit, so with 2
    # it would draft 1); the law tested is that of the first two
    res = specdec.generate(
        target, [PROMPT] * NUM_ROWS, drafter=drafter, max_new_tokens=3, num_draft_tokens=gamma, seed=seed,
        eos_token_id=[], **sampling,
    )
    assert all(len(s) == 3 for s in res.sequences)
    return two_token_counts(res.sequences, VOCAB), res.stats


DISTRIBUTION_CASES = [
    ("t5", "model", dict(temperature=1.0)),
    ("t5", "model", dict(temperature=0.8, top_k=4)),
    ("t5", "bigram", dict(temperature=1.0)),
    ("t5", "prompt_lookup", dict(temperature=1.0)),
    ("bart", "model", dict(temperature=1.0)),
    ("bart", "model", dict(temperature=1.2, top_p=0.8)),
]


def make_drafter(kind, family, models):
    if kind == "model":
        return models[family + "_draft"]
    if kind == "bigram":  # fitted on target-side text, as in the paper: here the target's own samples
        start = decoder_start_token_id(models[family])
        corpus = specdec.generate(models[family], [PROMPT] * 200, max_new_tokens=6, seed=123, eos_token_id=[]).sequences
        return specdec.NGramDrafter(2).fit([[start] + seq for seq in corpus], VOCAB)
    return specdec.PromptLookupDrafter(max_ngram_size=2)


@pytest.mark.parametrize("family,kind,sampling", DISTRIBUTION_CASES)
def test_first_two_tokens_follow_the_exact_target_law(family, kind, sampling, models):
    target = models[family]
    law = exact_two_token_law(target, PROMPT, specdec.SamplingConfig(**sampling))
    counts, stats = run_two_tokens(target, make_drafter(kind, family, models), sampling)
    assert stats.accepted_tokens > 0 and stats.accepted_tokens < stats.drafted_tokens  # both paths exercised
    assert chi_square_pvalue(counts, law) > 1e-3


@pytest.mark.parametrize("family,sampling", [("t5", dict(temperature=1.0)), ("bart", dict(temperature=1.2, top_p=0.8))])
def test_negative_controls_fail_the_same_test(family, sampling, models):
    target, draft = models[family], models[family + "_draft"]
    law = exact_two_token_law(target, PROMPT, specdec.SamplingConfig(**sampling))
    # Accepting every draft = emitting the drafter's own samples.
    counts, _ = run_two_tokens(draft, None, sampling)
    assert chi_square_pvalue(counts, law) < 1e-6
    # Reporting a q other than the one sampled from.
    counts, _ = run_two_tokens(target, LyingDrafter(Seq2SeqModelDrafter(draft)), sampling)
    assert chi_square_pvalue(counts, law) < 1e-6


# -- Seq2SeqModelDrafter: the q it reports is the one it sampled from, through commits and row drops --------


class CheckingDrafter(Drafter):
    """Wraps a Seq2SeqModelDrafter; on every step recomputes each row's q by teacher forcing the drafter model."""

    def __init__(self, inner: Seq2SeqModelDrafter, sampling: specdec.SamplingConfig):
        self.inner, self.sampling = inner, sampling
        self.vocab_size = inner.vocab_size
        self.checked = 0

    def begin(self, context, vocab_size):
        self.inner.begin(context, vocab_size)

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = self.inner.propose(context, num_draft_tokens, sampling, generator, confidence_threshold)
        model = self.inner.model
        start = decoder_start_token_id(model)
        for b in range(context.batch_size):
            text = [start] + context.row(b)[1:] + proposal.tokens[b, :-1].tolist()
            logits = teacher_forced_logits(model, context.source[b], text)[-num_draft_tokens:]
            torch.testing.assert_close(proposal.probs[b], specdec.standardize_logits(logits, self.sampling),
                                       atol=1e-5, rtol=1e-4)
            assert bool((proposal.probs[b].gather(1, proposal.tokens[b][:, None]) > 0).all())
            self.checked += 1
        return proposal

    def commit(self, context):
        self.inner.commit(context)

    def select_rows(self, index):
        self.inner.select_rows(index)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_model_drafter_reports_the_q_it_sampled_from(family, models):
    sampling = specdec.SamplingConfig(temperature=0.9, top_k=8)
    checking = CheckingDrafter(Seq2SeqModelDrafter(models[family + "_draft"]), sampling)
    # EOS = a common token, so rows finish at different steps and leave the batch.
    specdec.generate(models[family], RAGGED, drafter=checking, max_new_tokens=12, num_draft_tokens=3, seed=0,
                     temperature=0.9, top_k=8, eos_token_id=[4])
    assert checking.checked > len(RAGGED)


def test_drafter_with_its_own_start_token(models):
    """A drafter whose decoder starts with another id reads the committed text behind its own start token."""
    draft = make_t5(1, layers=1, d_model=16)
    draft.config.decoder_start_token_id = 5
    draft.generation_config.decoder_start_token_id = 5
    sampling = specdec.SamplingConfig(temperature=1.0)
    checking = CheckingDrafter(Seq2SeqModelDrafter(draft), sampling)
    specdec.generate(models["t5"], RAGGED, drafter=checking, max_new_tokens=8, num_draft_tokens=2, seed=0,
                     eos_token_id=[], temperature=1.0)
    assert checking.checked > 0


def test_greedy_drafts_are_the_drafters_greedy_continuation(models):
    target, draft = models["t5"], models["t5_draft"]
    lm = HFSeq2SeqLM(target)
    context = lm.begin(RAGGED, max_new_tokens=10)
    drafter = Seq2SeqModelDrafter(draft)
    drafter.begin(context, lm.vocab_size)
    proposal = drafter.propose(context, 5, specdec.SamplingConfig(temperature=0), None)
    for b, prompt in enumerate(RAGGED):
        expected = draft.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=5, eos_token_id=None)
        assert proposal.tokens[b].tolist() == expected[0, 1:].tolist()


def test_drafter_needs_encoder_inputs(models):
    from specdec.sequences import TokenBuffer

    drafter = Seq2SeqModelDrafter(models["t5_draft"])
    with pytest.raises(ValueError, match="encoder-decoder target"):
        drafter.begin(TokenBuffer([[0]], capacity=4), VOCAB)


# -- the table and lookup drafters read the encoder-decoder context ----------------------------------------


def test_prompt_lookup_copies_from_the_encoder_input(models):
    lm = HFSeq2SeqLM(models["t5"])
    context = lm.begin([[4, 5, 6, 7, 8, 9], [10, 11, 12, 13]], max_new_tokens=10)
    # Decoder texts so far: row 0 ends with "5 6", row 1 with "12".
    context.append(torch.tensor([[5, 6], [12, 0]]), torch.tensor([2, 1]))
    proposal = specdec.PromptLookupDrafter(max_ngram_size=2).propose(context, 3, specdec.SamplingConfig(0), None)
    assert proposal.tokens[0].tolist() == [7, 8, 9]
    # Row 1 copies what followed "12" in the haystack source + decoder text: "13", then its own "12".
    assert proposal.tokens[1, :2].tolist() == [13, 12] and proposal.lengths.tolist() == [3, 2]


def test_bigram_drafter_reads_the_decoder_text(models):
    lm = HFSeq2SeqLM(models["bart"])
    context = lm.begin([[4, 5, 6]], max_new_tokens=10)  # BART decoder text starts with </s> = 2
    bigram = specdec.NGramDrafter(2).fit([[2, 9, 3, 5]], VOCAB)
    proposal = bigram.propose(context, 3, specdec.SamplingConfig(0), None)
    assert proposal.tokens[0].tolist() == [9, 3, 5]
