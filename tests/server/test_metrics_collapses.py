"""`/metrics` exports the γ policy's acceptance collapses (`specdec.engine.acceptance`) of the watched engine."""

from pathlib import Path


def test_metrics_export_the_acceptance_collapses():
    from prometheus_client.parser import text_string_to_metric_families
    from transformers import AutoModelForCausalLM

    from specdec.engine import Engine, EngineConfig
    from specdec.server.metrics import ServerMetrics

    folder = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair" / "target"
    target = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    engine = Engine(target, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0))

    class LLM:  # what ServerMetrics reads of an LLM
        num_running = num_waiting = 0

    metrics = ServerMetrics(LLM())

    def samples():
        text = metrics.render().decode()
        families = text_string_to_metric_families(text)
        return {(s.name, s.labels.get("kind")): s.value for f in families for s in f.samples}

    assert samples()[("specdec:spec_decode_collapses", "request")] == 0  # no engine watched yet
    metrics.watch_runner(engine)
    engine.policy.watch.collapses = 3
    engine.policy.watch.drafter.alarms = 1
    values = samples()
    assert values[("specdec:spec_decode_collapses", "request")] == 3
    assert values[("specdec:spec_decode_collapses", "drafter")] == 1
