"""Tests for `specdec analyze`."""

from __future__ import annotations

import json

import pytest

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
        (["--alpha", "0.5", "--cost-ratio", "-1"], "cost_ratio"),
        ([], "--alpha"),
    ],
)
def test_user_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1
