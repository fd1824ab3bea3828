"""Loop-only drafters on the engine (`drafters/loop_adapter.py`, `engine.build`): a duck-typed `LoopDrafter` written
here and `HierarchicalDrafter` run under `engine="fast"` with plain decoding's greedy tokens and the loop's; sampled
drafts depend only on a request's own seed and position (a prompt alone = in a batch), which a control that draws
every row from one shared stream breaks; `engine="auto"` takes a model-free one to the engine and keeps one holding
a model (re-begun every step, it would prefill the whole text each time) on the loop."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import specdec
from helpers import perturbed_copy
from specdec.decoding import route
from specdec.drafters import loop_adapter
from specdec.drafters.loop_adapter import LoopOnEngine, holds_model, is_loop_only
from specdec.drafters.protocol import LoopDrafter, Proposal

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8]]


class EchoDrafter:
    """A loop drafter written against the loop's protocol only (no specdec base class): it drafts γ copies of the row's
    last token, greedy; sampled, from a tempered law peaked at it (q reported), drawn from the loop's generator.
    lie=True: reports the uniform law instead of the one it drew from (the negative control of the law test)."""

    deterministic = False
    accepts_processor = False

    def __init__(self, vocab_size: int = 64, lie: bool = False):
        self.vocab_size, self.lie = vocab_size, lie
        self.begun = 0

    def begin(self, context, vocab_size):
        self.begun += 1

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        last = context.tokens.gather(1, (context.lengths - 1)[:, None])  # [B, 1]
        tokens = last.expand(-1, num_draft_tokens).clone()
        if sampling.greedy:
            return Proposal(tokens=tokens)
        logits = torch.zeros(tokens.shape[0], num_draft_tokens, self.vocab_size, device=tokens.device)
        logits.scatter_(2, tokens[..., None], 3.0)
        q = (logits / sampling.temperature).softmax(-1)
        drawn = torch.multinomial(q.reshape(-1, self.vocab_size), 1, generator=generator).reshape(tokens.shape)
        return Proposal(tokens=drawn, probs=torch.full_like(q, 1.0 / self.vocab_size) if self.lie else q)

    def commit(self, context):
        pass

    def select_rows(self, index):
        pass


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target, 0.4, seed=5)


def gen(target, drafter, prompts=PROMPTS, engine="fast", **kw):
    kw.setdefault("temperature", 0)
    return specdec.generate(target, prompts, drafter, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[],
                            engine=engine, **kw)


def test_a_duck_typed_loop_drafter_runs_on_the_engine_with_plain_greedy_tokens(pair):
    target, _ = pair
    drafter = EchoDrafter()
    assert isinstance(drafter, LoopDrafter) and is_loop_only(drafter)
    assert route.runner_for("auto", target, drafter, 3) == "fast" and not holds_model(drafter)
    plain = specdec.generate(target, PROMPTS, None, max_new_tokens=16, temperature=0, eos_token_id=[]).sequences
    out = gen(target, drafter, engine="auto")
    assert out.sequences == plain == gen(target, EchoDrafter(), engine="hf").sequences
    assert drafter.begun == 1 and out.stats.drafted_tokens > 0  # greedy: the batch followed from step to step
    engine = next(e for e in target.__dict__["_specdec_engines"].values() if e[0]() is drafter)[1]
    assert isinstance(engine.drafter, LoopOnEngine) and not engine.cuda_graphs


class OwnHierarchy(specdec.HierarchicalDrafter):
    """A subclass of its own (it may change the rule): the engine binds only the class itself (`engine.hierarchy`)."""


def test_a_hierarchical_drafter_subclass_runs_on_the_engine_with_plain_greedy_tokens(pair):
    """Its inner drafter a model (the class itself over a model or a table runs natively: `engine.hierarchy`)."""
    target, draft = pair
    drafter = OwnHierarchy(draft, perturbed_copy(draft, 0.2, seed=6), num_inner_draft_tokens=2)
    plain = specdec.generate(target, PROMPTS, None, max_new_tokens=16, temperature=0, eos_token_id=[]).sequences
    assert route.runner_for("auto", target, drafter, 3) == "hf" and holds_model(drafter)  # (the loop by default)
    out = gen(target, drafter)
    assert out.sequences == plain == gen(target, drafter, engine="hf").sequences
    assert out.stats.accepted_tokens > 0  # its drafts were verified, some accepted
    engine = next(e for e in target.__dict__["_specdec_engines"].values() if e[0]() is drafter)[1]
    assert isinstance(engine.drafter, LoopOnEngine)


def test_sampled_drafts_depend_only_on_the_requests_own_seed_and_position(pair):
    target, _ = pair
    alone = gen(target, EchoDrafter(), PROMPTS[:1], temperature=1.0, seed=7).sequences[0]
    batched = gen(target, EchoDrafter(), PROMPTS, temperature=1.0, seed=7)
    assert batched.sequences[0] == alone and batched.stats.accepted_tokens > 0
    assert gen(target, EchoDrafter(), PROMPTS, temperature=1.0, seed=7).sequences == batched.sequences


class TrackingDrafter(EchoDrafter):
    """Checks the loop's protocol on every call: what `begin` / `commit` / `select_rows` told it is the text `propose`
    is given, and a `commit`'s text extends what it held (the drafter's state follows the committed text)."""

    def begin(self, context, vocab_size):
        super().begin(context, vocab_size)
        self.rows = [context.row(b) for b in range(context.batch_size)]

    def commit(self, context):
        for b in range(context.batch_size):
            assert context.row(b)[: len(self.rows[b])] == self.rows[b], "commit: a row's text does not extend its state"
        self.rows = [context.row(b) for b in range(context.batch_size)]

    def select_rows(self, index):
        self.rows = [self.rows[i] for i in index.tolist()]
        self.selected = getattr(self, "selected", 0) + 1

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        assert self.rows == [context.row(b) for b in range(context.batch_size)], "propose: state is not the text"
        return super().propose(context, num_draft_tokens, sampling, generator, confidence_threshold)


def run_engine(target, drafter, prompts, budgets):
    """Greedy requests of different budgets on one `Engine` (rows leave at different steps, slots move)."""
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    engine = Engine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=3,
                                                  cuda_graphs=False))
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, eos_token_ids=())): i
           for i, (p, n) in enumerate(zip(prompts, budgets))}
    out = [[] for _ in prompts]
    while engine.has_unfinished():
        for o in engine.step():
            out[ids[o.request_id]].extend(o.new_token_ids)
    return out


BUDGETS = [5, 16, 9, 12]


def test_a_greedy_batch_is_followed_through_the_loops_protocol_as_rows_leave_and_move(pair):
    target, _ = pair
    drafter, prompts = TrackingDrafter(), PROMPTS + [[2, 7, 1, 8, 2, 8]]
    plain = [specdec.generate(target, [p], None, max_new_tokens=n, temperature=0, eos_token_id=[]).sequences[0]
             for p, n in zip(prompts, BUDGETS)]
    assert run_engine(target, drafter, prompts, BUDGETS) == plain
    # followed, not begun per step: begun again only when a row the last batch lacked appears (a request joining,
    # or the batch bucket's padding row in a freed slot), here once
    assert drafter.begun <= 2 and drafter.selected >= 2


def test_negative_control_a_follower_that_skips_select_rows_breaks_the_protocol(pair, monkeypatch):
    target, _ = pair
    monkeypatch.setattr(TrackingDrafter, "select_rows", lambda self, index: None)  # rows left, the state kept them
    with pytest.raises(AssertionError, match="state is not the text|does not extend"):
        run_engine(target, TrackingDrafter(), PROMPTS + [[2, 7, 1, 8, 2, 8]], BUDGETS)


def test_negative_control_one_shared_stream_for_every_row_breaks_the_batch_invariance(pair, monkeypatch):
    """Drawn from one generator across a step's rows (the loop's way), a request's tokens depend on its batch."""
    target, _ = pair
    shared = torch.Generator().manual_seed(0)

    def row(self, text, gamma, seed, temperature, device):
        from specdec.core import SamplingConfig
        from specdec.sequences import TokenBuffer

        buffer = TokenBuffer([text], len(text) + 2 * gamma + 2, device)
        p = self.drafter.propose(buffer, gamma, SamplingConfig(temperature=temperature), shared, None)
        return p.tokens[0], None if p.probs is None else p.probs[0], gamma, 0

    monkeypatch.setattr(LoopOnEngine, "_row", row)
    shared.manual_seed(0)
    alone = gen(target, EchoDrafter(), PROMPTS[:1], temperature=1.0, seed=7).sequences[0]
    shared.manual_seed(0)
    assert gen(target, EchoDrafter(), PROMPTS, temperature=1.0, seed=7).sequences[0] != alone


def test_what_the_adapter_takes():
    assert not is_loop_only(specdec.NGramDrafter(2)) and not is_loop_only(None)  # (the engine calls it as it is)
    with pytest.raises(TypeError, match="loop-only"):
        LoopOnEngine(specdec.NGramDrafter(2), 64)
    with pytest.raises(ValueError, match="vocabularies differ"):
        LoopOnEngine(EchoDrafter(), 65)
    assert loop_adapter.LoopOnEngine.capturable is False


LAW_PROMPT, LAW_ROWS = [3, 1, 4, 1, 5], 4000


@pytest.mark.slow
@pytest.mark.parametrize("lie", [False, True], ids=["exact", "negative-control-lying-q"])
def test_the_two_token_law_through_the_adapter_is_the_targets(make_llama, lie):
    """T = 1 on the engine through `LoopOnEngine`: the joint law of the first two tokens is the target's (chi-square);
    a drafter reporting a q other than the one it drew from fails the same test."""
    from specdec.core import SamplingConfig, standardize_logits
    from stats_utils import chi2_pvalue

    target = make_llama(10, vocab=16)
    res = specdec.generate(target, [LAW_PROMPT] * LAW_ROWS, EchoDrafter(16, lie=lie), max_new_tokens=3,
                           temperature=1.0, num_draft_tokens=2, seed=4, eos_token_id=[], engine="fast")
    with torch.no_grad():
        p1 = standardize_logits(target(torch.tensor([LAW_PROMPT])).logits[0, -1], SamplingConfig())
        p2 = standardize_logits(target(torch.tensor([LAW_PROMPT + [t] for t in range(16)])).logits[:, -1],
                                SamplingConfig())
    law = (p1[:, None] * p2).flatten().double().numpy()
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert res.stats.accepted_tokens > 0
    pvalue = chi2_pvalue(pairs, law)
    assert (pvalue < 1e-8) if lie else (pvalue > 1e-3)
