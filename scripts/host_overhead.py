"""Host (Python) work per engine step, isolated on CPU: a tiny random Llama pair, n concurrent requests.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python scripts/host_overhead.py [--sizes 1,8,64] [--gammas 0,4]
        [--steps 40] [--repeats 1] [--temperature 0] [--stub] [--churn] [--prefix-ab] [--async-ab] [--async-scheduling] [--json out.json]

Per step it measures the whole `Engine.step()` wall time and the time inside the model bodies (the drafter's
proposal and the verify pass — on a GPU these are graph replays); the rest is host work, which is split
further by timing the engine's phases (`specdec.engine.profile`: admit, catch-up, commit, ...) and the policy. Requests are long enough
not to finish inside the measured window (steady state: no admission, no churn); a second pass with short
requests (`churn`) times steps in which requests finish and new ones are admitted (prefill excluded).
`--stub` replaces the model bodies by a replay of one real step's output (the engine's state on the device then
stands still, its host bookkeeping runs as usual): the step time is then host work alone, free of the noise of
the forwards on a shared CPU; with `--device cuda` it includes the step's device→host transfer and the graph
launches. Prints µs per step (medians over steps).
`--prefix-ab` (stub bodies, paged pool): prefix caching off vs on over distinct prompts that share nothing, the two
engines' steps interleaved (`--repeats` rounds of `--steps`), each step timed by the thread's CPU clock (the time
another process holds the core is not counted: a loaded shared machine still gives the host work) — mean and median
µs per step of each arm, and the µs per step spent inside the prefix cache's own methods (`bench.chat`'s timer).
Steps span whole blocks (`--steps` a multiple of the block size), so the steps at which rows cross a block
boundary — every row at once when they run in lockstep — count in the mean as in a throughput.
`--stub --async-scheduling`: the same host-only steps with async scheduling on (its launch stubbed as well).
`--async-ab` (real bodies; `--device cuda` is the point): async scheduling off vs on (`EngineConfig.async_scheduling`,
fixed γ, the decode graphs warmed up first), `--steps` steady-state steps each: per step the period (wall clock over
the window / steps), the host µs (each `step()` call less the time it waited on a CUDA event for the device), the
device's busy µs (CUDA events around each step's draft + verify launch) and the device's idle µs per step (period −
busy), and with async on the share of steps launched ahead of the previous step's read.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import transformers

from specdec.bench.chat import time_prefix_cache  # (bench_paged imports it from here)
from specdec.engine import Engine, EngineConfig
from specdec.engine import step_runner as step_runner_module
from specdec.engine.profile import phase_timer
from specdec.request import SamplingParams


def _llama(seed: int, layers: int, positions: int = 1024) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions)
    return transformers.LlamaForCausalLM(cfg).eval()


def _stub_bodies(engine: Engine, real: list | None = None):
    """Each step shape runs for real once; later steps of that shape replay its verify output, no model work.
    real: a one-element count of the real runs, bumped at each (a step that ran one is no host-only step)."""
    runner = step_runner_module.StepRunner
    saved = runner.draft, runner.verify, runner.launch_verify

    def draft(self):
        if not hasattr(self, "_stub") and not hasattr(self, "_stub_device"):
            saved[0](self)

    def verify(self):
        if not hasattr(self, "_stub"):
            self._stub = saved[1](self)
            if real is not None:
                real[0] += 1
        return self._stub

    def launch_verify(self):  # (async scheduling's launch: the first run's table, kept on the device)
        if not hasattr(self, "_stub_device"):
            self._stub_device = saved[2](self).clone()
            if real is not None:
                real[0] += 1
        return self._stub_device

    runner.draft, runner.verify, runner.launch_verify = draft, verify, launch_verify
    return lambda: (setattr(runner, "draft", saved[0]), setattr(runner, "verify", saved[1]),
                    setattr(runner, "launch_verify", saved[2]))


def measure_stub(target, draft, n: int, gamma: int, steps: int, temperature: float,
                 async_scheduling: bool = False) -> dict:
    config = EngineConfig(max_batch_size=max(n, 1), max_seq_len=1024, num_draft_tokens=gamma, max_draft_tokens=8,
                          async_scheduling=async_scheduling)
    engine = Engine(target, draft if gamma else None, config)
    for i in range(n):
        engine.add_request([(3 * i + j) % 60 + 1 for j in range(8)],
                           SamplingParams(temperature=temperature, max_new_tokens=900, seed=i))
    host = stub_step_us(engine, steps, warm=3)
    return {"n": n, "gamma": gamma, "stub": True, "us": {"total": host, "model": 0.0, "host": host}}


def stub_step_us(engine: Engine, steps: int, warm: int, clock=time.perf_counter, stat=statistics.median) -> float:
    """`stat` (median) µs of `engine.step()` over `steps` steps with stub bodies, after `warm` real steps (each
    shape's first run is real; the stub replays it). clock: `time.thread_time` counts the host's CPU work alone."""
    return stat(stub_step_times(engine, steps, warm, clock)) * 1e6


def stub_step_times(engine: Engine, steps: int, warm: int, clock=time.perf_counter) -> list[float]:
    """Seconds of each of `steps` stub-body steps (`stub_step_us`), leaving out those that ran a step shape for real
    (its first run: the stub replays it after; a row's length crossing into a new positions bucket is a new shape)."""
    for _ in range(warm):
        engine.step()
    real = [0]
    restore = _stub_bodies(engine, real)
    times = []
    try:
        for _ in range(steps):
            ran = real[0]
            start = clock()
            engine.step()
            elapsed = clock() - start
            if real[0] == ran:
                times.append(elapsed)
    finally:
        restore()
    if not times:
        raise RuntimeError(f"every one of {steps} stub steps ran its shape for real: no host-only step to time")
    return times


def prefix_ab(target, draft, n: int, gamma: int, steps: int, repeats: int) -> dict:
    """Prefix caching off vs on, paged pool, stub bodies, `n` rows of distinct random prompts (nothing shared),
    interleaved rounds → per arm the mean and median CPU µs per step (thread clock; min over rounds) and, for "on",
    the µs per step inside the prefix cache's methods."""
    engines = {}
    new = (repeats + 1) * steps * (gamma + 1) + 40  # (the stub never finishes a row: room for every step's tokens)
    if new + 64 > target.config.max_position_embeddings:
        raise ValueError(f"--steps {steps} × --repeats {repeats} at γ {gamma} may run rows to {new + 64} positions, "
                         f"past the models' {target.config.max_position_embeddings}: fewer steps or repeats")
    for arm in ("off", "on"):
        config = EngineConfig(max_batch_size=max(n, 1), max_seq_len=new + 64, num_draft_tokens=gamma,
                              max_draft_tokens=8, kv_layout="paged", enable_prefix_caching=arm == "on")
        engine = engines[arm] = Engine(target, draft if gamma else None, config)
        for i in range(n):
            rng = random.Random(1000 + i)
            engine.add_request([rng.randrange(1, 60) for _ in range(24)],
                               SamplingParams(temperature=0, max_new_tokens=new, seed=i))
        for _ in range(3):  # (admission and prefill, each shape's first real run)
            engine.step()
    spent = time_prefix_cache(engines["on"].prefix_cache)
    rounds: dict = {arm: [] for arm in engines}
    cache_us = []
    for _ in range(repeats):
        for arm, engine in engines.items():
            before = spent[0]
            times = stub_step_times(engine, steps, warm=0, clock=time.thread_time)
            rounds[arm].append((statistics.mean(times) * 1e6, statistics.median(times) * 1e6))
            if arm == "on":
                cache_us.append((spent[0] - before) / steps * 1e6)
    assert engines["on"].prefix_cache_hits == 0, "the A/B prompts share nothing"
    row = {"n": n, "gamma": gamma, "steps": steps, "repeats": repeats}
    for arm, values in rounds.items():
        row[f"{arm}_mean_us"] = round(min(v[0] for v in values), 1)
        row[f"{arm}_median_us"] = round(min(v[1] for v in values), 1)
    row["on_minus_off_mean_us"] = round(row["on_mean_us"] - row["off_mean_us"], 1)
    row["in_cache_us"] = round(min(cache_us), 1)  # (wall clock inside its methods: min over rounds)
    return row


def measure(target, draft, n: int, gamma: int, steps: int, temperature: float, churn: bool) -> dict:
    config = EngineConfig(max_batch_size=max(n, 1), max_seq_len=1024, num_draft_tokens=gamma, max_draft_tokens=8)
    engine = Engine(target, draft if gamma else None, config)
    new = 6 if churn else steps + 20
    params = [SamplingParams(temperature=temperature, max_new_tokens=new + (i % 5 if churn else 0), seed=i)
              for i in range(n)]
    prompts = [[(3 * i + j) % 60 + 1 for j in range(8 + i % 7)] for i in range(n)]
    for p, sp in zip(prompts, params):
        engine.add_request(p, sp)
    for _ in range(3):  # warm-up (first runs of each shape)
        engine.step()
    rows = []
    with phase_timer(engine, bodies=True) as timers:  # the engine's phases and the model bodies
        timers.wrap(engine.policy, "choose", "policy.choose")
        timers.wrap(engine.policy, "record_step", "policy.record_step")
        timers.wrap(engine.policy, "record_row", "policy.record_row")
        extra = 0
        for _ in range(steps):
            if churn:  # keep the engine full: one new request per finished one
                while engine.num_running + engine.num_waiting < n:
                    engine.add_request(prompts[extra % n], params[extra % n])
                    extra += 1
            timers.clear()
            start = time.perf_counter()
            outs = engine.step()
            end = time.perf_counter()
            total = end - start
            parts = dict(timers.seconds)
            if "MODEL verify" in timers.spans:  # host time before the draft and after the verify body
                parts["pre-draft"] = timers.spans["MODEL draft"][0] - start
                parts["post-verify"] = end - timers.spans["MODEL verify"][1]
            model = parts.get("MODEL draft", 0.0) + parts.get("MODEL verify", 0.0)
            admit = parts.get("admit", 0.0)  # includes prefill (model work) when requests join
            rows.append({"total": total, "model": model, "host": total - model - (admit if churn else 0.0),
                         "outputs": len(outs), **parts})
    keys = sorted({k for r in rows for k in r if k not in ("outputs",)})
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) * 1e6 for k in keys}
    return {"n": n, "gamma": gamma, "churn": churn, "us": med}


def async_ab(target, draft, n: int, gamma: int, steps: int, temperature: float, device: str) -> dict:
    """Async scheduling off vs on at `n` rows and a fixed γ → {arm: period / host / busy / idle µs per step} (the
    module doc's `--async-ab`)."""
    cuda = device == "cuda"
    row = {"n": n, "gamma": gamma, "steps": steps}
    for arm in ("off", "on"):
        config = EngineConfig(max_batch_size=max(n, 1), max_seq_len=1024, num_draft_tokens=gamma, max_draft_tokens=8,
                              async_scheduling=arm == "on")
        engine = Engine(target, draft if gamma else None, config)
        if cuda:
            engine.warmup(batch_sizes=(max(n, 1),), gammas=[gamma], max_length=1024, temperatures=(temperature,))
        new = min(steps * (gamma + 1) + 40, 1024 - 24)
        for i in range(n):
            engine.add_request([(3 * i + j) % 60 + 1 for j in range(8)],
                               SamplingParams(temperature=temperature, max_new_tokens=new, seed=i))
        for _ in range(4):  # (admission, prefill, the first runs)
            engine.step()
        marks: list = []
        blocked = [0.0]
        restore = _time_device(engine, marks, blocked, cuda)
        hosts = []
        try:
            start = time.perf_counter()
            for _ in range(steps):
                began, waited = time.perf_counter(), blocked[0]
                engine.step()
                hosts.append(time.perf_counter() - began - (blocked[0] - waited))
            if cuda:
                torch.cuda.synchronize()
            period = (time.perf_counter() - start) / steps
        finally:
            restore()
        busy = [a.elapsed_time(b) / 1e3 for a, b in marks] if cuda else [b - a for a, b in marks]
        overlap = engine.overlap
        row[arm] = {"period_us": round(period * 1e6, 1), "host_us": round(statistics.median(hosts) * 1e6, 1),
                    "busy_us": round(statistics.mean(busy) * 1e6, 1) if busy else None,
                    "idle_us": round((period - statistics.mean(busy)) * 1e6, 1) if busy else None}
        if overlap is not None:
            row[arm]["ahead"] = overlap.ahead
            row[arm]["fallbacks"] = dict(overlap.synchronous_fallbacks)
    return row


def _time_device(engine: Engine, marks: list, blocked: list, cuda: bool):
    """Time each step's device work (CUDA events, or the host clock on CPU) around `Runner.run` / `Runner.launch`,
    and add the host's waits on CUDA events into `blocked[0]` → a function that undoes both."""
    runner = engine.runner
    clock = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None

    def timed(fn):
        def inner(step, shape=None):
            if cuda:
                a, b = clock(), clock()
                a.record()
                out = fn(step, shape)
                b.record()
                marks.append((a, b))
                return out
            a = time.perf_counter()
            out = fn(step, shape)
            marks.append((a, time.perf_counter()))
            return out
        return inner
    runner.run, runner.launch = timed(runner.run), timed(runner.launch)
    original = torch.cuda.Event.synchronize

    def synchronize(event):
        began = time.perf_counter()
        original(event)
        blocked[0] += time.perf_counter() - began
    torch.cuda.Event.synchronize = synchronize

    def restore():
        del runner.run, runner.launch
        torch.cuda.Event.synchronize = original
    return restore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,8,64")
    parser.add_argument("--gammas", default="0,4", help="comma-separated; \"auto\" = the engine's policy")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--churn", action="store_true", help="short requests: finishes and admissions every step")
    parser.add_argument("--device", default="cpu", help="cuda: the same on a GPU (graphs on; --stub recommended)")
    parser.add_argument("--stub", action="store_true", help="no model work: host time alone (see the doc)")
    parser.add_argument("--repeats", type=int, default=1, help="keep each number's minimum over repeats")
    parser.add_argument("--prefix-ab", action="store_true", help="prefix caching off vs on, nothing shared (doc)")
    parser.add_argument("--async-ab", action="store_true", help="async scheduling off vs on, real bodies (doc)")
    parser.add_argument("--async-scheduling", action="store_true", help="with --stub: the engines schedule async")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    positions = 16384 if args.prefix_ab else 1024  # (the A/B's rows never finish under the stub: room for them)
    target, draft = _llama(0, 2, positions).to(args.device), _llama(1, 1, positions).to(args.device)
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.prefix_ab:
        rows = []
        with torch.inference_mode():
            for gamma in gammas:
                for n in sizes:
                    rows.append(prefix_ab(target, draft, n, gamma, args.steps, args.repeats))
                    print(json.dumps(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.async_ab:
        rows = []
        with torch.inference_mode():
            for gamma in gammas:
                for n in sizes:
                    rows.append(async_ab(target, draft, n, gamma, args.steps, args.temperature, args.device))
                    print(json.dumps(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    best: dict = {}  # (γ, n) → per-part minimum over repeats of the per-step medians (a shared CPU drifts)
    with torch.inference_mode():
        for _ in range(args.repeats):
            for gamma in gammas:
                for n in sizes:
                    if args.stub:
                        r = measure_stub(target, draft, n, gamma, args.steps, args.temperature,
                                         args.async_scheduling)
                    else:
                        r = measure(target, draft, n, gamma, args.steps, args.temperature, args.churn)
                    kept = best.setdefault((gamma, n), r)
                    for k, v in r["us"].items():
                        kept["us"][k] = min(kept["us"].get(k, v), v)
    results = list(best.values())
    for r in results:
        us, n = r["us"], r["n"]
        parts = "  ".join(f"{k}={v:.0f}" for k, v in sorted(us.items()) if k not in ("total", "model", "host"))
        print(f"γ={r['gamma']} n={n:3d}: step {us['total']:7.0f} µs  model {us['model']:7.0f}  "
              f"host {us['host']:6.0f} µs ({us['host'] / max(n, 1):.1f}/row)  |  {parts}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
