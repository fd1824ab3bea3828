"""The benchmark harness: rows, speedups, report files, and the `specdec bench --preset smoke --json` contract."""

import dataclasses
import json

import pytest
import torch

from specdec.bench import presets
from specdec.bench.report import markdown_table, write_plots
from specdec.bench.runner import headline, measure_ours, run_grid


@pytest.fixture(scope="module")
def mini_setup():
    setup = presets.smoke(torch.device("cpu"), max_new_tokens=6)
    setup.batch_sizes = (1, 2)
    setup.temperatures = (0.0,)
    setup.gamma_sweep = (2,)
    setup.guarded_batch = 2
    return setup


def test_grid_rows_and_speedups(mini_setup):
    rows = run_grid(mini_setup, log=lambda s: None)
    kinds = {(r["method"], r["drafter"], r["batch"]) for r in rows}
    assert ("ours-engine", "none", 1) in kinds and ("ours-loop", "model", 2) in kinds
    assert ("hf", "model (assisted)", 1) in kinds and ("hf", "prompt_lookup", 1) in kinds
    unsupported = [r for r in rows if r["method"] == "hf" and r["batch"] == 2 and r["drafter"] != "none"]
    assert unsupported and all("batch size 1" in r["note"] and r["tokens_per_s"] is None for r in unsupported)
    for r in rows:
        if r.get("tokens_per_s") and r["drafter"] == "none":
            assert r["measured_speedup"] == pytest.approx(1.0)
    model = [r for r in rows if r["method"] == "ours-engine" and r["drafter"] == "model" and r["batch"] == 1]
    assert model and all(0 <= r["alpha"] <= 1 and r["tau"] >= 1 and r["c"] > 0 for r in model)
    assert all(r["predicted_speedup"] > 0 and r["measured_speedup"] > 0 for r in model)
    guarded = [r for r in rows if r.get("auto_off")]
    assert guarded and all(0 <= r["auto_off_kept_gamma"] <= mini_setup.gamma for r in guarded)  # mean γ of "auto"
    head = headline(rows)
    assert "t0" in head and "hf_assisted" in head
    table = markdown_table(rows)
    assert table.count("\n") == len(rows) + 1 and "| ours-engine |" in table


def test_synthetic_acceptance_controls_alpha(mini_setup):
    setup = dataclasses.replace(mini_setup, max_new_tokens=48)
    row = measure_ours(setup, "engine", "model", 0.0, 1, 3, synthetic=0.5)
    assert "synthetic" in row["drafter"]
    assert 0.3 < row["alpha"] < 0.7  # ~70 verified positions: a loose bound around the set α


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        {"method": "ours-engine", "drafter": "model", "temperature": 0.0, "batch": 1, "gamma": g, "sweep": True,
         "measured_speedup": 1 + g / 4, "predicted_speedup": 1 + g / 3}
        for g in (1, 2, 4)
    ]
    files = write_plots(rows, tmp_path, "x")
    assert len(files) == 2 and all((tmp_path / f.split("/")[-1]).stat().st_size > 1000 for f in files)


@pytest.mark.slow
def test_cli_smoke_json(tmp_path, capsys):
    from specdec.cli import main

    assert main(["bench", "--preset", "smoke", "--json", "--out", str(tmp_path), "--max-new-tokens", "8"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    for key in ("alpha", "predicted_speedup", "measured_speedup", "hf_assisted"):
        assert key in summary
    assert summary["alpha"] is not None and summary["hf_assisted"]["t0"]["tokens_per_s"] > 0
    result = json.loads((tmp_path / "bench_smoke.json").read_text())
    assert result["rows"] and (tmp_path / "bench_smoke.md").is_file()
