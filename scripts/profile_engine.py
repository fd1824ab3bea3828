"""Where the engine's decode step goes beyond the model's own graph step: the two side by side, itemised.

    python scripts/profile_engine.py --out $OUT/engine_profile.jsonl                  # GPU: 8B, γ 0 and 4 (~2 min)
    python scripts/profile_engine.py --shape tiny --device cpu --new 12 --steps 3     # CPU smoke: structure only

A random bf16 Llama of `--shape` (8B: scripts/tp_probe.py's shapes) and, for γ > 0, a drafter of the zoo pair's
draft shape (2 layers, dim 256; the target's vocabulary) decode one 128-token prompt at batch 1, greedy, two ways:

  "bare"    the model's own step captured in one CUDA graph and replayed back to back: γ chained drafter forwards
            (argmax feeding the next), the target's forward of the γ + 1 tokens, the argmax; both caches advance one
            position (the kernel work a step committing one token cannot avoid; γ = 0: plain decoding)
  "engine"  the same models through `specdec.engine.Engine` (its CUDA graphs, its one device → host read per step,
            its host bookkeeping), `num_draft_tokens` = γ fixed

For each: wall µs per step (host clock over `--steps` steps, unprofiled) and tokens per step; then one window of
`--steps` steps under torch.profiler's CUDA activity (`specdec.bench.timeline`): GPU busy / idle µs per step, graph
launches, the kernels that ran OUTSIDE any graph (name, count, µs), copies, the host calls that wait (syncs) and
every CUDA call's host µs, the largest idle gaps and what they sit between. The engine adds its phases
(`specdec.engine.profile.phase_timer`; the model bodies timed between device syncs, so those steps run slower —
a separate window), and a host window without added syncs: µs per step of the graph launches
(`CUDAGraph.replay`'s host side), the step's clock (its wait for the device), the table's read, the policy, the
statistics; the bare row gives `graph.replay()`'s host µs issued after a sync and while the device is busy. A "diff" row per γ itemises engine − bare: wall, busy, idle, kernel time, kernels, and the
device events the engine runs beyond the bare step. Each engine row also times whole requests as BENCHMARKS' figures were taken (decode from the first token to
the last; "request") and the same with the heap frozen first ("request_gc_frozen": `gc.collect(); gc.freeze()`),
with Python's garbage collections counted in every window (a full collection of a heap holding torch and the
captured graphs pauses the process for 0.1-0.7 s: spread over a 128-token request, ~1 ms per token).
`--torch-tail` adds an "engine_torch_tail" row: the engine with
its greedy verify as before `fast.kernels.argmax` / `engine.greedy_commit` (torch.argmax, the NaN check and ~70
small torch launches), the A/B of those kernels in one process. Rows are JSON lines on stdout and appended to `--out`.

On CPU there is no device timeline: the rows carry "timeline": null with the reason, and the CPU test checks the
structure only. An "argmax" row (CUDA) times the greedy verify's scoring: torch.argmax + the NaN check against
`fast.kernels.argmax.greedy_tokens` (the engine's since), and torch.argmax alone (the bare step's).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_probe import SHAPES, llama_shape  # noqa: E402

from specdec.bench.report import append_json_line  # noqa: E402
from specdec.bench.timeline import added_events, device_trace  # noqa: E402

ZOO_DRAFT = {"n_layers": 2, "dim": 256, "n_heads": 4, "n_kv_heads": 4, "head_dim": 64, "intermediate_size": 704}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def draft_shape(target_shape, tiny: bool):
    """The zoo pair's drafter shape with the target's vocabulary (tiny: the tiny draft shape)."""
    import dataclasses

    if tiny:
        return dataclasses.replace(llama_shape("tiny-draft"), vocab_size=target_shape.vocab_size)
    return dataclasses.replace(target_shape, tie_word_embeddings=True, **ZOO_DRAFT)


class BareStep:
    """The model's own step for γ (module doc), eager or captured in one CUDA graph; `tokens [1, 1]` is the input
    and receives the committed token."""

    def __init__(self, target, drafter, gamma: int, prompt: list[int], slots: int, graphs: bool):
        from specdec.fast.graphs import CapturedStep

        device = target.device
        self.cache = target.new_cache(1, slots)
        self.draft_cache = drafter.new_cache(1, slots) if gamma else None
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            self.tokens = target(ids, self.cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
            if gamma:
                drafter(ids, self.draft_cache, last_only=True)

        def step():
            block = self.tokens
            if gamma:
                token, drafts = self.tokens, [self.tokens]
                for _ in range(gamma):
                    token = drafter(token, self.draft_cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
                    drafts.append(token)
                self.draft_cache.lengths.sub_(gamma - 1)
                block = torch.cat(drafts, 1)
            logits = target(block, self.cache)  # [1, γ+1, V]
            best = logits.argmax(-1)  # what verification compares the drafts with
            if gamma:
                self.cache.lengths.sub_(gamma)
            self.tokens.copy_(best[:, :1])
            return self.tokens

        self.step = step
        restore = [self.cache.lengths, self.tokens] + ([self.draft_cache.lengths] if gamma else [])
        self.graph = CapturedStep(step, restore=restore) if graphs else None

    def run(self) -> None:
        with torch.no_grad():
            self.graph.replay() if self.graph is not None else self.step()


def timed_steps(run, steps: int, device) -> float:
    """µs per call of `run` over `steps` calls in a row (host clock, device drained before and after)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        run()
    sync(device)
    return (time.perf_counter() - start) / steps * 1e6


def traced(run, steps: int, device) -> tuple[dict | None, str | None, object]:
    with device_trace(steps, cuda=device.type == "cuda") as trace:
        for _ in range(steps):
            run()
    summary = trace.summary
    return (summary.per_step() if summary else None), trace.why_none, summary


def bare_row(args, target, drafter, gamma: int, prompt, device) -> tuple[dict, object]:
    step = BareStep(target, drafter, gamma, prompt, args.prompt_len + args.new + 16,  # the engine's cache size
                    graphs=device.type == "cuda")
    step.run()
    wall = timed_steps(step.run, args.steps, device)
    timeline, why, summary = traced(step.run, args.steps, device)
    row = {"row": "engine_profile", "case": "bare", "gamma": gamma, "wall_us": round(wall, 1),
           "tokens_per_step": 1.0, "timeline": timeline, **bare_launch(step, device)}
    if why:
        row["timeline_why"] = why
    return row, summary


class EngineRun:
    """One request through the engine, stepped by hand: `step()` returns the tokens it committed."""

    def __init__(self, engine, prompt, params):
        self.engine, self.produced = engine, 0
        engine.add_request(prompt, params)
        while engine.has_unfinished() and not self.produced:  # admission + the first token
            self.step()
        self.produced = 0

    def step(self) -> None:
        for out in self.engine.step():
            self.produced += len(out.new_token_ids)

    def drain(self) -> None:
        while self.engine.has_unfinished():
            self.engine.step()


class GcWatch:
    """Python's garbage collections while the context lasts: count and pause ms per generation (`gc.callbacks`)."""

    def __enter__(self):
        self.count, self.ms, self._start = [0, 0, 0], [0.0, 0.0, 0.0], 0.0
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.ms[info["generation"]] += (time.perf_counter() - self._start) * 1e3

    def report(self) -> dict:
        return {"gc_collections": self.count, "gc_ms": [round(v, 2) for v in self.ms]}


def host_breakdown(engine, run, steps: int) -> dict:
    """Median host µs per step (no device syncs added: the step as it runs) of the engine's step and the calls
    inside it: the graph launches (`CUDAGraph.replay`, host side only), the step's clock (event marks; `elapsed`
    holds the step's one wait for the device), the table's read (`StepRecord.unpack`), the policy, the statistics
    fold, and the engine's phases. Without CUDA graphs (CPU) "replay" stays empty."""
    from specdec.engine.profile import phase_timer
    from specdec.metrics import Clock, SpecStats
    from specdec.step import StepRecord

    per_step: dict[str, list[float]] = {}
    with phase_timer(engine) as timer:
        timer.wrap(engine, "step", "step")
        timer.wrap(engine.policy, "choose", "policy.choose")
        timer.wrap(engine.policy, "record_step", "policy.record_step")
        timer.wrap(StepRecord, "unpack", "StepRecord.unpack")
        timer.wrap(Clock, "mark", "Clock.mark")
        timer.wrap(Clock, "elapsed", "Clock.elapsed (the wait)")
        timer.wrap(SpecStats, "add_step", "SpecStats.add_step")
        if torch.cuda.is_available():
            timer.wrap(torch.cuda.CUDAGraph, "replay", "CUDAGraph.replay (launch)")
        for _ in range(steps):
            if not engine.has_unfinished():
                break
            timer.clear()
            run.step()
            for name in set(timer.seconds) | {"step"}:
                per_step.setdefault(name, []).append(timer.seconds.get(name, 0.0) * 1e6)
    out = {name: round(statistics.median(v), 1) for name, v in sorted(per_step.items())}
    wait = out.get("Clock.elapsed (the wait)", 0.0)
    out["host_outside_the_wait"] = round(out.get("step", 0.0) - wait, 1)
    return out


def bare_launch(step, device, reps: int = 16) -> dict:
    """Host µs of one `graph.replay()` call of the bare step: issued with the device idle (after a sync, as the
    engine issues its step) and issued while the device is busy (back to back, as the bare loop does)."""
    if step.graph is None:
        return {}
    idle, busy = [], []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        step.run()
        idle.append((time.perf_counter() - start) * 1e6)
        start = time.perf_counter()
        step.run()
        busy.append((time.perf_counter() - start) * 1e6)
    sync(device)
    return {"launch_after_sync_us": round(statistics.median(idle), 1),
            "launch_while_busy_us": round(statistics.median(busy), 1)}


def request_timing(engine, prompt, params, device, frozen: bool) -> dict:
    """One whole request, decode timed from its first token to its last (as scripts/tp_probe.py's `decode`, the
    figure BENCHMARKS quotes), with the collections that fell inside; `frozen`: the heap frozen first
    (`gc.collect(); gc.freeze()`, what `specdec serve` does after its warm-up), unfrozen after."""
    if frozen:
        gc.collect()
        gc.freeze()
    try:
        run = EngineRun(engine, prompt, params)
        with GcWatch() as watch:
            sync(device)
            start, steps = time.perf_counter(), 0
            while engine.has_unfinished():
                run.step()
                steps += 1
            sync(device)
            seconds = time.perf_counter() - start
    finally:
        if frozen:
            gc.unfreeze()
    return {"tok_per_s": round(run.produced / seconds, 2), "us_per_step": round(seconds / max(steps, 1) * 1e6, 1),
            "steps": steps, "tokens": run.produced, **watch.report()}


@contextmanager
def torch_tail():
    """The engine's greedy verify and greedy drafts as they were before `fast.kernels.argmax` and
    `engine.greedy_commit`: torch.argmax, the NaN check and the torch commit sequence (the A/B row
    "engine_torch_tail")."""
    from specdec.engine import drafters, step_runner
    from specdec.fast.kernels.argmax import greedy_tokens

    saved = step_runner.greedy_tokens, step_runner.greedy_commit_covers, drafters.argmax
    step_runner.greedy_tokens = lambda logits: greedy_tokens(logits, kernel="reference")
    step_runner.greedy_commit_covers = lambda *args: False
    drafters.argmax = lambda logits: logits.argmax(-1)
    try:
        yield
    finally:
        step_runner.greedy_tokens, step_runner.greedy_commit_covers, drafters.argmax = saved


def engine_row(args, target, drafter, gamma: int, prompt, device, case: str = "engine") -> tuple[dict, object]:
    from specdec.engine import Engine, EngineConfig
    from specdec.engine.profile import phase_timer
    from specdec.request import SamplingParams

    config = EngineConfig(max_batch_size=1, max_seq_len=args.prompt_len + args.new + 16, num_draft_tokens=gamma,
                          max_draft_tokens=max(gamma, 1))
    params = SamplingParams(temperature=0, max_new_tokens=args.new, seed=1234)
    engine = Engine(target, drafter if gamma else None, config)
    EngineRun(engine, prompt, params).drain()  # captures the graphs of every step shape this request meets
    run = EngineRun(engine, prompt, params)
    with GcWatch() as timed_gc:
        wall = timed_steps(run.step, args.steps, device)
    tokens_per_step = run.produced / args.steps
    with GcWatch() as traced_gc:
        timeline, why, summary = traced(run.step, args.steps, device)
    phases: dict[str, list[float]] = {}
    bodies = ("MODEL verify", "MODEL draft")
    with phase_timer(engine, bodies=True, synchronize=bodies) as timer:
        timer.wrap(engine, "step", "step")
        for _ in range(args.steps):
            if not engine.has_unfinished():
                break
            timer.clear()
            run.step()
            for name, seconds in timer.seconds.items():
                phases.setdefault(name, []).append(seconds * 1e6)
    host = host_breakdown(engine, run, args.steps)
    run.drain()
    requests = {"request": request_timing(engine, prompt, params, device, frozen=False),
                "request_gc_frozen": request_timing(engine, prompt, params, device, frozen=True)}
    median = {name: round(statistics.median(v), 1) for name, v in sorted(phases.items())}
    row = {"row": "engine_profile", "case": case, "gamma": gamma, "wall_us": round(wall, 1),
           "tokens_per_step": round(tokens_per_step, 3), "timeline": timeline,
           "phases_us": median, "phase_steps": len(phases.get("step", [])),
           "phases_outside_bodies_us": round(median.get("step", 0.0) - sum(median.get(b, 0.0) for b in bodies), 1),
           "timed_window_gc": timed_gc.report(), "traced_window_gc": traced_gc.report(), "host_us": host, **requests}
    if why:
        row["timeline_why"] = why
    del engine
    gc.collect()
    return row, summary


def diff_row(gamma: int, bare: dict, bare_summary, engine: dict, engine_summary) -> dict:
    row = {"row": "engine_profile", "case": "diff", "gamma": gamma,
           "wall_us": round(engine["wall_us"] - bare["wall_us"], 1)}
    if bare["timeline"] and engine["timeline"]:
        for key in ("busy_us", "idle_us", "idle_between_launches_us", "kernel_us", "kernels", "graph_launches",
                    "outside_graph_us", "outside_graph_events"):
            row[key] = round(engine["timeline"][key] - bare["timeline"][key], 2)
        row["added_device_events"] = added_events(bare_summary, engine_summary)
    return row


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        t = r.get("timeline") or {}
        head = f"γ={r['gamma']} {r['case']:<6} wall {r['wall_us']:8.1f} µs"
        if r["case"] == "diff":
            print(f"{head}  busy {r.get('busy_us', '–')}  idle {r.get('idle_us', '–')}  kernels "
                  f"{r.get('kernels', '–')} ({r.get('kernel_us', '–')} µs)  outside graphs {r.get('outside_graph_us', '–')} µs",
                  file=sys.stderr)
            for e in r.get("added_device_events", []):
                print(f"      + {e['count']:6.2f} × {e['name'][:70]:<70} {e['us']:8.2f} µs", file=sys.stderr)
            continue
        print(f"{head}  busy {t.get('busy_us', '–')}  idle {t.get('idle_us', '–')}  kernels {t.get('kernels', '–')}  "
              f"graph launches {t.get('graph_launches', '–')}  outside graphs {t.get('outside_graph_us', '–')} µs",
              file=sys.stderr)
        for key in ("outside_graph", "copies", "syncs", "largest_gaps"):
            for e in (t.get(key) or [])[:5]:
                print(f"      {key}: {json.dumps(e)[:140]}", file=sys.stderr)
        if "phases_us" in r:
            print(f"      phases: {r['phases_us']}", file=sys.stderr)
        if "host_us" in r:
            print(f"      host µs per step: {json.dumps(r['host_us'])}", file=sys.stderr)
        if "launch_after_sync_us" in r:
            print(f"      graph.replay host µs: after a sync {r['launch_after_sync_us']}, while busy "
                  f"{r['launch_while_busy_us']}", file=sys.stderr)
        for key in ("request", "request_gc_frozen"):
            if key in r:
                print(f"      {key}: {json.dumps(r[key])}", file=sys.stderr)


def argmax_rows(vocab: int, device) -> list[dict]:
    """µs per call, from a CUDA graph (`fast.graphs.graph_time_us`), of the greedy step's scoring at `[1, k, V]` fp32
    logits: torch.argmax + `core.invalid_scores` (the verify pass before `fast.kernels.argmax`), torch.argmax alone
    (the bare step's), and `greedy_tokens` (both in two launches). CUDA only."""
    if device.type != "cuda":
        return []
    from specdec.core import invalid_scores
    from specdec.fast.graphs import graph_time_us
    from specdec.fast.kernels.argmax import greedy_tokens

    rows = []
    for k in (1, 5):
        logits = torch.randn(1, k, vocab, device=device)
        row = {"row": "argmax", "vocab": vocab, "positions": k}
        for name, fn in (("torch_argmax_and_invalid_scores", lambda: (logits.argmax(-1), invalid_scores(logits))),
                         ("torch_argmax", lambda: logits.argmax(-1)),
                         ("greedy_tokens", lambda: greedy_tokens(logits))):
            row[f"{name}_us"] = round(graph_time_us(fn, calls=20, reps=10), 2)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--gammas", type=int, nargs="+", default=[0, 4], help="γ per pair of rows (0 = plain)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128, help="max_new_tokens of the engine's request")
    ap.add_argument("--steps", type=int, default=24, help="steps per window (timed, traced, phases, host)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--torch-tail", action="store_true",
                    help="also run the engine with the greedy verify's torch tail (before the fused kernels): an A/B")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON rows to this file")
    args = ap.parse_args(argv)
    for opt in ("prompt_len", "new", "steps"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1")
    if any(g < 0 or g > 8 for g in args.gammas):
        ap.error(f"--gammas must be in [0, 8], got {args.gammas}")
    if args.new < 4 * args.steps + 1:
        ap.error(f"--new {args.new} must be >= 4 × --steps + 1 = {4 * args.steps + 1} (four windows of steps)")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (use --device cpu for the smoke run)")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from specdec.fast.model import FastLlama

    shape = llama_shape(args.shape)
    target = FastLlama.random(shape, device=device, dtype=dtype, seed=0)
    drafter = None
    if any(args.gammas):
        drafter = FastLlama.random(draft_shape(shape, args.shape.startswith("tiny")), device=device, dtype=dtype,
                                   seed=1)
    prompt = [(7 * j) % min(1000, shape.vocab_size - 5) + 5 for j in range(args.prompt_len)]
    base = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "shape": args.shape, "prompt_len": args.prompt_len}

    def emit(row: dict) -> None:
        print(append_json_line({**base, **row}, args.out), flush=True)

    try:
        for row in argmax_rows(shape.vocab_size, device):
            emit(row)
            print(f"argmax [1, {row['positions']}, {row['vocab']}]: {row}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001
        emit({"row": "argmax", "error": f"{type(exc).__name__}: {exc}"[:400]})
    for gamma in args.gammas:
        rows = []
        try:
            bare, bare_summary = bare_row(args, target, drafter, gamma, prompt, device)
            emit(bare)
            engine, engine_summary = engine_row(args, target, drafter, gamma, prompt, device)
            emit(engine)
            rows = [bare, engine, diff_row(gamma, bare, bare_summary, engine, engine_summary)]
            emit(rows[-1])
            if args.torch_tail:
                with torch_tail():
                    old, _ = engine_row(args, target, drafter, gamma, prompt, device, case="engine_torch_tail")
                emit(old)
                rows.append(old)
        except Exception as exc:  # noqa: BLE001 - one γ failing leaves the other's rows
            emit({"row": "engine_profile", "gamma": gamma, "error": f"{type(exc).__name__}: {exc}"[:400]})
        print_rows(rows)
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
