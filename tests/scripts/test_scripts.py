"""The scripts in scripts/ (benchmarks and device runs the lead keeps): each imports against today's library, none
reaches into the engine's or the fast model's private names, and the CPU-runnable ones run on tiny models."""

from __future__ import annotations

import ast
import json
import re
import runpy
from pathlib import Path

import pytest

from helpers import run_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


def _private_names(package: Path) -> set[str]:
    """`_name`s that `package` defines: functions, methods, classes, module globals and `self._name` attributes."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__") and n != "_"}


PRIVATE = _private_names(ROOT / "specdec" / "engine") | _private_names(ROOT / "specdec" / "fast")


def _private_uses(path: Path) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
            uses += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                     if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            uses.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE:
            uses.append(f"{node.lineno}: {node.value!r}")  # getattr(engine, "_name")
    return uses


def test_the_private_name_check_sees_a_private_use(tmp_path):
    """Negative control: the check below flags each way a script could reach a private name."""
    bad = tmp_path / "bad.py"
    bad.write_text("from specdec.bench.presets import _x\nengine._admit([])\ngetattr(engine, '_commit')\n")
    assert len(_private_uses(bad)) == 3 and "_admit" in PRIVATE


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_uses_no_private_library_names(path):
    assert _private_uses(path) == [], f"{path.name} reaches into private names of specdec"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports(path, monkeypatch):
    """Its imports resolve against today's library and it defines what it runs (its `main` is not called)."""
    monkeypatch.syspath_prepend(str(path.parent))
    namespace = runpy.run_path(str(path), run_name="scripts_smoke")
    assert callable(namespace.get("main")), f"{path.name} has no main()"


def test_host_overhead_runs_on_tiny_models(tmp_path, monkeypatch):
    out = tmp_path / "host.json"
    run_main(ROOT / "scripts" / "host_overhead.py", ["--sizes", "1,2", "--gammas", "0,2", "--steps", "2",
                                                        "--json", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    assert {(r["gamma"], r["n"]) for r in rows} == {(0, 1), (0, 2), (2, 1), (2, 2)}
    for row in rows:  # the engine's phases were timed through specdec.engine.profile
        assert {"admit", "commit", "step_shape", "MODEL verify"} <= set(row["us"]) and row["us"]["total"] > 0


def test_engine_table_prints_the_batch1_rows(tmp_path, monkeypatch, capsys):
    rows = {"plain": {"tok_s": 100.0}, "draft_gamma4": {"tok_s": 180.0, "speedup": 1.8, "alpha": 0.7, "tau": 2.9}}
    (tmp_path / "engine.json").write_text(json.dumps({"batch1_T0": rows}))
    run_main(ROOT / "scripts" / "engine_table.py", [str(tmp_path / "engine.json")], monkeypatch)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Batch 1, T=0"
    assert "| plain | – | 100 | 1 |" in lines[4] and "| draft | 4 | 180 | 1.80x | 0.70 | 2.90 |" in lines[5]


def test_demo_repetition_runs_on_the_shipped_pair(monkeypatch, capsys):
    from specdec.bench.demo_pair import DEMO_PAIR, PAIR_PROMPTS

    if not (DEMO_PAIR / "target" / "config.json").is_file():
        pytest.skip("the demo pair is not installed")
    run_main(ROOT / "scripts" / "demo_repetition.py", ["--max-new-tokens", "3"], monkeypatch)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(PAIR_PROMPTS) + 1  # a line per prompt, then the total
    assert re.fullmatch(r"all: repeated lines \d+/\d+ = [\d.]+, distinct 4-grams \d+/\d+ = [\d.]+", lines[-1])


def test_bench_engine_beams_runs_on_the_shipped_pair(tmp_path, monkeypatch, capsys):
    from specdec.bench.demo_pair import DEMO_PAIR

    if not (DEMO_PAIR / "target" / "config.json").is_file():
        pytest.skip("the demo pair is not installed")
    out = tmp_path / "beams.json"
    run_main(ROOT / "scripts" / "bench_engine_beams.py", ["--device", "cpu", "--prompts", "1", "--max-new-tokens",
                                                            "4", "--configs", "4:2,8:1", "--ops", "--out", str(out)],
              monkeypatch)
    rows = json.loads(out.read_text())["rows"]
    assert [r["identical_beams"] for r in rows] == [True, True, True, True, None] and all(r["tokens"] == 4 for r in rows)
    assert rows[0]["beam_steps_per_pass"] == 1.0 and rows[0]["ops_per_pass"]["drafter forward"] == 0
    assert all(r["ops_per_pass"]["target forward"] > 0 and r["ops_per_pass"]["drafter forward"] > 0
               for r in (rows[1], rows[3]))


def test_profile_decode_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The decode profile on CPU: every row kind, the GEMMs attributed to their projections, c from the pair."""
    out = tmp_path / "profile.jsonl"
    run_main(ROOT / "scripts" / "profile_decode.py", ["--shape", "tiny", "--pair", "tiny", "--device", "cpu",
                                                         "--new", "3", "--prompt-len", "5", "--copy-mb", "8",
                                                         "--gamma", "2", "--out", str(out)], monkeypatch)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == ["peak", "draft", "decode", "profile"]
    assert not any("error" in r for r in rows)
    draft, decode, profile = rows[1:]
    assert decode["tok_per_s"] > 0 and 0 < decode["mbu_copy"] and decode["tok_per_s_with_prefill"] < decode["tok_per_s"]
    assert profile["gemms_attributed"] and {"qkv", "o", "gate_up", "down", "lm_head", "argmax"} <= set(profile["groups"])
    assert profile["groups"]["qkv"]["kernels"] == 2 and profile["groups"]["lm_head"]["kernels"] == 1  # 2 layers
    assert draft["c"] > 0 and draft["draft_groups"]["lm_head"]["kernels"] == 2  # γ = 2 chained drafter forwards
    assert "tiny / auto" in capsys.readouterr().err  # the table was printed
    run_main(ROOT / "scripts" / "profile_tables.py", [str(out)], monkeypatch)  # the Markdown of those rows
    text = capsys.readouterr().out
    assert "| tiny | auto | " in text and "| qkv | " in text and f"| {draft['c']:.3f} |" in text


def test_profile_engine_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The engine-vs-bare profile on CPU: structure only (no device timeline there, said so), both γ."""
    out = tmp_path / "engine_profile.jsonl"
    run_main(ROOT / "scripts" / "profile_engine.py", ["--shape", "tiny", "--device", "cpu", "--new", "13", "--steps",
                                                        "3", "--prompt-len", "6", "--gammas", "0", "2", "--torch-tail",
                                                        "--out", str(out)], monkeypatch)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = ("bare", "engine", "diff", "engine_torch_tail")
    assert [(r["case"], r["gamma"]) for r in rows] == [(c, g) for g in (0, 2) for c in cases]
    for bare, engine, diff, old in (rows[:4], rows[4:]):
        assert old["tokens_per_step"] == engine["tokens_per_step"] and old["phase_steps"] == 3
        assert bare["timeline"] is None and "no CUDA device" in bare["timeline_why"] and engine["timeline"] is None
        assert bare["wall_us"] > 0 and engine["wall_us"] > 0 and engine["tokens_per_step"] >= 1
        assert engine["phase_steps"] == 3 and engine["phases_us"]["step"] >= engine["phases_us"]["MODEL verify"]
        assert {"commit", "step_shape", "admit", "MODEL draft"} <= set(engine["phases_us"])
        assert diff["wall_us"] == pytest.approx(engine["wall_us"] - bare["wall_us"], abs=0.11)
        for key in ("request", "request_gc_frozen"):  # whole requests, with the collections counted
            assert engine[key]["tokens"] == 13 - 1 and len(engine[key]["gc_collections"]) == 3
        host = engine["host_us"]  # the host window: the step's calls, no graph launches on CPU
        assert host["step"] >= host["StepRecord.unpack"] > 0 and host["policy.choose"] > 0
        assert "CUDAGraph.replay (launch)" not in host and host["host_outside_the_wait"] <= host["step"]
    assert rows[5]["phases_us"]["MODEL draft"] > rows[1]["phases_us"]["MODEL draft"]  # γ = 2 drafts, γ = 0 does not
    # the Markdown of those rows, and of GPU-shaped rows (a timeline made from a hand-made trace)
    from specdec.bench.timeline import added_events, summarize

    def trace(extra: bool):
        ev = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 2.0, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 3.0, "dur": 40.0, "args": {"correlation": 1}}]
        if extra:
            ev += [{"ph": "X", "cat": "kernel", "name": "commit", "ts": 44.0, "dur": 2.0, "args": {"correlation": 1}},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 46.0, "dur": 9.0,
                    "args": {"correlation": 2}},
                   {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 50.0, "dur": 1.0, "args": {"correlation": 2}}]
        return summarize(ev, steps=1)

    bare_t, engine_t = trace(False), trace(True)
    gpu = [{"row": "engine_profile", "case": "bare", "gamma": 9, "wall_us": 44.0, "timeline": bare_t.per_step()},
           {"row": "engine_profile", "case": "engine", "gamma": 9, "wall_us": 56.0, "timeline": engine_t.per_step(),
            "phases_us": {"step": 55.0}, "phase_steps": 1},
           {"row": "engine_profile", "case": "diff", "gamma": 9, "wall_us": 12.0, "busy_us": 3.0, "idle_us": 9.0,
            "added_device_events": added_events(bare_t, engine_t)},
           {"row": "argmax", "vocab": 128, "positions": 1, "torch_argmax_and_invalid_scores_us": 9.0,
            "torch_argmax_us": 5.0, "greedy_tokens_us": 2.0}]
    with open(out, "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in gpu))
    capsys.readouterr()
    run_main(ROOT / "scripts" / "profile_tables.py", [str(out)], monkeypatch)
    text = capsys.readouterr().out
    assert "**γ = 0**" in text and "**γ = 2**" in text and "| engine_torch_tail | " in text
    assert "| engine | 56.0 | 43.0 | 12.0 | 4.0 | 42.0 | 2.0 | 1.00 | 1.0 (1.00) | 9 (1) |" in text and "- 1 × `commit`: 2.0 µs" in text
    assert "| [1, 1, 128] | 9.0 | 5.0 | 2.0 |" in text


def test_profile_decode_attributes_gpu_kernels_by_order():
    """cuBLAS / Triton kernel names of a 1-layer step map to their projections; a split-K reduce joins its GEMM;
    a GEMM count that does not fit the layers is reported as unattributed, not guessed."""
    namespace = runpy.run_path(str(ROOT / "scripts" / "profile_decode.py"), run_name="scripts_smoke")
    kernel = namespace["Kernel"]
    names = ["void at::native::index_select_kernel", "add_rms_norm_kernel", "nvjet_hsh_64x8_splitK",
             "void cublasLt::splitKreduce_kernel<float>", "rope_cache_kernel", "_split_attention", "_combine",
             "_linear_kernel", "add_rms_norm_kernel", "sm90_xmma_gemm_bf16bf16", "silu_mul_kernel",
             "gemv2T_kernel_val", "add_rms_norm_kernel", "_linear_kernel",
             "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
             "Memcpy DtoD (Device -> Device)", "void at::native::vectorized_elementwise_kernel<4>",
             "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"]  # (not RoPE's roll)
    assert namespace["role_of"]("mkldnn::_linear_pointwise") == "gemm"  # the CPU GEMMs on oneDNN's packed weights
    kernels = [kernel(n, float(i), 1.0) for i, n in enumerate(names)]
    groups, matched = namespace["attribute"](kernels, 1)
    assert matched and groups == ["embedding", "norm", "qkv", "qkv", "rope_kv_write", "attention", "attention", "o",
                                  "norm", "gate_up", "activation", "down", "norm", "lm_head", "argmax", "memcpy",
                                  "other", "other"]
    groups, matched = namespace["attribute"](kernels, 2)
    assert not matched and groups[2] == "gemm (unattributed)"


def test_bench_paged_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The paged-vs-static benchmark's own code on a tiny random shape (CPU): both layouts' rows, the same tokens,
    the long-context engine serving its requests from the pool."""
    out = tmp_path / "paged.json"
    run_main(ROOT / "scripts" / "bench_paged.py", ["--device", "cpu", "--tiny", "--batch", "1", "4", "--new", "6",
                                                   "--repeats", "1", "--ab-seq-len", "256", "--fit-seq-len", "1024",
                                                   "--fit-batch", "4", "--long", "1", "--long-prompt", "600",
                                                   "--short-prompt", "40", "--fit-new", "4", "--fraction", "0.001",
                                                   "--out", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    ab = [r for r in rows if r["what"] == "plain decode tok/s"]
    assert [r["batch"] for r in ab] == [1, 4]
    assert all(r["paged_same_tokens"] and r["paged+prefix_same_tokens"] for r in ab)
    host = [r for r in rows if r["what"].startswith("host us per decode step")]
    assert [r["batch"] for r in host] == [1, 4] and all(r[arm] > 0 for r in host for arm in ("static", "paged"))
    served = next(r for r in rows if r["what"] == "concurrent requests at long context")
    assert served["all_finished"] and served["requests"] == 4


def test_bench_paged_prefix_arms_alone(tmp_path, monkeypatch):
    """The short run that re-measures prefix caching's cost: two arms, rotated rounds, the host row's mean and the
    prefix cache's own µs (only the prefix arm has one)."""
    out = tmp_path / "paged.json"
    run_main(ROOT / "scripts" / "bench_paged.py", ["--device", "cpu", "--tiny", "--batch", "2", "--new", "4",
                                                   "--repeats", "2", "--ab-seq-len", "256", "--skip-fit",
                                                   "--arms", "paged", "paged+prefix", "--host-steps", "16",
                                                   "--out", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    ab = next(r for r in rows if r["what"] == "plain decode tok/s")
    assert ab["paged+prefix_same_tokens"] and ab["prefix_vs_paged"] > 0 and "static" not in ab
    host = next(r for r in rows if r["what"].startswith("host us per decode step"))
    assert host["paged_mean"] > 0 and host["paged+prefix_mean"] > 0 and host["prefix_cache_us"] > 0


def test_host_overhead_prefix_ab(tmp_path, monkeypatch):
    out = tmp_path / "ab.json"
    run_main(ROOT / "scripts" / "host_overhead.py", ["--prefix-ab", "--sizes", "2", "--gammas", "0,2", "--steps",
                                                        "16", "--repeats", "1", "--json", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    assert [(r["n"], r["gamma"]) for r in rows] == [(2, 0), (2, 2)]
    assert all(r["off_mean_us"] > 0 and r["on_mean_us"] > 0 and r["in_cache_us"] > 0 for r in rows)


def test_host_overhead_async_ab(tmp_path, monkeypatch):
    out = tmp_path / "async.json"
    run_main(ROOT / "scripts" / "host_overhead.py", ["--async-ab", "--sizes", "2", "--gammas", "0,2", "--steps", "6",
                                                        "--json", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    assert [(r["n"], r["gamma"]) for r in rows] == [(2, 0), (2, 2)]
    for row in rows:  # both arms timed; with async on every measured step ran ahead of the one before it
        assert all(row[arm]["period_us"] > 0 and row[arm]["busy_us"] > 0 for arm in ("off", "on"))
        assert row["on"]["ahead"] >= 6 and "ahead" not in row["off"]


def test_host_overhead_stub_async(tmp_path, monkeypatch):
    out = tmp_path / "stub.json"
    run_main(ROOT / "scripts" / "host_overhead.py", ["--stub", "--async-scheduling", "--sizes", "2", "--gammas", "2",
                                                        "--steps", "6", "--json", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    assert [(r["n"], r["gamma"]) for r in rows] == [(2, 2)] and rows[0]["us"]["host"] > 0


def test_bench_mixed_step_runs_on_a_tiny_model(tmp_path, monkeypatch):
    """The mixed-step benchmark's own code on a tiny random shape (CPU): every arm serves every request in full, the
    mixed arms run mixed steps, whole prefill's none, and the host-build row times both builders."""
    out = tmp_path / "mixed.json"
    run_main(ROOT / "scripts" / "bench_mixed_step.py", ["--shape", "tiny", "--requests", "8", "--slots", "3",
                                                         "--prompt", "16", "60", "--new", "8", "--host-rows", "4",
                                                         "--host-repeats", "1", "--out", str(out)], monkeypatch)
    rows = json.loads(out.read_text())
    traffic = [r for r in rows if r["what"] == "traffic"]
    assert len(traffic) == 6 and len({r["generated"] for r in traffic}) == 1 and traffic[0]["generated"] > 0
    assert all((r["mixed_steps"] > 0) == r["arm"].startswith("mixed") for r in traffic)  # (mixed, mixed_eager)
    host = next(r for r in rows if r["what"] == "host build ms")
    assert host["mixed_batch_ms"] > 0 and host["from_rows_ms"] > 0
