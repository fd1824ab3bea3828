"""Hostile command lines: every failure is one line on stderr and exit 2 — no traceback, no hang, no foreign
code, no network, nothing echoed before the arguments are checked — and every --json line is strict JSON.

Most cases call `specdec.cli.main` in-process (fast); a few run the real console entry point in a
subprocess with a timeout: stdin answering "y" to any prompt, the import cost of `--help`, a full run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.cli import main

REPO = Path(__file__).resolve().parents[2]


def strict_json(line: str):
    """json.loads that refuses NaN / Infinity, like JSON.parse or jq."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection (a hub download) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def gen(ck, *extra, target="good"):
    return ["generate", "--target", str(ck[target]), "--prompt", "w1 w2 w3", *extra]


ERROR_CASES = {
    # numbers bounded before anything is allocated or loaded
    "gamma above the maximum": (lambda ck: gen(ck, "--draft", "ngram", "--num-draft-tokens", "100000",
                                               "--max-new-tokens", "2"), "<= 64"),
    "gamma with 22 digits": (lambda ck: gen(ck, "--draft", "ngram", "--num-draft-tokens", "9" * 22), "1..64"),
    "unknown policy": (lambda ck: gen(ck, "--draft", "ngram", "--num-draft-tokens", "fastest"), "policy"),
    "max-new-tokens 1e9": (lambda ck: gen(ck, "--prompt", "w4", "--max-new-tokens", "1000000000"), "--max-new-tokens"),
    "past the context": (lambda ck: gen(ck, "--max-new-tokens", "100000"), "context of 256"),
    "negative max-new-tokens": (lambda ck: gen(ck, "--max-new-tokens", "-5"), "--max-new-tokens"),
    "temperature nan": (lambda ck: gen(ck, "--temperature", "nan"), "temperature"),
    "top-p 0": (lambda ck: gen(ck, "--top-p", "0"), "top_p"),
    "negative seed": (lambda ck: gen(ck, "--seed", "-1"), "seed"),
    "seed past 2**63": (lambda ck: gen(ck, "--seed", str(2**70)), "seed"),
    "negative threads": (lambda ck: gen(ck, "--threads", "-1"), "--threads"),
    "device foo": (lambda ck: gen(ck, "--device", "foo"), "--device"),
    "device meta": (lambda ck: gen(ck, "--device", "meta"), "--device"),
    "dtype int8": (lambda ck: gen(ck, "--dtype", "int8"), "--dtype"),
    "not an int": (lambda ck: gen(ck, "--max-new-tokens", "abc"), "invalid int"),
    "empty prompt": (lambda ck: ["generate", "--target", str(ck["good"]), "--prompt", ""], "empty"),
    # checkpoints: refused before anything runs
    "unknown model_type + auto_map": (lambda ck: gen(ck, target="evil"), "custom code"),
    "auto_map on a known type": (lambda ck: gen(ck, target="automap"), "custom code"),
    "shard index escapes the folder": (lambda ck: gen(ck, target="traversal"), "outside the checkpoint folder"),
    "truncated safetensors": (lambda ck: gen(ck, target="truncated"), "truncated"),
    "corrupt safetensors": (lambda ck: gen(ck, target="corrupt"), "not a valid safetensors"),
    "vocab_size 0": (lambda ck: gen(ck, target="vocab0"), "vocab_size"),
    "pickled weights": (lambda ck: gen(ck, target="pickle"), "allow_pickle"),
    "missing folder": (lambda ck: ["generate", "--target", "/nonexistent/x", "--prompt", "w1"], "not found"),
    "missing draft": (lambda ck: gen(ck, "--draft", "/nonexistent/draft"), "not found"),
    # numerics: float16 logits that overflow to +inf are an error, not a silent token
    "fp16 overflow, greedy": (lambda ck: gen(ck, "--dtype", "float16", "--temperature", "0", "--max-new-tokens", "3",
                                             target="overflow"), "+inf"),
    "fp16 overflow, sampled": (lambda ck: gen(ck, "--dtype", "float16", "--max-new-tokens", "3", target="overflow"),
                               "+inf"),
    # other subcommands
    "analyze --max-gamma 1e8": (lambda ck: ["analyze", "--alpha", "0.8", "--cost-ratio", "0.05",
                                            "--max-gamma", "100000000"], "--max-gamma"),
    "analyze nan": (lambda ck: ["analyze", "--alpha", "0.8", "--cost-ratio", "nan"], "--cost-ratio"),
    "bench --num-draft-tokens 0": (lambda ck: ["bench", "--num-draft-tokens", "0"], "--num-draft-tokens"),
    "bench --num-draft-tokens -3": (lambda ck: ["bench", "--num-draft-tokens", "-3"], "--num-draft-tokens"),
    "bench --repeats 0": (lambda ck: ["bench", "--repeats", "0"], "--repeats"),
    "bench --pair nopair": (lambda ck: ["bench", "--preset", "gpu", "--pair", "nopair"], "--pair"),
    "demo --num-draft-tokens 0": (lambda ck: ["demo", "--num-draft-tokens", "0"], "--num-draft-tokens"),
    "policies 0": (lambda ck: ["policies", "--policies", "0"], "--policies"),
    "train negative budget": (lambda ck: ["train", "pair", "--preset", "tiny", "--data", "/nonexistent",
                                          "--out", "/nonexistent", "--budget-scale", "-1"], "--budget-scale"),
    "serve switch interval": (lambda ck: ["serve", "--target", str(ck["good"]), "--switch-interval", "-1"],
                              "--switch-interval"),
    "serve switch interval nan": (lambda ck: ["serve", "--target", str(ck["good"]), "--switch-interval", "nan"],
                                  "--switch-interval"),
    "serve synthetic acceptance": (lambda ck: ["serve", "--target", str(ck["good"]), "--synthetic-acceptance", "2"],
                                   "synthetic_acceptance"),
    "train head cache tokens": (lambda ck: ["train", "head", "--target", str(ck["good"]), "--data", "/nonexistent",
                                            "--out", "/nonexistent", "--feature-cache-tokens", "-3"],
                                "--feature-cache-tokens"),
    "no command": (lambda ck: [], "give a command"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_error_is_one_line_exit_2(capsys, checkpoints, name):
    build, fragment = ERROR_CASES[name]
    try:
        code, out, err = run(capsys, *build(checkpoints))
    except SystemExit as exit_:  # argparse exits through the parser's one-line error
        code, cap = exit_.code, capsys.readouterr()
        out, err = cap.out, cap.err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    assert out == ""  # nothing echoed or half-printed before the failure
    assert not checkpoints["marker"].exists()


def test_a_sliding_window_checkpoint_runs_on_the_engine(capsys, checkpoints):
    """Once refused; now the engine computes the window (exactness: tests/fast/test_families.py)."""
    code, out, err = run(capsys, *gen(checkpoints, "--temperature", "0", "--max-new-tokens", "12", "--json",
                                      target="mistral"))
    assert code == 0, err
    assert len(strict_json(out.strip().splitlines()[-1])["sequences"][0]) == 12


def test_tiny_temperature_is_greedy_and_json_is_strict(capsys, checkpoints):
    code, out, err = run(capsys, *gen(checkpoints, "--temperature", "1e-38", "--max-new-tokens", "6", "--json"))
    assert code == 0, err
    tiny = strict_json(out.strip().splitlines()[-1])
    code, out, err = run(capsys, *gen(checkpoints, "--temperature", "0", "--max-new-tokens", "6", "--json"))
    greedy = strict_json(out.strip().splitlines()[-1])
    assert tiny["sequences"] == greedy["sequences"]  # below the floor (1e-5) a temperature is greedy


def test_json_with_no_tokens_and_no_acceptance_is_strict(capsys, checkpoints):
    code, out, err = run(capsys, *gen(checkpoints, "--draft", "ngram", "--max-new-tokens", "0", "--json"))
    assert code == 0, err
    assert strict_json(out.strip().splitlines()[-1])["sequences"] == [[]]
    code, out, err = run(capsys, "analyze", "--alpha", "1.0", "--cost-ratio", "0", "--json")
    assert code == 0 and strict_json(out)["speedup_ceiling"] is None


def test_full_run_strict_json_on_stdout_and_quiet_stderr(capsys, checkpoints):
    code, out, err = run(capsys, *gen(checkpoints, "--draft", str(checkpoints["good"]), "--max-new-tokens", "5",
                                      "--seed", "3", "--json", "--quiet"))
    assert code == 0, err
    assert err == ""  # no progress bars, no stats line with --quiet
    result = strict_json(out.strip())
    assert len(result["sequences"][0]) == 5 and result["stats"]["alpha"] is not None


def test_pickled_weights_load_with_the_opt_in(capsys, checkpoints):
    argv = ["--max-new-tokens", "3", "--temperature", "0", "--json"]
    code, out, err = run(capsys, *gen(checkpoints, *argv, "--allow-pickle", target="pickle"))
    assert code == 0, err
    code, ref, err = run(capsys, *gen(checkpoints, *argv))  # the same weights from safetensors
    assert strict_json(out)["sequences"] == strict_json(ref)["sequences"]


# ---------------------------------------------------------------------------------------------------
# The real entry point, in a subprocess (each costs a Python start-up and a torch import).


def _specdec(*argv, stdin: str = "", timeout: float = 120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "specdec", *argv], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_help_does_not_import_torch():
    code = ("import sys, time; t = time.perf_counter(); from specdec.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules, time.perf_counter() - t)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    imported, seconds = out.stdout.split()
    assert imported == "False", out.stderr
    start = time.perf_counter()
    done = _specdec("--help", timeout=60)
    assert done.returncode == 0 and "generate" in done.stdout
    assert time.perf_counter() - start < 5.0  # 0.2 s on an idle machine; generous for a loaded CI runner


def test_custom_code_never_runs_even_when_stdin_says_yes(checkpoints):
    done = _specdec("generate", "--target", str(checkpoints["evil"]), "--prompt", "w1", stdin="y\ny\ny\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "custom code" in done.stderr
    assert done.stdout == "" and not checkpoints["marker"].exists()


