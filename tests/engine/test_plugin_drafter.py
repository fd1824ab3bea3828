"""A drafter written in this file against the documented protocol (`drafters.protocol.SlotDrafter`) runs on the
engine as it is: greedy output equals plain decoding, sampled output has the target's exact law (chi-square on the
joint law of two tokens), and a drafter that reports a q other than the one it drew from fails the same test."""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig
from specdec.drafters import Proposal, SlotDrafter
from specdec.drafters.protocol import is_slot_drafter
from specdec.engine import Engine, EngineConfig, UnsupportedModel
from stats_utils import chi2_pvalue
from test_distribution import PROMPT, exact_two_token_law

PASS, FAIL = 1e-3, 1e-8
ROWS = 2000
PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 7], [3, 9, 4, 1, 2, 6, 8], [11]]


class RepeatLast:
    """Proposes the last committed token γ times: deterministic, one-hot q (`probs=None`)."""

    def propose(self, context, num_draft_tokens) -> Proposal:
        last = context.tokens.gather(1, (context.lengths - 1)[:, None])  # [b, 1]
        return Proposal(last.expand(-1, num_draft_tokens).contiguous())


class BigramTable:
    """Draws each draft from a fixed random table's law q(· | previous token), through the engine's own draw
    (`StepView.draft_chain`: each row's temperature and filters, counter-based seeds): q is what it drew from."""

    def __init__(self, vocab: int, seed: int = 0, sharpness: float = 3.0):
        generator = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(vocab, vocab, generator=generator) * sharpness  # [V, V]: row = previous token

    def propose(self, context, num_draft_tokens) -> Proposal:
        last = context.tokens.gather(1, (context.lengths - 1)[:, None]).squeeze(1)  # [b]
        if self.logits.device != last.device:  # once (a graph's warm-up call), never inside a capture
            self.logits = self.logits.to(last.device)
        table = self.logits
        return context.draft_chain(num_draft_tokens, lambda i, prev: table[last if prev is None else prev], 0)


class LyingTable(BigramTable):
    """Negative control: draws from its table but reports a uniform q (a valid distribution, not the drawn one)."""

    def propose(self, context, num_draft_tokens) -> Proposal:
        proposal = super().propose(context, num_draft_tokens)
        if proposal.probs is None:  # greedy rows: one-hot q, nothing to lie about
            return proposal
        uniform = torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return Proposal(proposal.tokens, uniform, proposal.lengths, proposal.forward_passes)


class LoopOnly:
    """A loop-style propose (sampling and generator required): not a drafter the engine can call."""

    def propose(self, context, num_draft_tokens, sampling, generator) -> Proposal:
        raise AssertionError("never called")


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(10, vocab=16)


def test_the_protocol_check_takes_plugins_and_refuses_loop_calls():
    for drafter in (RepeatLast(), BigramTable(16)):
        assert isinstance(drafter, SlotDrafter) and is_slot_drafter(drafter)
    assert isinstance(LoopOnly(), SlotDrafter) and not is_slot_drafter(LoopOnly())  # has propose, the wrong call


def test_a_loop_only_drafter_is_refused_by_name(target):
    with pytest.raises(UnsupportedModel, match="LoopOnly drafters .* propose\\(context, num_draft_tokens\\)"):
        Engine(target, LoopOnly(), EngineConfig(max_batch_size=2, max_seq_len=32, cuda_graphs=False))


@pytest.mark.parametrize("drafter", [RepeatLast(), BigramTable(16)], ids=["repeat-last", "bigram"])
def test_greedy_equals_plain_decoding_on_the_engine(target, drafter):
    engine = Engine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=3,
                                                  cuda_graphs=False))
    assert engine.drafter is drafter  # passed through as it is
    ids = {engine.add_request(p, specdec.SamplingParams(max_new_tokens=12, temperature=0)): i
           for i, p in enumerate(PROMPTS)}
    out = [[] for _ in PROMPTS]
    while engine.has_unfinished():
        for o in engine.step():
            out[ids[o.request_id]] += o.new_token_ids
    plain = specdec.generate(target, PROMPTS, max_new_tokens=12, temperature=0, eos_token_id=[], engine="fast")
    assert out == plain.sequences
    assert engine.stats.drafted_tokens > 0  # (it did propose: every step verified its drafts)
    spec = specdec.generate(target, PROMPTS, drafter=drafter, max_new_tokens=12, temperature=0, eos_token_id=[],
                            num_draft_tokens=3, engine="fast")
    assert spec.sequences == plain.sequences and spec.stats.drafted_tokens > 0


def _two_token_pvalue(target, drafter, sampling: SamplingConfig, gamma: int = 2, seed: int = 1):
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=drafter, max_new_tokens=3,
                           temperature=sampling.temperature, top_k=sampling.top_k, num_draft_tokens=gamma,
                           seed=seed, eos_token_id=[], engine="fast")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    return chi2_pvalue(pairs, exact_two_token_law(target, sampling)), res.stats


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.8, top_k=6)], ids=["t1", "t0.8-top6"])
def test_a_plugin_drafters_q_keeps_the_targets_law(target, sampling):
    pvalue, stats = _two_token_pvalue(target, BigramTable(16), sampling)
    assert pvalue > PASS
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # (some drafts accepted, some rejected)


def test_one_hot_plugin_keeps_the_targets_law(target):
    pvalue, stats = _two_token_pvalue(target, RepeatLast(), SamplingConfig(1.0))
    assert pvalue > PASS and stats.drafted_tokens > 0


def test_negative_control_a_drafter_that_lies_about_q_fails(target):
    pvalue, _ = _two_token_pvalue(target, LyingTable(16), SamplingConfig(1.0))
    assert pvalue < FAIL


def test_auto_runs_a_plugin_drafter_on_the_engine(target):
    """`engine="auto"` on a CPU takes the transformers loop for loop drafters; a drafter only the engine can call
    goes to the engine (the loop would refuse it: it is not a `LoopDrafter`)."""
    plain = specdec.generate(target, PROMPTS, max_new_tokens=8, temperature=0, eos_token_id=[], engine="hf")
    spec = specdec.generate(target, PROMPTS, drafter=RepeatLast(), max_new_tokens=8, temperature=0, eos_token_id=[],
                            num_draft_tokens=2)
    assert spec.sequences == plain.sequences and spec.stats.drafted_tokens > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_plugin_and_table_drafters_in_captured_graphs(make_llama):
    """On CUDA the engine captures the drafter's propose in a graph: a plugin, prompt lookup and the n-gram tables
    (one class each for both runners) keep greedy = plain decoding there."""
    target = make_llama(10, vocab=16).cuda()
    plain = specdec.generate(target, PROMPTS, max_new_tokens=12, temperature=0, eos_token_id=[], engine="fast")
    ngram = specdec.NGramDrafter(2).fit(PROMPTS, 16)
    for drafter in (RepeatLast(), BigramTable(16), specdec.PromptLookupDrafter(), ngram):
        engine = Engine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=3))
        assert engine.cuda_graphs and engine.drafter is drafter
        ids = {engine.add_request(p, specdec.SamplingParams(max_new_tokens=12, temperature=0)): i
               for i, p in enumerate(PROMPTS)}
        out = [[] for _ in PROMPTS]
        while engine.has_unfinished():
            for o in engine.step():
                out[ids[o.request_id]] += o.new_token_ids
        assert out == plain.sequences, type(drafter).__name__
