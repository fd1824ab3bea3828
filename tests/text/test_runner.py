"""The fallback runner (the runner interface over `specdec.stream`) and the background driver."""

import queue

import pytest

import specdec
from specdec.request import SamplingParams
from specdec.text.driver import Driver
from specdec.text.runner import FallbackRunner, Runner


def drain(runner, limit=500):
    outputs = []
    for _ in range(limit):
        if not runner.has_unfinished():
            return outputs
        outputs.extend(runner.step())
    raise AssertionError("runner did not finish")


def by_request(outputs):
    seqs, final = {}, {}
    for out in outputs:
        seqs.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            assert out.request_id not in final, "two final outputs"
            final[out.request_id] = out
    return seqs, final


def test_batched_requests_with_their_own_budgets_equal_solo_generation(llama, llama_draft):
    runner = FallbackRunner(llama, llama_draft, num_draft_tokens=3, max_batch_size=4)
    assert isinstance(runner, Runner)
    prompts = [[5, 6, 7], [9], [3, 4, 5, 6, 7, 8]]
    budgets = [9, 4, 13]
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        runner.add_request(p, SamplingParams(max_new_tokens=n, temperature=0), request_id=f"r{i}")
    assert runner.num_waiting == 3
    seqs, final = by_request(drain(runner))
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        solo = specdec.generate(llama, [p], max_new_tokens=n, temperature=0, eos_token_id=[]).sequences[0]
        assert seqs[f"r{i}"] == solo and final[f"r{i}"].finish_reason == "length"
        assert final[f"r{i}"].stats.num_generated_tokens == n


def test_abort_frees_the_request_at_the_next_step(llama):
    runner = FallbackRunner(llama, None)
    runner.add_request([5, 6], SamplingParams(max_new_tokens=50, temperature=0), request_id="a")
    runner.add_request([7], SamplingParams(max_new_tokens=50, temperature=1.0, seed=1), request_id="waiting")
    first = runner.step()
    assert first and not first[0].finished and runner.num_running == 1
    runner.abort("a")
    runner.abort("waiting")
    out = runner.step()
    assert {(o.request_id, o.finish_reason) for o in out if o.finished} == {("a", "abort"), ("waiting", "abort")}
    assert not runner.has_unfinished() and runner.num_running == 0


def test_eos_ends_a_request_with_stop(llama):
    plain = specdec.generate(llama, [[5, 6, 7]], max_new_tokens=6, temperature=0, eos_token_id=[]).sequences[0]
    runner = FallbackRunner(llama, None)
    runner.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0, eos_token_ids=(plain[2],)))
    seqs, final = by_request(drain(runner))
    (rid,) = final
    assert seqs[rid] == plain[: plain.index(plain[2]) + 1] and final[rid].finish_reason == "stop"


def test_bad_requests_are_refused_before_queueing(llama):
    runner = FallbackRunner(llama, None, max_seq_len=32)
    with pytest.raises(ValueError, match="exceeds the context of 32"):
        runner.add_request([1] * 30, SamplingParams(max_new_tokens=5))
    with pytest.raises(ValueError, match="prompt_ids"):
        runner.add_request([1, 64], SamplingParams())
    with pytest.raises(TypeError, match="params"):
        runner.add_request([1], {"max_new_tokens": 3})
    assert not runner.has_unfinished()


class Exploding:
    vocab_size, max_seq_len, num_running, num_waiting = 64, 128, 0, 0

    def __init__(self):
        self.queued = []

    def add_request(self, prompt_ids, params, request_id=None):
        self.queued.append(request_id)
        return request_id

    def abort(self, request_id):
        pass

    def has_unfinished(self):
        return bool(self.queued)

    def step(self):
        raise RuntimeError("boom")


def test_a_failing_step_fails_its_requests_and_the_driver_goes_on(llama):
    driver = Driver()
    try:
        bad, good = Exploding(), FallbackRunner(llama, None)
        got: queue.Queue = queue.Queue()
        driver.submit(bad, [1], SamplingParams(), got.put, "x")
        err = got.get(timeout=10)
        assert isinstance(err, RuntimeError) and bad in driver.failed
        driver.submit(good, [1, 2], SamplingParams(max_new_tokens=3, temperature=0), got.put, "y")
        outs = [got.get(timeout=10)]
        while not outs[-1].finished:
            outs.append(got.get(timeout=10))
        assert sum(len(o.new_token_ids) for o in outs) == 3 and driver.num_requests == 0
        with pytest.raises(ValueError, match="already running"):
            driver.submit(bad, [1], SamplingParams(), got.put, "z")
            driver.submit(bad, [1], SamplingParams(), got.put, "z")
    finally:
        driver.close()


def test_the_driver_flags_the_steps_that_admitted(llama):
    """StepTiming.admitted: the steps in which the engine admitted requests (it admits in groups, so a step with
    requests waiting need not admit), one per `Engine.num_admissions`."""
    from specdec.engine import Engine, EngineConfig

    engine = Engine(llama, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0, admit_min=2,
                                              admit_max_wait=2))
    driver, timings, got = Driver(), [], queue.Queue()
    driver.add_step_listener(timings.append)
    try:
        for i, n in enumerate((3, 12, 4, 5, 6)):  # more requests than slots: they wait while others run
            driver.submit(engine, [1, 2, 3 + i], SamplingParams(max_new_tokens=n, temperature=0), got.put, f"r{i}")
        finished = 0
        while finished < 5:
            finished += got.get(timeout=30).finished
    finally:
        driver.close()
    assert sum(t.admitted for t in timings) == engine.num_admissions >= 2


def test_the_driver_flags_the_steps_that_prefilled_a_budget(llama):
    """With chunked prefill (`EngineConfig.prefill_budget`) a long prompt admitted while another request runs is
    prefilled over the next steps: each of them is flagged admitted (the server's admission-step metrics), not
    only the step that took the request in."""
    from specdec.engine import Engine, EngineConfig

    engine = Engine(llama, None, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=0, admit_min=1,
                                              prefill_budget=16))
    driver, timings, got = Driver(), [], queue.Queue()
    driver.add_step_listener(timings.append)
    try:
        driver.submit(engine, [1, 2, 3], SamplingParams(max_new_tokens=40, temperature=0), got.put, "r0")
        while not got.get(timeout=30).new_token_ids:
            pass
        driver.submit(engine, [(5 * i) % 60 + 2 for i in range(81)], SamplingParams(max_new_tokens=2, temperature=0),
                      got.put, "r1")
        finished = 0
        while finished < 2:
            finished += got.get(timeout=30).finished
    finally:
        driver.close()
    assert sum(t.admitted for t in timings) >= 80 // 16 > engine.num_admissions


def test_the_fallback_runner_serves_every_requests_gamma_one_batch_per_gamma(llama, llama_draft):
    """One runner for every γ (as the engine): each request's `num_draft_tokens` — 0 plain (no drafter), an int,
    "auto" (the loop's guarded policy), None (the runner's default) — gives plain decoding's greedy tokens; a plain
    request drafts nothing. Without a drafter a speculative γ is refused by name."""
    runner = FallbackRunner(llama, llama_draft, num_draft_tokens=3, max_batch_size=4)
    caps = [0, 2, "auto", None, 0]
    for i, cap in enumerate(caps):
        runner.add_request([5, 6, 7], SamplingParams(max_new_tokens=10, temperature=0, num_draft_tokens=cap),
                           request_id=f"r{i}")
    seqs, final = by_request(drain(runner))
    want = specdec.generate(llama, [[5, 6, 7]], max_new_tokens=10, temperature=0).sequences[0]
    assert all(seqs[f"r{i}"] == want for i in range(len(caps)))
    drafted = {rid: out.stats.drafted_tokens for rid, out in final.items()}
    assert drafted["r0"] == drafted["r4"] == 0 and drafted["r1"] > 0 and drafted["r3"] > 0
    plain = FallbackRunner(llama, None, num_draft_tokens=0)
    with pytest.raises(ValueError, match="num_draft_tokens=2 needs a drafter"):
        plain.add_request([5, 6], SamplingParams(num_draft_tokens=2))
