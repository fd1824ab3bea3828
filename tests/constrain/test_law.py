"""The sampled law of constrained speculative decoding is the masked target's, p̃ ∝ p · mask (chi-square on the
first three tokens, at T = 1 and at T = 0.7 with top-k), on the transformers loop and on the engine.

Negative controls that must fail the same test: a drafter that samples from the masked q̃ but reports the
unmasked q; a grammar state that is not advanced along the draft (every position masked as after the committed
text); top-k applied before the mask. A drafter that never sees the mask (q unmasked: a forbidden draft token is
rejected with certainty where it stands, the residual max(0, p̃ − q) sampled there) is exact — speculative sampling
is exact for any q — and is tested as such.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")
transformers = pytest.importorskip("transformers")

import specdec  # noqa: E402
from specdec.constrain import Constraint, GrammarState, compile_constraint  # noqa: E402
from specdec.core import SamplingConfig, standardize_logits  # noqa: E402
from specdec.drafters.base import Proposal  # noqa: E402
from specdec.drafters.model import ModelDrafter  # noqa: E402
from stats_utils import chi2_pvalue  # noqa: E402

VOCAB = ["", ""] + list("abc0xyz") + ["ab", "bc", "abc", "c0"]  # "" = special; EOS = 1
V, EOS, N = len(VOCAB), 1, 3  # the law of the first N tokens
PROMPT = [3, 4, 5, 2]
ROWS = 2000


def _peaked_llama(seed: int, layers: int) -> torch.nn.Module:
    """A tiny random Llama whose next-token laws are far from flat (its LM head scaled up)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    return model


@pytest.fixture(scope="module")
def setup():
    grammar = compile_constraint(Constraint.regex("(ab|c)+0"), VOCAB, V, [EOS])
    return _peaked_llama(0, 2), _peaked_llama(1, 1), grammar


@torch.inference_mode()
def _exact_law(target, grammar, sampling: SamplingConfig = SamplingConfig(1.0), mask_first: bool = True) -> np.ndarray:
    """P(x_1..x_N) under plain decoding from p̃ (mask, then temperature and filters), by enumeration: [V ** N]."""
    law = np.zeros(V ** N)

    def visit(prefix, prob):
        if len(prefix) == N:
            law[sum(t * V ** (N - 1 - i) for i, t in enumerate(prefix))] += prob
            return
        matcher = grammar.matcher()
        for t in prefix:
            assert matcher.accept_token(t)
        if matcher.is_terminated():  # ended with EOS: the rest is padding (id 0, never generated)
            visit(prefix + [0] * (N - len(prefix)), prob)
            return
        allowed = grammar.start(V)
        allowed.matcher = matcher
        allowed = allowed.allowed([])[0]
        logits = target(torch.tensor([PROMPT + prefix])).logits[0, -1]
        if mask_first:
            probs = standardize_logits(logits.masked_fill(~allowed, float("-inf")).double(), sampling)
        else:  # WRONG order (a control): the filters on the raw scores, then the mask
            probs = standardize_logits(logits.double(), sampling) * allowed
            if probs.sum() == 0:
                return
            probs = probs / probs.sum()
        for t in (probs > 0).nonzero().flatten().tolist():
            visit(prefix + [t], prob * float(probs[t]))

    visit([], 1.0)
    return law


def _samples(target, drafter, grammar, gamma: int, seed: int, engine: str = "hf", **sampling) -> np.ndarray:
    sampling = {"temperature": 1.0, **sampling}
    result = specdec.generate(target, [PROMPT] * ROWS, drafter, max_new_tokens=N, seed=seed, num_draft_tokens=gamma,
                              constraint=grammar, eos_token_id=[EOS], engine=engine, **sampling)
    padded = [s + [0] * (N - len(s)) for s in result.sequences]  # texts that ended with EOS before N tokens
    return np.array([sum(t * V ** (N - 1 - i) for i, t in enumerate(s)) for s in padded])


class UnmaskedDrafter(ModelDrafter):
    """Never sees the grammar: q unmasked (a forbidden draft is rejected where it stands)."""

    def __init__(self, model):
        super().__init__(model)
        self.accepts_processor = False


class MisreportingDrafter(ModelDrafter):
    """NEGATIVE CONTROL: samples from the masked q̃ but reports the unmasked q."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None, processor=None):
        raw = []

        def spy(logits, drafted):
            raw.append(standardize_logits(logits, sampling))
            return processor(logits, drafted)

        proposal = super().propose(context, num_draft_tokens, sampling, generator, confidence_threshold, spy)
        return Proposal(proposal.tokens, torch.stack(raw, 1), proposal.lengths, proposal.forward_passes)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_law_is_the_masked_targets(setup, engine):
    target, draft, grammar = setup
    law = _exact_law(target, grammar)
    assert chi2_pvalue(_samples(target, None, grammar, 0, seed=1, engine=engine), law) > 1e-3  # plain decoding
    drafter = ModelDrafter(draft) if engine == "hf" else draft
    samples = _samples(target, drafter, grammar, 2, seed=2, engine=engine)
    assert chi2_pvalue(samples, law) > 1e-3
    assert chi2_pvalue(samples, _exact_law(draft, grammar)) < 1e-8  # the test can tell the draft's law apart


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_law_with_temperature_and_top_k_after_the_mask(setup, engine):
    """The mask comes before temperature and the filters: top-k keeps the k best *allowed* tokens."""
    target, draft, grammar = setup
    config = SamplingConfig(0.7, top_k=4)
    samples = _samples(target, ModelDrafter(draft) if engine == "hf" else draft, grammar, 2, seed=7, engine=engine,
                       temperature=0.7, top_k=4)
    assert chi2_pvalue(samples, _exact_law(target, grammar, config)) > 1e-3
    # the control: top-k applied before the mask (the k best tokens, then those the grammar allows) must fail
    assert chi2_pvalue(samples, _exact_law(target, grammar, config, mask_first=False)) < 1e-8


def test_law_with_a_drafter_that_never_sees_the_mask(setup):
    target, draft, grammar = setup
    assert chi2_pvalue(_samples(target, UnmaskedDrafter(draft), grammar, 2, seed=3), _exact_law(target, grammar)) > 1e-3


def test_negative_control_misreported_q_fails(setup):
    target, draft, grammar = setup
    assert chi2_pvalue(_samples(target, MisreportingDrafter(draft), grammar, 2, seed=4),
                       _exact_law(target, grammar)) < 1e-8


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_negative_control_state_not_advanced_along_the_draft_fails(setup, monkeypatch, engine):
    """WRONG: every position masked as after the committed text (the matcher not advanced along the draft)."""
    target, draft, grammar = setup
    allowed = GrammarState.allowed

    def stale(self, draft_tokens):
        first = allowed(self, [])[0]
        return first.expand(len(draft_tokens) + 1, -1).clone()

    def lenient_commit(self, tokens):  # the committed text may now break the grammar: stop masking that row
        for token in tokens:
            if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
                self.matcher = grammar.matcher()  # a fresh start: the row keeps being masked, wrongly
        self._walk, self._masks = [], []

    monkeypatch.setattr(GrammarState, "allowed", stale)
    monkeypatch.setattr(GrammarState, "commit", lenient_commit)
    samples = _samples(target, ModelDrafter(draft) if engine == "hf" else draft, grammar, 2, seed=6, engine=engine)
    assert chi2_pvalue(samples, _exact_law(target, grammar)) < 1e-8
