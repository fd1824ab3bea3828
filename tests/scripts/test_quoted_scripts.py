"""The scripts whose figures BENCHMARKS.md quotes, each run end to end on tiny inputs (the shipped demo pair, a few
tokens): they still run against today's library and write the rows the table is read from."""

import json
from pathlib import Path

import pytest

from helpers import run_main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "specdec" / "assets" / "demo_pair"
pytestmark = pytest.mark.skipif(not (DEMO / "target" / "config.json").is_file(), reason="the demo pair is not installed")


def run_script(name: str, argv: list[str], monkeypatch) -> None:
    run_main(ROOT / "scripts" / name, argv, monkeypatch)


def test_processors_cost(tmp_path, monkeypatch):
    out = tmp_path / "processors.json"
    run_script("processors_cost.py", ["--rounds", "1", "--max-new-tokens", "3", "--out", str(out)], monkeypatch)
    rows = json.loads(out.read_text())["rows"]
    # the table's cells: both runners, batch 1 and 8, plain and γ 4, each with both speeds and their ratio
    assert {(r["runner"], r["batch"], r["gamma"]) for r in rows} == {
        (runner, b, g) for runner in ("engine", "hf") for b in (1, 8) for g in (0, 4)}
    assert all(r["plain_tok_s"] > 0 and r["processed_tok_s"] > 0 and r["ratio"] > 0 for r in rows)


def test_bench_bitwise_on_the_cpu(tmp_path, monkeypatch):
    out = tmp_path / "bitwise.json"
    run_script("bench_bitwise.py", ["--pair", str(DEMO), "--device", "cpu", "--batch", "1", "--new", "2",
                                     "--skip-gemm", "--out", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    timed = [r for r in rows if "tok_s" in r]
    assert {r["bitwise"] for r in timed} == {False, True} and all(r["tok_s"] > 0 for r in timed)


def test_bench_constrained(tmp_path, monkeypatch):
    pytest.importorskip("xgrammar")
    out = tmp_path / "constrained.json"
    run_script("bench_constrained.py", ["--runners", "hf", "--max-new-tokens", "8", "--repeats", "1",
                                         "--json", str(out)], monkeypatch)
    rows = json.loads(out.read_text())["rows"]
    assert {r["constrained"] for r in rows} == {False, True} and all(r["tokens_per_s"] > 0 for r in rows)
