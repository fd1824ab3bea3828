"""Smoke test of scripts/bench_engine_trees.py (trees vs chains on the engine) on a tiny checkpoint pair."""

import importlib.util
import json
from pathlib import Path


def load_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_engine_trees.py"
    spec = importlib.util.spec_from_file_location("bench_engine_trees", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_configuration_runs_and_is_written(ckpt, tmp_path):
    out = tmp_path / "trees.json"
    result = load_script().main(["--pair", str(ckpt), "--device", "cpu", "--batches", "1,2", "--temperatures", "0,1",
                                 "--gamma", "2", "--trees", "2,1;1,1", "--max-new-tokens", "6", "--json", str(out)])
    rows = result["rows"]
    assert [r["config"] for r in rows[:4]] == ["plain", "chain γ=2", "[2, 1]", "[1, 1]"]
    assert len(rows) == 2 * 2 * 4 and json.loads(out.read_text())["rows"] == rows
    for row in rows:
        assert row["tokens"] == 6 * 6 and row["tau"] >= 1.0  # six requests (the six prompts) × 6 tokens
        assert row["same_text_as_plain"] == (1.0 if row["temperature"] == 0 else None)  # fp32: exact
        if row["config"] == "plain":
            assert row["speedup_vs_plain"] == 1.0 and row["tau"] == 1.0
    greedy_chain = [r for r in rows if r["temperature"] == 0 and r["config"] in ("chain γ=2", "[1, 1]")]
    assert greedy_chain[0]["tau"] == greedy_chain[1]["tau"]  # [1, 1] is the chain γ = 2
