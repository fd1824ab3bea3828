"""Async scheduling (`EngineConfig.async_scheduling`, `engine/async_steps.py`): the next decode step launched before
the last one's record is read gives every request the synchronous engine's tokens and finish reasons; a row that
finished is masked on the device and never emits again (negative control: unmasked, it does)."""

import pytest
import torch

from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.engine import Engine, EngineConfig
from specdec.engine.async_steps import AsyncSteps
from specdec.engine.kv_pool import PagedSlotCache
from specdec.request import SamplingParams

from async_helpers import PROMPTS, _both, _drive, _traffic


@pytest.fixture(scope="module")
def pair(peaked_pair):
    return peaked_pair


def _maker(pair, drafter="model", gamma=3, slots=3, layout="static"):
    target, draft = pair
    drafters = {"model": draft, "none": None, "ngram": NGramDrafter(2).fit(PROMPTS, 64),
                "lookup": PromptLookupDrafter(max_ngram_size=2)}

    def make(on):
        return Engine(target, drafters[drafter], EngineConfig(
            max_batch_size=slots, max_seq_len=128, num_draft_tokens=0 if drafter == "none" else gamma,
            kv_layout=layout, async_scheduling=on))
    return make


@pytest.mark.parametrize("drafter", ["model", "none", "ngram", "lookup"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tokens_are_the_synchronous_engines(pair, drafter, temperature):
    """More requests than slots, arriving while others run, max_tokens finishes: the same tokens, and steps ran
    ahead."""
    sync, run, engine = _both(_maker(pair, drafter), _traffic(temperature, spread=2))
    assert run[0] == sync[0] and run[1] == sync[1] and not run[2]
    assert engine.overlap.ahead > 5, engine.overlap.synchronous_fallbacks


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_eos_finishes_and_aborts(pair, layout):
    target, _ = pair
    probe = _drive(_maker(pair, slots=6)(False), _traffic())[0]
    eos = (probe[0][4], probe[2][3])  # tokens some requests reach mid-way: EOS finishes at several steps
    arrivals = _traffic(eos=eos, spread=1, n=6, new=20)
    aborts = {1: 4, 4: 9}
    for i in aborts:  # (running when aborted, in both engines: no EOS, a long budget)
        at, prompt, params = arrivals[i]
        arrivals[i] = (at, prompt, SamplingParams(temperature=0.0, max_new_tokens=60))
    sync, run, engine = _both(_maker(pair, layout=layout), arrivals, aborts)
    assert run[1] == sync[1] and not run[2] and not sync[2]
    assert "stop" in run[1].values() and [run[1][i] for i in aborts] == ["abort"] * 2
    # a request added while a step runs ahead joins a step later: an aborted one's tokens are a prefix of its own
    full = _drive(_maker(pair, layout=layout)(False), arrivals)[0]
    assert {i: t for i, t in run[0].items() if i not in aborts} == {i: t for i, t in sync[0].items() if i not in aborts}
    assert all(full[i][: len(run[0][i])] == run[0][i] for i in aborts)
    assert engine.overlap.ahead > 5, engine.overlap.synchronous_fallbacks


def test_a_tight_pool_processors_and_logprobs(pair):
    """Paged, a pool too small for the traffic (preemptions: those steps are synchronous), repetition penalties and
    log-probabilities: the synchronous engine's tokens and log-probabilities."""
    target, draft = pair
    arrivals = [(i, PROMPTS[i], SamplingParams(temperature=0, max_new_tokens=36 + 2 * i, logprobs=i % 2 == 0,
                                               repetition_penalty=1.3 if i % 3 == 0 else 1.0)) for i in range(5)]
    probe = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3))
    block = PagedSlotCache.block_bytes(probe.model, 16) + PagedSlotCache.block_bytes(probe.drafter.model, 16)

    def make(on):
        return Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                  kv_cache_memory=8 * block, async_scheduling=on))
    sync, run, engine = _both(make, arrivals)
    assert engine.kv_cache_usage.num_preemptions > 0
    assert run[0] == sync[0] and run[1] == sync[1] and not run[2]
    assert {i: len(v) for i, v in run[4].items()} == {i: len(v) for i, v in sync[4].items()}
    for i in run[4]:
        assert run[4][i] == pytest.approx(sync[4][i], abs=1e-5)
    assert engine.overlap.ahead > 5 and engine.overlap.synchronous_fallbacks.get("pool"), engine.overlap.synchronous_fallbacks


def test_a_finished_row_never_emits_after_its_finish(pair):
    """Every token the device committed is emitted (`stats.num_generated_tokens`), none after a request's finish;
    the finished rows were masked while the next step ran (zombies seen)."""
    seen = []
    original = AsyncSteps.mask

    def mask(self, pending):
        seen.append(bool(pending.device[:-1, pending.run.layout.k + 3].any()))
        original(self, pending)
    eos_run = _drive(_maker(pair, slots=6)(False), _traffic())[0]
    arrivals = _traffic(eos=(eos_run[0][4],), n=4, new=24)
    engine = _maker(pair, slots=4)(True)
    AsyncSteps.mask = mask
    try:
        tokens, reasons, late, emitted, _ = _drive(engine, arrivals)
    finally:
        AsyncSteps.mask = original
    assert any(seen), "no step ran ahead of a finish: the test would not test the mask"
    assert not late
    assert engine.stats.num_generated_tokens == emitted


def test_negative_control_an_unmasked_finished_row_commits_past_its_finish(pair, monkeypatch):
    """Without the mask a row finished on EOS keeps committing in the step that ran ahead: the count of committed
    tokens exceeds what was emitted (the check above fails)."""
    eos_run = _drive(_maker(pair, slots=6)(False), _traffic())[0]
    arrivals = _traffic(eos=(eos_run[0][4],), n=4, new=24)
    engine = _maker(pair, slots=4)(True)
    monkeypatch.setattr(AsyncSteps, "mask", lambda self, pending: None)
    emitted = _drive(engine, arrivals)[3]
    assert engine.stats.num_generated_tokens > emitted


def test_auto_rows_run_ahead_and_rows_with_their_own_caps_do(pair):
    """The engine's γ "auto" runs ahead too (its γ one record late: `test_async_auto.py`); rows that each ask for a
    fixed `num_draft_tokens` run ahead at their floor, with the synchronous engine's tokens (sampled ones too)."""
    target, draft = pair
    make = lambda on: Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=64,  # noqa: E731
                                                         async_scheduling=on))
    sync, run, engine = _both(make, _traffic(n=2))
    assert run[0] == sync[0] and engine.overlap.ahead > 5, engine.overlap.report()
    own = [(at, prompt, SamplingParams(temperature=1.0, max_new_tokens=p.max_new_tokens, seed=p.seed,
                                       num_draft_tokens=2 + i % 2))
           for i, (at, prompt, p) in enumerate(_traffic(n=3))]
    sync, run, engine = _both(make, own)
    assert run[0] == sync[0] and run[1] == sync[1] and engine.overlap.ahead > 5


def test_config_and_flag():
    with pytest.raises(TypeError, match="async_scheduling"):
        EngineConfig(async_scheduling="yes")
    import argparse

    from specdec.cli.engine_flags import add_engine_flags, engine_options
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    assert engine_options(parser.parse_args(["--async-scheduling"]))["async_scheduling"] is True
    assert "async_scheduling" not in engine_options(parser.parse_args([]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["static", "paged", pytest.param("bitwise", marks=pytest.mark.skip(
    reason="its tiny model's head dim (8) is below bitwise CUDA's 16 (refused on an H200); needs a wider model"))])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cuda_graphs_tokens_are_the_synchronous_engines(make_llama, layout, temperature):
    """On CUDA with graphs: the pinned copies behind events, the mask in stream order. (A request joins a step
    later than in the synchronous run: its batch differs at a few steps; "bitwise" takes GEMM and attention
    kernels whose bits do not depend on the batch, where the other layouts rely on fp32 ties being rare.)"""
    bitwise = layout == "bitwise"
    layout = "static" if bitwise else layout
    target, draft = make_llama(0).cuda(), make_llama(1, layers=1).cuda()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)

    def make(on):
        return Engine(target, draft, EngineConfig(max_batch_size=3, max_seq_len=128, num_draft_tokens=3,
                                                  kv_layout=layout, cuda_graphs=True, bitwise=bitwise,
                                                  async_scheduling=on))
    probe = _drive(make(False), _traffic(temperature))[0]
    arrivals = _traffic(temperature, eos=(probe[0][4],), spread=2, n=8)
    at, prompt, _ = arrivals[2]
    arrivals[2] = (at, prompt, SamplingParams(temperature=temperature, max_new_tokens=60, seed=7))  # (aborted running)
    sync, run, engine = _both(make, arrivals, aborts={2: 8})
    assert engine.cuda_graphs
    assert run[1] == sync[1] and not run[2] and run[1][2] == "abort"
    assert {i: t for i, t in run[0].items() if i != 2} == {i: t for i, t in sync[0].items() if i != 2}
    assert engine.overlap.ahead > 10, engine.overlap.synchronous_fallbacks
    engine = make(True)  # without the abort: every token the device committed was emitted
    emitted = _drive(engine, [a for i, a in enumerate(arrivals) if i != 2])[3]
    assert engine.stats.num_generated_tokens == emitted > 0


def test_negative_control_one_host_buffer_reads_the_next_steps_record(pair, monkeypatch):
    """The two host buffers per shape are what keeps a step's record from being overwritten by the step launched
    ahead of its read: with one, the tokens differ."""
    arrivals = _traffic(n=3, new=20)
    sync = _drive(_maker(pair)(False), arrivals)
    original = AsyncSteps._buffers

    def one(self, device, counters):
        original(self, device, counters)
        ring = self._rings[(tuple(device.shape), tuple(counters.shape))]
        ring[0] = 1  # (always the second set)
        return ring[2]
    monkeypatch.setattr(AsyncSteps, "_buffers", one)
    engine = _maker(pair)(True)
    assert _drive(engine, arrivals)[0] != sync[0]


@pytest.mark.parametrize("control", [False, True])
def test_stats_assigned_while_a_step_runs_ahead_stay_consistent(pair, monkeypatch, control):
    """`Engine.stats` reset mid-run: the step in flight counts on neither side, so the host's committed tokens equal
    the device counters' (accepted + 1 per active row-step; no EOS, draft lengths capped by the budgets: no cut).
    Control: with the reset not told to the async steps, the host counts one step the device sums lost."""
    from specdec.metrics import SpecStats
    if control:
        monkeypatch.setattr(AsyncSteps, "stats_reset", lambda self: None)
    engine = _maker(pair)(True)
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=30))
    for _ in range(5):
        engine.step()
    assert engine.overlap.pending is not None
    engine.stats = SpecStats()
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats
    assert stats.num_generated_tokens > 0
    assert (stats.num_generated_tokens == stats.algorithm_tokens) != control


def test_finished_rows_wait_masked_while_the_rest_run_ahead(pair, monkeypatch):
    """No request waiting: finished rows stay in their slots, masked, while the others keep running ahead (until
    the live rows' batch bucket would shrink); an admission that waits for `admit_min` free slots lets steps run
    ahead meanwhile. Tokens: the synchronous engine's."""
    target, draft = pair
    beside = []
    original = AsyncSteps._launch

    def launch(self, pending, *plan):
        beside.append(len(self.zombies))
        return original(self, pending, *plan)
    monkeypatch.setattr(AsyncSteps, "_launch", launch)
    arrivals = [(0, PROMPTS[i % 6] + [i], SamplingParams(temperature=0, max_new_tokens=10 + 6 * i)) for i in range(8)]
    make = lambda on: Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=128,  # noqa: E731
                                                         num_draft_tokens=3, async_scheduling=on))
    sync, run, engine = _both(make, arrivals)
    assert run[0] == sync[0] and run[1] == sync[1] and not run[2]
    assert max(beside) >= 2 and engine.overlap.synchronous_fallbacks.get("finished")  # (8 rows → 4: bucket 8 → 4)
    assert engine.stats.num_generated_tokens == run[3]
    beside.clear()
    arrivals = [(0 if i < 4 else 3, PROMPTS[i], SamplingParams(temperature=0, max_new_tokens=8 + 5 * i))
                for i in range(6)]  # (two wait for admit_min = 2 free slots of 4)
    make = lambda on: Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128,  # noqa: E731
                                                         num_draft_tokens=3, admit_min=2, async_scheduling=on))
    sync, run, engine = _both(make, arrivals)
    assert run[0] == sync[0] and run[1] == sync[1] and not run[2]
    assert any(beside), "no step ran ahead beside a finished row while requests waited"
