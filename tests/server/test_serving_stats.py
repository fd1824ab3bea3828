"""Where serving time goes: step / hand-off / delivery histograms and graph captures in /metrics, read per level
by the benchmark; the driver → event loop mailbox wakes the loop once per step."""

import asyncio
import gc
import threading

import httpx

from specdec.server.runs import Mailbox as _Mailbox
from specdec.server.bench import LevelResult, level_server_stats, markdown_table, parse_counters
from specdec.server.metrics import ServerMetrics
from specdec.text.driver import StepTiming


class FakeLLM:
    num_running = num_waiting = 0
    step_shapes = 3
    step_shapes_run = 1

    def __init__(self):
        self.graph_captures = 10
        self.plain, self.spec = object(), object()

    def runner_key(self, runner):
        return 0 if runner is self.plain else 4


def test_level_stats_from_two_scrapes():
    llm = FakeLLM()
    metrics = ServerMetrics(llm)
    metrics.on_step(StepTiming(llm.plain, 0.002, 0.0001, 1))
    before = parse_counters(metrics.render().decode())
    assert before["captures"] == 10  # the warm-up's captures
    for _ in range(98):
        metrics.on_step(StepTiming(llm.spec, 0.005, 0.0002, 8))
    metrics.on_step(StepTiming(llm.spec, 0.12, 0.0002, 8))  # a step that captured a graph
    metrics.on_step(StepTiming(llm.spec, 0.13, 0.004, 8, admitted=True))  # one that prefilled a new request
    metrics.delivered(0.0015)
    llm.graph_captures = 12
    llm.step_shapes_run = 3
    after = parse_counters(metrics.render().decode())
    stats = level_server_stats(before, after)
    assert stats["graph_captures"] == 2 and stats["new_shapes"] == 2 and stats["steps"] == 100
    assert stats["step_p50_s"] == 0.006 and stats["step_p99_s"] == 0.15 and stats["step_max_s"] == 0.15
    assert stats["decode_step_p99_s"] == 0.15 and stats["admit_steps"] == 1 and stats["admit_step_max_s"] == 0.15
    assert stats["handoff_p99_s"] == 0.0005 and stats["delivery_p99_s"] == 0.002
    # labelled by the γ each runner serves
    text = metrics.render().decode()
    assert 'specdec:engine_step_seconds_count{kind="decode",model_name="specdec",num_draft_tokens="4"} 99.0' in text
    assert 'specdec:engine_step_seconds_count{kind="admit",model_name="specdec",num_draft_tokens="4"} 1.0' in text
    row = LevelResult("speculative", 8, 16, 2048, 1.0, 2048.0, 0.01, 0.02, 0.003, 0.12, 0.002, 3.0, **stats)
    table = markdown_table([row])
    assert "| 2 / 2 | 100 | 6.0 / 150.0 / 150.0 | 150.0 | 1 (150.0) | 0.5 / 2.0 |" in table


def test_full_collections_are_timed_and_counted_per_level():
    metrics = ServerMetrics(FakeLLM())
    before = parse_counters(metrics.render().decode())
    gc.collect()
    after = parse_counters(metrics.render().decode())
    stats = level_server_stats(before, after)
    assert stats["gc_full_passes"] >= 1 and stats["gc_full_max_s"] > 0
    row = LevelResult("plain", 1, 1, 8, 1.0, 8.0, 0.01, 0.01, 0.001, 0.001, 0.001, None, **stats)
    assert f"| {stats['gc_full_passes']} (" in markdown_table([row])


def test_level_stats_without_the_metrics():
    """A server without the new metrics (an older one behind --url): the fields stay None."""
    empty = parse_counters("")
    stats = level_server_stats(empty, empty)
    assert stats == {k: None for k in stats}
    row = LevelResult("plain", 1, 1, 8, 1.0, 8.0, 0.01, 0.01, 0.001, 0.001, 0.001, None, **stats)
    assert "| – | – | – / – / – | – | – (–) | – / – | – (–) |" in markdown_table([row])


def test_the_mailbox_wakes_the_loop_once_per_flush():
    loop = asyncio.new_event_loop()
    try:
        metrics = ServerMetrics(FakeLLM())
        box = _Mailbox(loop, metrics)
        drains = []
        original = box._drain
        box._drain = lambda: (drains.append(1), original())
        queues = [asyncio.Queue() for _ in range(3)]

        def driver():  # one step: 6 outputs for 3 requests, then the step's flush
            for i in range(6):
                box.put(queues[i % 3], i)
            box.flush()
            box.flush()  # a second flush before the drain ran schedules nothing

        thread = threading.Thread(target=driver)
        thread.start()
        thread.join()

        async def collect():
            return [[await q.get() for _ in range(2)] for q in queues]

        assert loop.run_until_complete(asyncio.wait_for(collect(), 5)) == [[0, 3], [1, 4], [2, 5]]
        assert drains == [1]
        assert 'specdec:output_delivery_seconds_count{model_name="specdec"} 1.0' in metrics.render().decode()
    finally:
        loop.close()
    box.put(queues[0], 7)
    box.flush()  # a closed loop: dropped, no error


def test_live_server_exports_steps_and_no_captures_on_cpu(server, idle):
    """On CPU nothing is captured; every step is timed under its runner's γ; outputs reach the loop."""
    body = {"model": "demo", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
    assert httpx.post(server + "/v1/completions", json=body, timeout=60).status_code == 200
    values = idle()
    m = ("model_name", "demo")
    assert values[("specdec:graph_captures_total", (m,))] == 0
    assert values[("specdec:step_shapes", (m,))] >= values[("specdec:step_shapes_run", (m,))] >= 1
    assert values[("specdec:engine_step_seconds_count", (("kind", "admit"), m, ("num_draft_tokens", "4")))] >= 1
    assert values[("specdec:engine_step_seconds_count", (("kind", "decode"), m, ("num_draft_tokens", "4")))] >= 1
    assert values[("specdec:output_delivery_seconds_count", (m,))] >= 1
    assert values[("specdec:driver_handoff_seconds_count", (m,))] >= 1
    labels = {dict(key[1]).get("num_draft_tokens") for key in values if key[0] == "specdec:engine_step_seconds_count"}
    assert labels <= {"0", "4"}  # every stepping runner is one the model holds


def test_draft_counts_are_added_once_per_step():
    """The driver thread sums a step's counts and adds them at the step's end (before its outputs are woken)."""
    from specdec.step import RequestOutput

    llm = FakeLLM()
    metrics = ServerMetrics(llm)
    outputs = [RequestOutput("a", [5, 6, 7], None, 2, 4, False, None),
               RequestOutput("b", [8], None, 0, 4, False, None), RequestOutput("c", [9], None, 0, 0, False, None)]
    for out in outputs:
        metrics.on_output(llm.spec, out)

    def value(name, **labels):
        return metrics.registry.get_sample_value(name, {"model_name": "specdec", **labels})

    assert value("specdec:spec_decode_num_drafts_total") == 0  # not before the step's end
    metrics.on_step(StepTiming(llm.spec, 0.004, 0.0001, len(outputs)))
    assert value("specdec:spec_decode_num_drafts_total") == 2
    assert value("specdec:spec_decode_num_draft_tokens_total") == 8
    assert value("specdec:spec_decode_num_accepted_tokens_total") == 2
    assert value("specdec:generation_tokens_total") == 5
    assert [value("specdec:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(2)] == [1, 1]
    metrics.on_step(StepTiming(llm.spec, 0.004, 0.0001, 0))  # an empty step adds nothing
    assert value("specdec:spec_decode_num_drafts_total") == 2


def test_metrics_prefix_and_model_name_label_for_vllm_dashboards():
    """--metrics-prefix vllm: gives vLLM's names, each with vLLM's model_name label."""
    import pytest

    from prometheus_client.parser import text_string_to_metric_families

    metrics = ServerMetrics(FakeLLM(), prefix="vllm:", model_name="my-model")
    metrics.on_step(StepTiming(FakeLLM().spec, 0.004, 0.0001, 0))
    samples = [s for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples]
    names = {s.name for s in samples}
    assert {"vllm:spec_decode_num_drafts_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:time_to_first_token_seconds_count", "vllm:generation_tokens_total"} <= names
    assert all(s.name.startswith("vllm:") and s.labels["model_name"] == "my-model" for s in samples)
    for bad in ("vllm-", "1x", "", "a b"):
        with pytest.raises(ValueError, match="prefix"):
            ServerMetrics(FakeLLM(), prefix=bad)


def test_the_prefill_budget_of_each_runner_is_exported_and_read_per_level():
    """`prefill_budget_tokens{num_draft_tokens}`: what each runner's next step may prefill ("auto"'s measured
    budget moves with the load), read by the benchmark at a level's end; a runner without chunked prefill (None)
    exports nothing."""

    class Runner:
        def __init__(self, budget):
            self.step_prefill_budget = budget

    llm = FakeLLM()
    llm.plain, llm.spec = Runner(None), Runner(300)
    metrics = ServerMetrics(llm)
    before = parse_counters(metrics.render().decode())
    metrics.on_step(StepTiming(llm.plain, 0.002, 0.0001, 1))
    metrics.on_step(StepTiming(llm.spec, 0.005, 0.0001, 1))
    llm.spec.step_prefill_budget = 420
    metrics.on_step(StepTiming(llm.spec, 0.005, 0.0001, 1))
    stats = level_server_stats(before, parse_counters(metrics.render().decode()))
    assert stats["prefill_budget_tokens"] == {"4": 420.0}  # the spec runner's latest; the plain one's: unset
