"""scripts/serve_memory.py at tiny sizes: `specdec serve` on the shipped demo pair, a few requests alone then at
once, the concurrent answers equal to the lone ones, the server's memory read from /proc (the full run, on the
SmolLM2 GGUF with 256 slots × 8,192 positions, is BENCHMARKS.md's)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_serve_memory_runs_on_the_demo_pair(monkeypatch, capsys):
    import runpy

    from specdec.bench.demo_pair import DEMO_PAIR

    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    if not (DEMO_PAIR / "target" / "config.json").is_file():
        pytest.skip("the demo pair is not installed")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    main = runpy.run_path(str(ROOT / "scripts" / "serve_memory.py"), run_name="scripts_smoke")["main"]
    row = main(["--requests", "3", "--max-tokens", "4", "--serve-arg=--max-batch-size", "--serve-arg=4"])
    assert row["matches"] == 3 and row["mismatched"] == [] and row["peak_running"] <= 3
    for phase in ("ready", "after_alone", "after_concurrent"):
        memory = row[phase]
        assert set(memory) == {"VmRSS", "VmHWM", "RssAnon", "RssFile"} and 0 < memory["VmRSS"] <= memory["VmHWM"]
    assert row["kv_cache"].startswith("KV cache: ") and "paged" in row["kv_cache"]
    assert capsys.readouterr().out.count("\n") == 1  # one JSON line
