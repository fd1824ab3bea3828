"""`specdec serve` refuses bad options and a busy port before the model loads (one line, exit 2); the launcher
misuse `torchrun ... generate` without --tensor-parallel-size is one line; every --help shows its defaults."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from specdec.cli import main  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair"


@pytest.fixture
def no_loading(monkeypatch):
    """specdec.load fails the test if reached: these errors must come first."""
    import specdec

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")

    monkeypatch.setattr(specdec, "load", refuse)


def serve(capsys, *extra) -> tuple[int, str]:
    code = main(["serve", "--target", str(DEMO / "target"), *extra])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("extra, fragment", [
    (["--port", "70000"], "--port"), (["--port", "0"], "--port"), (["--port", "-1"], "--port"),
    (["--metrics-prefix", "vllm-"], "--metrics-prefix"), (["--api-key", ""], "--api-key"),
    (["--timeout-read", "0"], "--timeout-read"), (["--timeout-keep-alive", "nan"], "--timeout-keep-alive"),
    (["--max-connections", "0"], "--max-connections"), (["--threads", "-1"], "--threads"),
    (["--seed", "-5"], "--seed"), (["--synthetic-acceptance", "1.5"], "synthetic_acceptance"),
    (["--chat-template", "/nonexistent.jinja"], "--chat-template"),
    (["--prefill-budget", "8"], "--prefill-budget"), (["--prefill-budget", "lots"], "--prefill-budget"),
    (["--prefill-steps", "4", "--mixed-step", "false"], "--prefill-steps"),
    (["--prefill-budget", "64", "--prefill-steps", "-1"], "--prefill-steps"),
    (["--prefill-budget", "Auto"], "--prefill-budget"),
    (["--prefill-stall", "0.5", "--mixed-step", "false"], "--prefill-stall"),
    (["--prefill-budget", "64", "--prefill-stall", "0.5"], "--prefill-stall"),
    (["--prefill-budget", "auto", "--prefill-stall", "0"], "--prefill-stall"),
    (["--prefill-budget", "auto", "--prefill-stall", "nan"], "--prefill-stall"),
    (["--grammar-compile-timeout", "0"], "--grammar-compile-timeout"),
    (["--grammar-compile-timeout", "inf"], "--grammar-compile-timeout"),
    (["--grammar-compile-workers", "0"], "--grammar-compile-workers"), (["--grammar-cache-mb", "-1"], "--grammar-cache-mb"),
    (["--tensor-parallel-size", "2", "--num-draft-tokens", "heuristc"], "'auto' or a policy name --num-draft-tokens"),
])
def test_bad_options_are_one_line_before_loading(capsys, no_loading, extra, fragment):
    code, err = serve(capsys, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err and "Traceback" not in err, err


def test_a_policy_name_passes_the_tensor_parallel_check(capsys, no_loading):
    """Under --tensor-parallel-size a policy name is taken (every rank runs rank 0's choice): the launch passes every
    check and reaches `specdec.load` (here refused by the fixture), where a misspelled name is refused before it
    (the negative control, in the table above)."""
    code, err = serve(capsys, "--tensor-parallel-size", "2", "--num-draft-tokens", "heuristic")
    assert code == 2 and "the model was loaded" in err and "--num-draft-tokens" not in err, err


def test_a_busy_port_is_one_line_before_loading(capsys, no_loading):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, err = serve(capsys, "--port", str(port))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"127.0.0.1:{port}" in err and "in use" in err.lower(), err


def test_too_many_connections_for_the_descriptor_limit_is_one_line(capsys, no_loading):
    resource = pytest.importorskip("resource")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 60000:
        pytest.skip(f"the hard open-files limit ({hard}) fits every --max-connections")
    code, err = serve(capsys, "--max-connections", "65000")
    assert code == 2 and "--max-connections" in err and "ulimit" in err and len(err.strip().splitlines()) == 1, err


def test_generation_config_settings_the_server_cannot_apply_are_named():
    from types import SimpleNamespace

    from specdec.cli.serve import dropped_generation_config

    config = SimpleNamespace(repetition_penalty=1.1, no_repeat_ngram_size=3, top_k=50, min_p=None, typical_p=0.9)
    assert dropped_generation_config(SimpleNamespace(generation_config=config)) == ["typical_p=0.9"]
    assert dropped_generation_config(SimpleNamespace(generation_config=SimpleNamespace(repetition_penalty=1.0))) == []


def test_torchrun_without_tensor_parallel_size_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    code = main(["generate", "--target", str(DEMO / "target"), "--prompt", "x"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--tensor-parallel-size 2" in err, err
    monkeypatch.setenv("RANK", "1")  # the other ranks exit 2 silently: one line in all
    assert main(["generate", "--target", str(DEMO / "target"), "--prompt", "x"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert main(["serve", "--target", str(DEMO / "target")]) == 2
    assert "WORLD_SIZE=2" in capsys.readouterr().err


def test_model_commands_have_threads_seed_quiet_and_every_help_shows_defaults():
    from specdec.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    loading = ("generate", "analyze", "demo", "bench", "policies", "serve", "beam", "check")
    for name in loading:
        options = {o for a in subparsers.choices[name]._actions for o in a.option_strings}
        assert {"--threads", "--seed", "--quiet"} <= options, name

    def walk(p, path):
        yield path, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub_name, sub in a.choices.items():
                    yield from walk(sub, f"{path} {sub_name}")

    for path, p in walk(parser, "specdec"):
        formatter = p._get_formatter()
        for action in p._actions:  # each option with a default: its help line, as rendered, names it
            if action.option_strings and action.help != argparse.SUPPRESS and \
                    action.default not in (None, False, argparse.SUPPRESS, [], ()):
                rendered = " ".join(formatter._format_action(action).split())
                assert "default" in rendered, (path, action.option_strings, rendered)
