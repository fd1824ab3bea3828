"""`specdec bench --mixed-step`: the traffic table with every arm's engine on the mixed prefill/decode step (CPU
`--quick` smoke run: the table's structure and that chunks rode in the steps, not speed)."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main

ARGS = ["bench", "--quick", "--slots", "2", "--arrival", "closed", "--drafters", "model", "--new-tokens", "4", "8",
        "--prompt-tokens", "40", "100", "--requests-per-slot", "3", "--json"]


def test_bench_quick_mixed_step_runs_every_arm_on_the_mixed_step(tmp_path, capsys):
    assert main(ARGS + ["--mixed-step", "--out", str(tmp_path / "mixed")]) == 0
    result = json.loads((tmp_path / "mixed" / "traffic.json").read_text())
    assert result["mixed_step"] is True and any("mixed step on" in n for n in result["notes"])
    rows = result["rows"]
    assert [r["drafter"] for r in rows] == ["plain", "model"]
    for r in rows:  # requests arrive while others run (a closed loop over more requests than slots): chunks ride
        assert r["tokens"] > 0 and r["extra"]["mixed_steps"] > 0
    assert rows[1]["vs_plain"] is not None


def test_the_default_engine_runs_mixed_steps_and_mixed_step_false_none(tmp_path, capsys):
    """The engine's default ("auto": on the paged pool the table runs on) feeds chunks in mixed steps; the negative
    control, `--mixed-step false`, counts no mixed step (the count is the engine's own)."""
    assert main(ARGS + ["--out", str(tmp_path / "default")]) == 0
    result = json.loads((tmp_path / "default" / "traffic.json").read_text())
    assert result["mixed_step"] is True and not any("mixed step" in n for n in result["notes"])
    assert all(r["extra"]["mixed_steps"] > 0 for r in result["rows"])
    assert main(ARGS + ["--mixed-step", "false", "--out", str(tmp_path / "off")]) == 0
    result = json.loads((tmp_path / "off" / "traffic.json").read_text())
    assert result["mixed_step"] is False and any("mixed step off" in n for n in result["notes"])
    assert all(r["extra"]["mixed_steps"] == 0 for r in result["rows"])


def test_mixed_step_belongs_to_the_traffic_table(capsys):
    assert main(["bench", "--preset", "smoke", "--mixed-step"]) == 2
    assert "--mixed-step" in capsys.readouterr().err
    assert main(["bench", "--preset", "chat", "--quick", "--mixed-step"]) == 2
    assert "--mixed-step" in capsys.readouterr().err


@pytest.mark.parametrize("policy", [["--policy", "2"], []], ids=["fixed", "auto"])
def test_bench_quick_async_scheduling_runs_steps_ahead(tmp_path, capsys, policy):
    """`--async-scheduling`: every arm's engine launches steps ahead (the engine's own count), at a fixed γ and at the
    default "auto" (its γ chosen one record late)."""
    assert main(ARGS + ["--async-scheduling", *policy, "--out", str(tmp_path / "async")]) == 0
    result = json.loads((tmp_path / "async" / "traffic.json").read_text())
    assert result["async_scheduling"] is True and any("async scheduling on" in n for n in result["notes"])
    assert all(r["extra"]["ahead_steps"] > 0 for r in result["rows"])


def test_on_the_cpu_no_step_runs_ahead_by_default(tmp_path, capsys):
    """Negative control: without --async-scheduling no step runs ahead on the CPU (the default: on with CUDA only)."""
    assert main(ARGS + ["--policy", "2", "--out", str(tmp_path / "sync")]) == 0
    result = json.loads((tmp_path / "sync" / "traffic.json").read_text())
    assert result["async_scheduling"] is False and all(r["extra"]["ahead_steps"] == 0 for r in result["rows"])
