"""A drafter cannot lie about q (issue 35, items 1 and 10): every proposal entering the eager loop (chains and
token trees) is checked on the device — ids in [0, V), q finite, >= 0, summing to 1, positive at each drafted
token — and a violation raises `InvalidProposal` naming the drafter's class and the caller's row. Correct drafters
(the model drafter, n-gram, prompt lookup, -1 padding) pass: the negative controls."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.core.proposals import InvalidProposal, proposal_check
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.tree import TreeModelDrafter

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13]]


class LyingDrafter(Drafter):
    """Draws token 3 everywhere and reports q = `make_q(V)` ([V]) for the row `row` (None = every row), the true
    one-hot q elsewhere; `token` replaces the drafted id of that row."""

    def __init__(self, make_q=None, row=None, token=None):
        self.make_q, self.row, self.token = make_q, row, token

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        batch = context.batch_size
        tokens = torch.full((batch, num_draft_tokens), 3, dtype=torch.long)
        probs = torch.zeros(batch, num_draft_tokens, self.vocab)
        probs[..., 3] = 1.0
        rows = range(batch) if self.row is None else [self.row]
        for b in rows:
            if self.make_q is not None:
                probs[b] = self.make_q(self.vocab)
            if self.token is not None:
                tokens[b, 0] = self.token
        return Proposal(tokens=tokens, probs=probs)

    def begin(self, context, vocab_size):
        self.vocab = vocab_size


def _negative_at_token(vocab):
    """Sums to 1, but q(3) = -0.5 at the drafted token 3."""
    q = torch.full((vocab,), 1.0 / (vocab - 1))
    q[3], q[4] = -0.5, q[4] + 0.5
    return q


BAD = {
    "half of a distribution": (lambda v: torch.full((v,), 0.5 / v), None, "does not sum to 1"),
    "negative at its token": (_negative_at_token, None, "negative entry"),
    "all zeros": (lambda v: torch.zeros(v), None, "does not sum to 1"),
    "all NaN": (lambda v: torch.full((v,), float("nan")), None, "NaN or infinite"),
    "zero at its token": (lambda v: torch.cat([torch.zeros(4), torch.full((v - 4,), 1.0 / (v - 4))]), None,
                          "probability 0"),
    "an id past V": (None, 64, "outside the vocabulary"),
    "a negative id": (None, -7, "outside the vocabulary"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_an_invalid_proposal_is_refused_naming_the_drafter_and_row(llama, name):
    make_q, token, fault = BAD[name]
    with pytest.raises(InvalidProposal, match=rf"LyingDrafter .* row 1: .*{fault}"):
        specdec.generate(llama, PROMPTS, drafter=LyingDrafter(make_q, row=1, token=token), max_new_tokens=6,
                         num_draft_tokens=3, temperature=1.0, seed=0, engine="hf")


def test_greedy_calls_check_ids_and_q_too(llama):
    with pytest.raises(InvalidProposal, match="row 0"):
        specdec.generate(llama, PROMPTS, drafter=LyingDrafter(lambda v: torch.full((v,), 0.5 / v), row=0),
                         max_new_tokens=4, temperature=0.0, engine="hf")


class HonestRandomDrafter(Drafter):
    """Samples from a fixed random q and reports it: valid, whatever it costs in acceptance."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        batch = context.batch_size
        q = torch.softmax(torch.randn(batch, num_draft_tokens, self.vocab, generator=generator), -1)
        tokens = torch.multinomial(q.reshape(-1, self.vocab), 1, generator=generator).reshape(batch, -1)
        return Proposal(tokens=tokens, probs=q)

    def begin(self, context, vocab_size):
        self.vocab = vocab_size


class PaddedDrafter(Drafter):
    """Deterministic, one row's draft ended by vLLM's -1 padding (not a fault)."""

    deterministic = True

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        tokens = torch.full((context.batch_size, num_draft_tokens), 3, dtype=torch.long)
        tokens[0, 1:] = -1
        return Proposal(tokens=tokens)


@pytest.mark.parametrize("drafter", ["model", "random", "padded", "ngram", "prompt-lookup"])
def test_correct_drafters_pass(llama, llama_draft, drafter):
    made = {"model": lambda: llama_draft, "random": HonestRandomDrafter, "padded": PaddedDrafter,
            "ngram": lambda: specdec.NGramDrafter(2).fit([[5, 6, 7, 8, 9]], 64),
            "prompt-lookup": specdec.PromptLookupDrafter}[drafter]()
    for temperature in (0.0, 1.0):
        out = specdec.generate(llama, PROMPTS, drafter=made, max_new_tokens=6, num_draft_tokens=3,
                               temperature=temperature, seed=0, engine="hf")
        assert [len(s) for s in out.sequences] == [6, 6]


def test_a_lying_tree_drafter_is_refused_and_an_honest_one_passes(llama, llama_draft):
    class LyingTree(TreeModelDrafter):
        def propose_tree(self, context, spec, sampling, generator, mode):
            proposal = super().propose_tree(context, spec, sampling, generator, mode)
            probs = proposal.probs.clone()
            probs[1] *= 0.5
            return type(proposal)(proposal.tokens, probs, proposal.forward_passes)

    with pytest.raises(InvalidProposal, match="LyingTree .* row 1: q does not sum to 1"):
        specdec.generate(llama, PROMPTS, drafter=LyingTree(llama_draft), max_new_tokens=4, draft_tree=[2, 1],
                         temperature=1.0, seed=0)
    out = specdec.generate(llama, PROMPTS, drafter=TreeModelDrafter(llama_draft), max_new_tokens=4,
                           draft_tree=[2, 1], temperature=1.0, seed=0)
    assert [len(s) for s in out.sequences] == [4, 4]


def test_the_check_reads_only_drafted_positions_of_active_rows():
    tokens = torch.tensor([[1, 2, 99], [1, 2, 3]])
    probs = torch.zeros(2, 3, 8)
    probs[0, 0, 1] = probs[0, 1, 2] = probs[1, 0, 1] = probs[1, 1, 2] = probs[1, 2, 3] = 1.0
    assert proposal_check(tokens, probs, torch.tensor([2, 3]), 8).tolist() == [0, 0]  # row 0 drafted 2
    assert proposal_check(tokens, probs, None, 8).tolist() == [1, 1 | 8]  # its third slot: id 99, q all zeros
    assert proposal_check(tokens, probs, None, 8, torch.tensor([False, True])).tolist() == [0, 0]
    half = probs.half()
    half[1, 0, 1] = 0.996  # within fp16's tolerance
    assert proposal_check(tokens, half, torch.tensor([2, 3]), 8).tolist() == [0, 0]
