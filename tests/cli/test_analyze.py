"""Tests for `specdec analyze`."""

from __future__ import annotations

import json

import pytest

from helpers import save_tiny_pair
from specdec.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["analyze", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_alpha_mode_recommends_paper_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--alpha", "0.8", "--cost-ratio", "0.05")
    assert code == 0
    assert "recommended gamma = 8" in out and "3.09X" in out


def test_alpha_mode_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--alpha", "0.8", "--cost-ratio", "0.05", "--op-cost-ratio", "0.01", "--json")
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["recommended_gamma"] == 8
    assert round(report["predicted_speedup"], 2) == 3.09
    assert len(report["table"]) == 65 and report["table"][0]["speedup"] == 1.0
    assert report["speculation_pays"] is True


def test_alpha_mode_when_speculation_does_not_pay(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--alpha", "0.1", "--cost-ratio", "0.5", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["recommended_gamma"] == 0 and report["predicted_speedup"] == 1.0


def test_max_gamma_caps_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--alpha", "0.8", "--cost-ratio", "0.05", "--max-gamma", "4", "--json")
    assert json.loads(out.strip().splitlines()[-1])["recommended_gamma"] == 4


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--alpha", "0.8"], "--cost-ratio"),
        (["--alpha", "1.5", "--cost-ratio", "0.1"], "alpha"),
        (["--alpha", "0.5", "--cost-ratio", "-1"], "--cost-ratio"),
        (["--alpha", "nan", "--cost-ratio", "0.1"], "--alpha"),
        (["--alpha", "0.5", "--cost-ratio", "0.1", "--max-gamma", "100000000"], "--max-gamma"),
        ([], "--alpha"),
    ],
)
def test_user_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_alpha_mode_plot(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "speedup.png"
    code, out, _ = run_cli(capsys, "--alpha", "0.8", "--cost-ratio", "0.05", "--plot", str(png))
    assert code == 0 and f"plot written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# Measured mode on tiny random checkpoints saved to disk


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = save_tiny_pair(tmp_path_factory.mktemp("ckpt"))
    prompts = root / "prompts.txt"
    prompts.write_text("w1 w2 w3\n\nw10 w11\nw5 w6 w7 w8 w9\n", encoding="utf-8")
    return root


def measured_cli(capsys, checkpoints, *extra: str) -> tuple[int, dict, str]:
    code, out, err = run_cli(
        capsys, "--target", str(checkpoints / "target"), "--draft", str(checkpoints / "draft"),
        "--prompts", str(checkpoints / "prompts.txt"), "--max-new-tokens", "6", "--context-length", "16",
        "--device", "cpu", *extra,
    )
    report = json.loads(out.strip().splitlines()[-1]) if code == 0 and "--json" in extra else {}
    return code, report, out + err


def test_measured_mode_json_and_plot(capsys, checkpoints, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "pair.png"
    code, report, text = measured_cli(capsys, checkpoints, "--json", "--plot", str(png))
    assert code == 0, text
    assert report["num_prompts"] == 3  # the blank line is skipped
    assert 0 < report["num_positions"] <= 3 * 6
    assert 0.0 <= report["alpha"] <= 1.0
    assert report["cost_ratio"] > 0 and not report["cost_ratio_given"]
    assert 0 < report["op_cost_ratio"] < 1  # the 1-layer draft does less arithmetic than the 2-layer target
    assert isinstance(report["recommended_gamma"], int) and report["predicted_speedup"] >= 1.0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_measured_mode_same_model_has_alpha_one(capsys, checkpoints) -> None:
    target = str(checkpoints / "target")
    code, out, err = run_cli(
        capsys, "--target", target, "--draft", target, "--prompts", str(checkpoints / "prompts.txt"),
        "--max-new-tokens", "5", "--cost-ratio", "0.1", "--temperature", "1.0", "--top-k", "20", "--json",
    )
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["alpha"] == pytest.approx(1.0, abs=1e-6)
    assert report["cost_ratio"] == 0.1 and report["cost_ratio_given"]
    assert report["op_cost_ratio"] == 1.0
    assert report["recommended_gamma"] == report["max_gamma"]  # α = 1: every extra draft pays


def test_measured_mode_table(capsys, checkpoints) -> None:
    code, _, text = measured_cli(capsys, checkpoints, "--cost-ratio", "0.02")
    assert code == 0, text
    assert "generated positions from 3 prompts" in text and "gamma" in text


@pytest.mark.parametrize(
    "which, fragment",
    [("target", "--target: no such directory"), ("draft", "--draft: no such directory"),
     ("prompts", "--prompts: no such file")],
)
def test_measured_mode_missing_paths(capsys, checkpoints, tmp_path, which: str, fragment: str) -> None:
    paths = {"target": checkpoints / "target", "draft": checkpoints / "draft", "prompts": checkpoints / "prompts.txt"}
    paths[which] = tmp_path / "nope"
    code, _, err = run_cli(capsys, *(x for k, v in paths.items() for x in (f"--{k}", str(v))))
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_measured_mode_needs_all_three(capsys, checkpoints) -> None:
    code, _, err = run_cli(capsys, "--target", str(checkpoints / "target"))
    assert code == 2 and "--draft" in err and "--prompts" in err


def test_alpha_and_target_conflict(capsys, checkpoints) -> None:
    code, _, err = run_cli(capsys, "--alpha", "0.5", "--target", str(checkpoints / "target"))
    assert code == 2 and "--alpha cannot be combined" in err


def test_directory_that_is_not_a_checkpoint(capsys, checkpoints, tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(
        capsys, "--target", str(checkpoints / "target"), "--draft", str(tmp_path / "empty"),
        "--prompts", str(checkpoints / "prompts.txt"),
    )
    # refused before any model is loaded: one line, nothing else on stderr
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("specdec analyze: error: --draft directory") and "no config.json" in err
