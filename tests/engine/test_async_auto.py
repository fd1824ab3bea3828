"""Async scheduling under the default policy ("auto", `engine/async_plan.py`): the step launched ahead of step N's read
takes the γ the policy chooses from the last record read (N − 1's), so "auto" rows run ahead. Greedy tokens are the
synchronous engine's and plain decoding's; sampled ones follow the target's law (their γ's are not the synchronous
engine's: one step late), and are exactly those of a synchronous engine whose policy is one record behind where the
async engine's was. Negative controls: a policy fed the step in flight's counters (a record not read yet) or the
counters two records back is caught."""

import numpy as np
import pytest
import torch

from specdec import rng
from specdec.core import SamplingConfig
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.engine import Engine, EngineConfig
from specdec.engine.async_plan import counter_totals
from specdec.engine.async_steps import AsyncSteps
from specdec.engine.kv_pool import PagedSlotCache
from specdec.engine.policy import GammaPolicy
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from async_helpers import PROMPTS, _both, _drive, _traffic

PASS, FAIL = 1e-3, 1e-8


@pytest.fixture(scope="module")
def pair(peaked_pair):
    return peaked_pair


def _auto(pair, drafter="model", slots=3, **config):
    """`make(async_scheduling)` → an engine whose γ is the default "auto"."""
    target, draft = pair
    drafters = {"model": draft, "ngram": NGramDrafter(2).fit(PROMPTS, 64),
                "lookup": PromptLookupDrafter(max_ngram_size=2)}

    def make(on):
        return Engine(target, drafters[drafter], EngineConfig(max_batch_size=slots, max_seq_len=128,
                                                              async_scheduling=on, **config))
    return make


def _plain(pair, arrivals):
    """Plain decoding (no drafter) of the same traffic: the greedy reference."""
    target, _ = pair
    return _drive(Engine(target, None, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=0)),
                  arrivals)


@pytest.mark.parametrize("drafter", ["model", "ngram", "lookup"])
def test_auto_greedy_tokens_are_the_synchronous_engines_and_plain_decodings(pair, drafter, monkeypatch):
    """More requests than slots, arriving while others run, mixed lengths: the same tokens and finish reasons as the
    synchronous engine and as plain decoding; nothing emitted after a finish (rows that finished in a step were masked
    in the step launched ahead of its read); "auto" steps ran ahead and the fallbacks are counted by reason."""
    masked, mask = [], AsyncSteps.mask

    def spied(self, pending):
        masked.append(bool(pending.device[:-1, pending.run.layout.k + 3].any()))
        mask(self, pending)
    monkeypatch.setattr(AsyncSteps, "mask", spied)
    arrivals = _traffic(spread=2, n=7)
    sync, run, engine = _both(_auto(pair, drafter), arrivals)
    assert any(masked), "no step ran ahead of a finish"
    plain = _plain(pair, arrivals)
    assert run[0] == sync[0] == plain[0] and run[1] == sync[1] == plain[1] and not run[2]
    report = engine.overlap.report()
    assert report["ahead"] > 5 and report["ahead"] == engine.overlap.ahead, report
    assert set(report["synchronous_fallbacks"]) <= {"idle", "finished", "admission", "abort", "catch-up", "shape"}
    assert engine.policy.fixed is None and engine.policy.chosen  # ("auto" decided)
    assert engine.stats.num_generated_tokens == run[3]  # every committed token emitted, none past a finish


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_auto_eos_aborts(pair, layout):
    probe = _drive(_auto(pair, slots=6)(False), _traffic())[0]
    eos = (probe[0][4], probe[2][3])
    arrivals = _traffic(eos=eos, spread=1, n=6, new=20)
    aborts = {1: 4, 4: 9}
    for i in aborts:  # (running when aborted: no EOS, a long budget)
        at, prompt, _ = arrivals[i]
        arrivals[i] = (at, prompt, SamplingParams(temperature=0.0, max_new_tokens=60))
    sync, run, engine = _both(_auto(pair, kv_layout=layout), arrivals, aborts)
    assert run[1] == sync[1] and not run[2] and "stop" in run[1].values()
    assert [run[1][i] for i in aborts] == ["abort"] * 2
    full = _drive(_auto(pair, kv_layout=layout)(False), arrivals)[0]
    assert {i: t for i, t in run[0].items() if i not in aborts} == {i: t for i, t in sync[0].items() if i not in aborts}
    assert all(full[i][: len(run[0][i])] == run[0][i] for i in aborts)
    assert engine.overlap.ahead > 5, engine.overlap.report()


def test_auto_preemption_in_a_tight_pool(pair):
    """Paged, a pool too small for the traffic: preemptions (those steps synchronous, "pool"), the synchronous
    engine's and plain decoding's tokens."""
    target, draft = pair
    arrivals = [(i, PROMPTS[i], SamplingParams(temperature=0, max_new_tokens=36 + 2 * i)) for i in range(5)]
    probe = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128))
    block = PagedSlotCache.block_bytes(probe.model, 16) + PagedSlotCache.block_bytes(probe.drafter.model, 16)
    sync, run, engine = _both(_auto(pair, slots=4, kv_cache_memory=8 * block), arrivals)
    assert engine.kv_cache_usage.num_preemptions > 0
    assert run[0] == sync[0] == _plain(pair, arrivals)[0] and run[1] == sync[1] and not run[2]
    assert engine.overlap.ahead > 5 and engine.overlap.synchronous_fallbacks.get("pool"), engine.overlap.report()


# ------------------------------------------------------------------------------- one record behind, exactly
def _watch_choices(monkeypatch, engine):
    """Spy on `engine`: the slot counters just before each step launched (so after the step before it, its commit and
    slot moves included), the records read, and at each policy choice (the rows' slots, the totals it was given, the
    records read and the steps launched then, whether a step was in flight) → (counters, choices), filled as the
    engine runs."""
    runner, s, overlap = engine.runner, engine.scheduler, engine.overlap
    before, reads, choices = [], [0], []
    launch, run, read, choose = runner.launch, runner.run, AsyncSteps.read, engine.policy.choose

    def launched(step, shape):
        before.append(runner.state.counters.clone())
        return launch(step, shape)

    def ran(step, shape=None):
        before.append(runner.state.counters.clone())
        reads[0] += 1
        return run(step, shape)

    def was_read(self, pending):
        reads[0] += 1
        return read(self, pending)

    def chosen(batch, rows, estimates=None, **kw):
        slots = [s.running.index(r) for r in rows]
        given = [(b, r, d) for b, r, _, d in estimates()]
        choices.append((slots, given, reads[0], len(before), overlap.pending is not None))
        return choose(batch, rows, estimates, **kw)
    monkeypatch.setattr(runner, "launch", launched)
    monkeypatch.setattr(runner, "run", ran)
    monkeypatch.setattr(AsyncSteps, "read", was_read)
    monkeypatch.setattr(engine.policy, "choose", chosen)
    return before, choices


def _break(monkeypatch, control: str) -> None:
    """control "future": the policy reads the device's counters (the step in flight's, not read yet); "stale": the
    counters two records back (the read step's kept one commit longer)."""
    if control == "future":
        def future(self, live):
            s = self.engine.scheduler
            sums = counter_totals(self.engine.runner.state.counters[live], self.engine.max_draft_tokens)
            return [(b, r, s.spec_steps - s.running[i].admitted_at[1], d) for i, (b, r, d) in zip(live, sums)]
        monkeypatch.setattr(AsyncSteps, "estimates", future)
    elif control == "stale":
        commit = AsyncSteps._commit

        def late(self, *args):
            older = self.read_counters
            out = commit(self, *args)
            if older is not None and older.shape == self.read_counters.shape:
                self.read_counters = older
            return out
        monkeypatch.setattr(AsyncSteps, "_commit", late)


@pytest.mark.parametrize("control", [None, "future", "stale"])
def test_the_policy_chooses_from_the_last_read_record(pair, monkeypatch, control):
    """At every choice of a step launched ahead (a step in flight): exactly one launched step is unread, and the rows'
    totals the policy is given are the slot counters the last read step left — not the step in flight's (a record
    not read yet) nor the one before (stale by two). Controls: those two broken variants are caught."""
    _break(monkeypatch, control)
    engine = _auto(pair, "ngram")(True)
    before, choices = _watch_choices(monkeypatch, engine)
    arrivals = _traffic(spread=2, n=6, new=20)
    tokens = _drive(engine, arrivals)[0]
    ahead = [c for c in choices if c[4]]
    assert len(ahead) > 5 and engine.overlap.ahead > 5
    wrong = 0
    for slots, given, reads, launched, _ in ahead:
        assert launched == reads + 1  # (the step in flight: launched, not read)
        # the last read step's counters: as they stood when the step in flight launched
        expected = [tuple(t) for t in counter_totals(before[launched - 1][slots], engine.max_draft_tokens)]
        wrong += given != expected
    assert (wrong > 0) == (control is not None), wrong
    assert tokens == _drive(_auto(pair, "ngram")(False), arrivals)[0]  # (greedy: the same tokens at any γ)


def _decide_from_estimates(history, lags=None):
    """A deterministic stand-in for "auto"'s decision (`GammaPolicy._decide`): γ a function of the rows' totals it is
    given, re-decided every step. `lags` (the synchronous reference): use the totals `lags[k]` records behind."""
    def decide(self, batch, running, estimates, ell, ready, floor=0, caps=None):
        history.append(estimates())
        lag = lags[len(history) - 1] if lags is not None else 0
        totals = history[len(history) - 1 - lag]
        beta, reached = sum(t[0] for t in totals), sum(t[1] for t in totals)
        arms = [g for g in (1, 2, 4) if g >= floor]
        return arms[int(97 * beta + 13 * reached) % len(arms)], 1
    return decide


@pytest.mark.parametrize("control", [None, "future", "stale"])
def test_sampled_tokens_are_those_of_a_synchronous_engine_one_record_behind(pair, monkeypatch, control):
    """T = 1, one request (its steps the same in both engines), "auto" decided every step from the rows' totals (a
    deterministic stand-in, no clock): the async engine's γ's and sampled tokens are exactly those of the synchronous
    engine whose policy reads the totals one record behind at the steps the async engine ran ahead (and the latest
    at the others). Controls: fed the step in flight's counters, or those two records back, they differ."""
    params = SamplingParams(temperature=1.0, max_new_tokens=48, seed=11)
    prompt = PROMPTS[3]

    def run(on, history, lags=None):
        engine = _auto(pair, "ngram", slots=1)(on)
        engine.policy.watch.threshold = None  # (no collapse holds: γ is the stand-in's alone)
        monkeypatch.setattr(engine.policy, "_decide", _decide_from_estimates(history, lags).__get__(engine.policy))
        gammas, inflight = [], []
        choose = engine.policy.choose

        def chosen(*args, **kw):
            inflight.append(on and engine.overlap.pending is not None)
            gammas.append(choose(*args, **kw))
            return gammas[-1]
        monkeypatch.setattr(engine.policy, "choose", chosen)
        engine.add_request(prompt, params)
        tokens = []
        while engine.has_unfinished():
            tokens += [t for out in engine.step() for t in out.new_token_ids]
        return tokens, gammas, inflight, engine

    _break(monkeypatch, control)
    tokens, gammas, inflight, engine = run(True, [])
    monkeypatch.undo()
    assert engine.overlap.ahead > 5 and sum(inflight) == engine.overlap.ahead
    reference, ref_gammas, _, _ = run(False, [], lags=[int(f) for f in inflight])
    assert len(set(gammas)) > 1  # (the choices moved with the records)
    # (the async engine may choose once more: a step launched ahead of the read that finished the request, discarded)
    same = tokens == reference and gammas[: len(ref_gammas)] == ref_gammas and len(gammas) - len(ref_gammas) in (0, 1)
    assert same == (control is None), (gammas, ref_gammas)
    assert len(tokens) == len(reference) == 48


def _deterministic_clock(monkeypatch):
    """The policy's step times from a cost model of (batch bucket, γ) instead of the clock (and no admission
    timings): the run, so the sample and its p-value, are the same on every run."""
    record = GammaPolicy.record_step

    def timed(self, batch, gamma, seconds, *args, **kw):
        kw.pop("draft_seconds", None)
        return record(self, batch, gamma, 1e-3 * (1.0 + 0.3 * gamma) * (1.0 + batch / 16), *args, **kw)
    monkeypatch.setattr(GammaPolicy, "record_step", timed)
    monkeypatch.setattr(GammaPolicy, "record_admission", lambda self, *a, **kw: None)
    monkeypatch.setattr(GammaPolicy, "record_capture", lambda self, seconds: None)


LAW_PROMPT, LAW_TOKENS = [3, 1, 2, 1, 3], 4  # (vocabulary 4: four tokens' joint law has 256 cells)


def _exact_law(model, prompt, k):
    """P(t1..tk) = Π p(t_i | prompt, t_<i) at T = 1, flattened to [V^k] (index Σ t_i V^(k−i))."""
    from specdec.core import standardize_logits
    law, prefixes = torch.ones(1, dtype=torch.float64), [[]]
    with torch.no_grad():
        for _ in range(k):
            logits = model(torch.tensor([prompt + p for p in prefixes])).logits[:, -1]
            law = (law[:, None] * standardize_logits(logits, SamplingConfig(1.0)).double()).flatten()
            prefixes = [p + [t] for p in prefixes for t in range(model.config.vocab_size)]
    return law.numpy()


def _law_sample(make_llama, rows):
    """`rows` seeded T = 1 requests of four tokens through an async "auto" engine admitting in waves (a wave's later
    steps run ahead, their γ one record late: tokens 3 and 4 of a row whose first steps committed one each come from
    them) → (the samples as indices of `_exact_law`, the target, the engine)."""
    target, draft = make_llama(20, vocab=4), make_llama(21, layers=1, vocab=4)
    engine = Engine(target, draft, EngineConfig(max_batch_size=16, max_seq_len=32, admit_min=16, admit_max_wait=64,
                                                async_scheduling=True))
    index = {engine.add_request(LAW_PROMPT, SamplingParams(temperature=1.0, max_new_tokens=LAW_TOKENS, seed=i)): i
             for i in range(rows)}
    tokens = [[] for _ in range(rows)]
    while engine.has_unfinished():
        for out in engine.step():
            tokens[index[out.request_id]] += out.new_token_ids
    return np.array([sum(t * 4 ** (LAW_TOKENS - 1 - j) for j, t in enumerate(ts)) for ts in tokens]), target, engine


def test_auto_sampled_tokens_follow_the_target_law(make_llama, monkeypatch):
    """T = 1, "auto" running ahead (each request seeded; the policy's times from a cost model, so the sample is the
    same on every run): the four tokens' joint law is the target's (chi-square)."""
    _deterministic_clock(monkeypatch)
    pairs, target, engine = _law_sample(make_llama, 4000)
    assert engine.overlap.ahead > 100, engine.overlap.report()
    assert chi2_pvalue(pairs, _exact_law(target, LAW_PROMPT, LAW_TOKENS)) > PASS


def test_negative_control_the_law_test_sees_reused_randomness(make_llama, monkeypatch):
    """The same run with every position drawing the same uniforms (a broken counter): the law visibly breaks."""
    _deterministic_clock(monkeypatch)
    real = rng._row_keys
    monkeypatch.setattr(rng, "_row_keys", lambda seed, position, stream: real(seed, position * 0, 0))
    pairs, target, _ = _law_sample(make_llama, 4000)
    assert chi2_pvalue(pairs, _exact_law(target, LAW_PROMPT, LAW_TOKENS)) < FAIL


@pytest.mark.parametrize("control", [False, True])
def test_a_choice_whose_step_could_not_run_ahead_is_carried_to_it(pair, monkeypatch, control):
    """A model drafter switching between plain and speculative steps needs a catch-up (the host's lengths): that step
    is synchronous ("catch-up") and runs the choice made for it, so the policy decides once per step that ran (the
    next choice over the same rows takes it; rows that left since: decided again). Control: not carried, the
    synchronous step decides a second time."""
    if control:
        monkeypatch.setattr(GammaPolicy, "carry", lambda self, rows, gamma: None)
    carried, taken, dropped = [], [], [0]
    carry, choose = GammaPolicy.carry, GammaPolicy.choose

    def carrying(self, rows, gamma):
        carried.append(gamma)
        carry(self, rows, gamma)

    def choosing(self, batch, running, *args, **kw):
        held = self._carried
        gamma = choose(self, batch, running, *args, **kw)
        if held is not None and held[1].keys() == {id(r) for r in running}:
            taken.append((held[0], gamma))
        elif held is not None:
            dropped[0] += 1
        return gamma
    monkeypatch.setattr(GammaPolicy, "carry", carrying)
    monkeypatch.setattr(GammaPolicy, "choose", choosing)
    arrivals = _traffic(n=4, new=40)
    sync, run, engine = _both(_auto(pair, "model"), arrivals)
    assert run[0] == sync[0] and not run[2]
    assert engine.overlap.synchronous_fallbacks.get("catch-up") == len(carried) > 0, engine.overlap.report()
    assert all(g == got for g, got in taken)
    assert (len(taken) > 0 and len(taken) + dropped[0] == len(carried)) != control, (taken, dropped, carried)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["static", "paged"])
def test_cuda_graphs_auto_greedy_tokens_are_the_synchronous_engines(make_llama, layout):
    """On CUDA with graphs, "auto": a γ one record late may be a shape not captured yet, captured while a step is in
    flight (the capture's copies and warm-ups follow it in stream order); greedy tokens are the synchronous engine's,
    every committed token is emitted. (fp32 ties are taken to be rare, as in the fixed-γ CUDA test.)"""
    target, draft = make_llama(0).cuda(), make_llama(1, layers=1).cuda()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)

    def make(on):
        return Engine(target, draft, EngineConfig(max_batch_size=3, max_seq_len=128, kv_layout=layout,
                                                  cuda_graphs=True, async_scheduling=on))
    arrivals = _traffic(spread=2, n=8, new=24)
    sync, run, engine = _both(make, arrivals)
    assert engine.cuda_graphs and run[0] == sync[0] and run[1] == sync[1] and not run[2]
    assert engine.overlap.ahead > 10, engine.overlap.report()
    assert engine.stats.num_generated_tokens == run[3]
