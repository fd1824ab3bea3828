"""`specdec check` on tiny checkpoints saved to disk: the certificate, --json, exit codes, bounds first."""

import json

import pytest

from specdec.cli import main


def cli(capsys, *argv):
    code = main(["check", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def pair_args(ckpt):
    return ["--target", str(ckpt / "target"), "--draft", str(ckpt / "draft"), "--prompt", "w1 w2 w3",
            "--prompt", "w4 w5", "--prompt", "w7 w8 w9 w10", "--num-prompts", "3", "--greedy-tokens", "6"]


def test_certificate_and_json_on_a_correct_pair(capsys, ckpt):
    code, out, err = cli(capsys, *pair_args(ckpt), "--trials", "900", "--positions", "2", "--quiet")
    assert code == 0, out + err
    assert out.startswith("specdec check: PASS") and "worst     p-value" in out and "power     ok" in out
    assert "3/3 prompts identical" in out and err == ""
    assert "engine=auto → fast" in out  # what "auto" picks: the engine, on every device
    code, out, _ = cli(capsys, *pair_args(ckpt), "--trials", "900", "--positions", "2", "--json", "--quiet")
    data = json.loads(out)
    assert code == 0 and data["status"] == "pass" and data["passed"] is True and data["trials"] == 900
    assert len(data["positions"]) == 2 and data["worst_p_value"] >= 1e-4 and data["draft"].endswith("draft")


def test_underpowered_exits_3(capsys, ckpt):
    code, out, _ = cli(capsys, *pair_args(ckpt), "--trials", "20", "--quiet")
    assert code == 3 and out.startswith("specdec check: UNDERPOWERED") and "raise trials" in out


def test_greedy_only(capsys, ckpt):
    code, out, _ = cli(capsys, *pair_args(ckpt), "--temperature", "0", "--engine", "fast", "--quiet")
    assert code == 0 and "law       not tested" in out and "3/3 prompts identical" in out


@pytest.mark.parametrize("argv, message", [
    (["--trials", "0"], "--trials must be >= 1"), (["--positions", "9"], "--positions must be <="),
    (["--positions", "1"], "--positions must be >= 2"),
    (["--level", "0"], "--level must be >"), (["--level", "0.5"], "--level must be < 0.5"),
    (["--top-p", "1.5"], "--top-p must be <="), (["--num-draft-tokens", "0"], "--num-draft-tokens"),
    (["--greedy-tokens", "-1"], "--greedy-tokens must be >= 0")
])
def test_bad_numbers_exit_2_before_loading(capsys, ckpt, argv, message):
    code, _, err = cli(capsys, *pair_args(ckpt), *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_unknown_engine_is_a_usage_error(capsys, ckpt):
    with pytest.raises(SystemExit) as exit_info:
        main(["check", *pair_args(ckpt), "--engine", "vllm"])
    assert exit_info.value.code == 2 and "invalid choice: 'vllm'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--draft", "x"], "--draft needs --target"),
                                           (["--target", "x"], "--target needs --draft")])
def test_target_and_draft_go_together(capsys, argv, message):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and message in err


def test_the_demo_pair_is_the_default(capsys):
    """`specdec check` with no pair checks the shipped demo pair (a short run; the full one is in BENCHMARKS.md)."""
    code, out, _ = cli(capsys, "--trials", "600", "--positions", "2", "--num-prompts", "2", "--greedy-tokens", "4",
                       "--json", "--quiet")
    data = json.loads(out)
    assert data["target"].endswith("demo_pair/target") and data["draft"].endswith("demo_pair/draft")
    assert code == 0 and data["status"] == "pass" and data["greedy"]["identical"] == data["greedy"]["prompts"] == 9
    assert all(p["resample_from_p"]["p_value"] < 1e-4 for p in data["positions"])
