"""`specdec check`'s progress: the library reports each phase (it never prints); the CLI shows tqdm bars on a
terminal, none with --quiet or when stderr is a file."""

import argparse
import io

import specdec
from specdec.cli.check import ProgressBars


def test_check_reports_progress_through_the_callback(ckpt):
    from specdec.loading import load_model

    target = load_model(ckpt / "target", device="cpu", dtype="float32", what="target")
    draft = load_model(ckpt / "draft", device="cpu", dtype="float32", what="draft")
    seen = []
    specdec.check(target, draft, [[1, 2, 3], [4, 5]], trials=300, positions=2, num_prompts=2, greedy_tokens=4,
                  progress=lambda phase, done, total: seen.append((phase, done, total)))
    trials = [(d, t) for p, d, t in seen if p == "trials"]
    assert trials and trials[-1] == (300, 300) and [d for d, _ in trials] == sorted(d for d, _ in trials)
    assert [(p, d) for p, d, _ in seen if p == "greedy"] == [("greedy", 1), ("greedy", 2)]


def test_bars_only_on_a_terminal_and_never_with_quiet(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert ProgressBars.for_args(argparse.Namespace(quiet=False)) is None  # not a terminal
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr("sys.stderr", tty)
    assert ProgressBars.for_args(argparse.Namespace(quiet=True)) is None
    bars = ProgressBars.for_args(argparse.Namespace(quiet=False))
    assert bars is not None
    stream = io.StringIO()
    bars = ProgressBars(stream)
    for done in (100, 200, 300):
        bars("trials", done, 300)
    bars("greedy", 1, 2)
    assert bars.bars["trials"].n == 300 and bars.bars["greedy"].n == 1
    bars.close()
    assert "law trials" in stream.getvalue()
