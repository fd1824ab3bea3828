"""Start-up warm-up: the plan covers every shape a runner can reach, within its bound; counts read from engines."""

import pytest
import torch

import specdec
from specdec.engine import Engine, EngineConfig
from specdec.engine.config import BATCH_BUCKETS
from specdec.request import SamplingParams
from specdec.text.driver import StepTiming
from specdec.text.warmup import (FIRST_LENGTH_BUCKET, MAX_WARMUP_SHAPES, graph_captures, plan_warmup, runner_gammas,
                                 step_shapes, step_shapes_run)


def reachable_batch_buckets(max_batch: int) -> set[int]:
    """The engine's step: n running rows (1..max_batch) → the first bucket >= n."""
    return {next(b for b in BATCH_BUCKETS if b >= n) for n in range(1, max_batch + 1)}


@pytest.mark.parametrize("max_batch", [1, 8, 48, 64, 100])
def test_the_plan_reaches_every_batch_bucket_of_the_running_batch(max_batch):
    plan = plan_warmup(max_batch, [4], num_positions=2064, max_draft_tokens=8)
    buckets = {next(b for b in BATCH_BUCKETS if b >= s) for s in plan.batch_sizes}
    assert buckets == reachable_batch_buckets(max_batch)
    assert max(plan.batch_sizes) <= max_batch  # the engine refuses sizes past its max_batch_size


def test_the_plan_counts_every_length_bucket_up_to_the_cache():
    # the engine's length buckets: 64, 128, ... up to the cache's positions, which absorb a power of two within a
    # quarter of them (2064: 64 .. 1024 and 2064, not 2048 too: 6 buckets)
    plan = plan_warmup(64, [4], num_positions=2064, max_draft_tokens=8)
    assert plan.complete and plan.max_length is None and plan.num_length_buckets == 6
    assert plan.num_shapes == 7 * 1 * 6 * 2  # batch buckets × γ × length buckets × (T=0, T=1)
    assert plan_warmup(64, [4], num_positions=3000, max_draft_tokens=8).num_length_buckets == 7  # (2048, 3000)
    assert plan_warmup(1, [0], num_positions=FIRST_LENGTH_BUCKET, max_draft_tokens=0).num_length_buckets == 1


def test_the_bound_leaves_out_the_longest_length_buckets():
    # auto: 5 γ's × 7 batch buckets × 2 temperatures = 70 shapes per length bucket
    plan = plan_warmup(64, [0, 1, 2, 4, 6], num_positions=4112, max_draft_tokens=8, max_shapes=300)
    assert not plan.complete and plan.num_length_buckets == 4 and plan.num_shapes == 280 <= 300
    assert plan.max_length == (FIRST_LENGTH_BUCKET << 3) - 8 - 2  # positions of the 4th bucket (512)
    tiny = plan_warmup(64, [0, 1, 2, 4, 6], num_positions=4112, max_draft_tokens=8, max_shapes=1)
    assert tiny.num_length_buckets == 1  # at least one bucket
    assert plan_warmup(256, [0, 1, 2, 4, 6], 4112, 8).num_shapes <= MAX_WARMUP_SHAPES
    with pytest.raises(ValueError, match="max_shapes"):
        plan_warmup(8, [4], 2064, 8, max_shapes=0)


def test_the_engine_builds_exactly_the_planned_shapes_and_traffic_reaches_no_other(ckpt):
    """On CPU `Engine.warmup` builds the (eager) step shapes without capturing: the same count as the plan, and a
    greedy batch growing through several buckets then meets no shape the warm-up did not build."""
    target = specdec.loading.load_model(ckpt / "target", device="cpu", dtype="auto", what="target")
    draft = specdec.loading.load_model(ckpt / "draft", device="cpu", dtype="auto", what="draft")
    engine = Engine(target, draft, EngineConfig(max_batch_size=6, max_seq_len=200, num_draft_tokens=3))
    assert runner_gammas(engine) == (0, 3)  # (plain requests share the engine)
    plan = plan_warmup(engine.max_batch, runner_gammas(engine), engine.num_positions, engine.max_draft_tokens,
                       config=engine.runner.config)
    built = engine.warmup(batch_sizes=plan.batch_sizes, gammas=plan.gammas, max_length=plan.max_length,
                          temperatures=plan.temperatures)
    assert plan.num_mixed_shapes > 0  # (the mixed step is on: the default on the paged pool)
    assert built == plan.num_shapes and (step_shapes(engine), len(engine.runner.mixed_steps)) == (
        plan.num_decode_shapes, plan.num_mixed_shapes)
    assert graph_captures(engine) == 0 == step_shapes_run(engine)  # nothing is captured on CPU, nothing ran
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 6):  # buckets 1, 2, 4, 8 (cut at 6); prompts long enough for two length buckets
        for i in range(n):  # (plain requests among them, and caps below the default: in the built shapes)
            engine.add_request(torch.randint(3, 60, (60,), generator=gen).tolist(),
                               SamplingParams(temperature=0, max_new_tokens=12, num_draft_tokens=(None, 0, 2)[i % 3]))
        while engine.has_unfinished():
            engine.step()
    assert step_shapes(engine) == plan.num_decode_shapes and len(engine.runner.mixed_steps) == plan.num_mixed_shapes
    assert 4 <= step_shapes_run(engine) < built  # 4 batch buckets × 2 length buckets × γ 0 / 3 at most, greedy only


def test_runner_gammas_follow_the_policy(ckpt):
    target = specdec.loading.load_model(ckpt / "target", device="cpu", dtype="auto", what="target")
    draft = specdec.loading.load_model(ckpt / "draft", device="cpu", dtype="auto", what="draft")
    auto = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens="auto"))
    assert runner_gammas(auto) == tuple(sorted({0, *auto.policy.candidates}))
    plain = Engine(target, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0))
    assert runner_gammas(plain) == (0,)


def test_graph_captures_count_only_captured_steps():
    class Step:
        def __init__(self, captured):
            self._verify_graph = object() if captured else None

    class FakeEngine:
        _steps = {1: Step(True), 2: Step(False), 3: Step(True)}

    assert graph_captures(FakeEngine()) == 2 and step_shapes(FakeEngine()) == 3
    assert graph_captures(object()) == 0 == step_shapes(object())  # the fallback runner keeps no shapes


def test_the_driver_reports_each_step_after_its_outputs(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, max_batch_size=4) as llm:
        seen, order = [], []
        llm.driver.add_listener(lambda runner, out: order.append("output"))
        llm.driver.add_step_listener(lambda t: (seen.append(t), order.append("step")))
        out = llm.generate("w1 w2 w3", max_new_tokens=8)
        assert seen and all(isinstance(t, StepTiming) and t.step_s > 0 and t.deliver_s >= 0 for t in seen)
        assert sum(t.num_outputs for t in seen) == order.count("output") and order[-1] == "step"
        assert llm.runner_key(seen[0].runner) == 2 and llm.runner_key(object()) is None
        assert out.stats.num_generated_tokens == 8 or out.finish_reason == "stop"
        assert llm.graph_captures == 0 and llm.step_shapes >= 1 and llm.warmups == {}  # CPU: no warm-up


def test_synthetic_acceptance_reaches_the_engine_and_is_refused_on_the_fallback(ckpt):
    """BENCHMARK ONLY: α = 1 accepts every draft (the server's --synthetic-acceptance for a random pair)."""
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, synthetic_acceptance=1.0) as llm:
        out = llm.generate("w1 w2 w3", max_new_tokens=9)
        assert out.stats.num_accepted_tokens == out.stats.num_draft_tokens > 0
    with pytest.raises(ValueError, match="synthetic_acceptance"):
        specdec.load(ckpt / "target", draft=ckpt / "draft", runner="fallback", synthetic_acceptance=0.5)


def test_warm_up_logs_its_plan_and_each_shape_as_progress(ckpt, caplog):
    """The start-up's warm-up line and progress records (`specdec serve` draws the latter as a bar)."""
    import logging

    from specdec.text.warmup import warm_up

    target = specdec.loading.load_model(ckpt / "target", device="cpu", dtype="auto", what="target")
    engine = Engine(target, None, EngineConfig(max_batch_size=3, max_seq_len=100, num_draft_tokens=0))
    with caplog.at_level(logging.DEBUG, logger="specdec.text.warmup"):
        report = warm_up(engine, engine.max_batch)
    records = [r for r in caplog.records if r.name == "specdec.text.warmup"]
    progress = [r.progress for r in records if hasattr(r, "progress")]
    decode, mixed = report["planned"] - report["mixed_shapes"], report["mixed_shapes"]
    assert f"capturing {decode} decode step shapes" in records[0].getMessage() and decode > 0 and mixed > 0
    assert records[0].getMessage().endswith(f"and {mixed} mixed ones")
    assert progress == [(i, report["shapes"]) for i in range(1, report["shapes"] + 1)] and report["shapes"] > 1
