"""Host (Python) work per engine step, isolated on CPU: a tiny random Llama pair, n concurrent requests.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python scripts/host_overhead.py [--sizes 1,8,64] [--gammas 0,4]
        [--steps 40] [--repeats 1] [--temperature 0] [--stub] [--churn] [--json out.json]

Per step it measures the whole `Engine.step()` wall time and the time inside the model bodies (the drafter's
proposal and the verify pass — on a GPU these are graph replays); the rest is host work, which is split
further by timing the engine's phases (`specdec.engine.profile`: admit, catch-up, commit, ...) and the policy. Requests are long enough
not to finish inside the measured window (steady state: no admission, no churn); a second pass with short
requests (`churn`) times steps in which requests finish and new ones are admitted (prefill excluded).
`--stub` replaces the model bodies by a replay of one real step's output (the engine's state on the device then
stands still, its host bookkeeping runs as usual): the step time is then host work alone, free of the noise of
the forwards on a shared CPU; with `--device cuda` it includes the step's device→host transfer and the graph
launches. Prints µs per step (medians over steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers

from specdec.engine import Engine, EngineConfig
from specdec.engine import step_runner as step_runner_module
from specdec.engine.profile import phase_timer
from specdec.request import SamplingParams


def _llama(seed: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return transformers.LlamaForCausalLM(cfg).eval()


def _stub_bodies(engine: Engine):
    """Each step shape runs for real once; later steps of that shape replay its verify output, no model work."""
    runner = step_runner_module.StepRunner
    saved = runner.draft, runner.verify

    def draft(self):
        if not hasattr(self, "_stub"):
            saved[0](self)

    def verify(self):
        if not hasattr(self, "_stub"):
            self._stub = saved[1](self)
        return self._stub

    runner.draft, runner.verify = draft, verify
    return lambda: (setattr(runner, "draft", saved[0]), setattr(runner, "verify", saved[1]))


def measure_stub(target, draft, n: int, gamma: int, steps: int, temperature: float) -> dict:
    config = EngineConfig(max_batch_size=max(n, 1), max_seq_len=1024, num_draft_tokens=gamma, max_draft_tokens=8)
    engine = Engine(target, draft if gamma else None, config)
    for i in range(n):
        engine.add_request([(3 * i + j) % 60 + 1 for j in range(8)],
                           SamplingParams(temperature=temperature, max_new_tokens=900, seed=i))
    host = stub_step_us(engine, steps, warm=3)
    return {"n": n, "gamma": gamma, "stub": True, "us": {"total": host, "model": 0.0, "host": host}}


def stub_step_us(engine: Engine, steps: int, warm: int) -> float:
    """Median µs of `engine.step()` over `steps` steps with stub bodies, after `warm` real steps (each shape's first
    run is real; the stub replays it)."""
    for _ in range(warm):
        engine.step()
    restore = _stub_bodies(engine)
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
    finally:
        restore()
    return statistics.median(times) * 1e6


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
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft = _llama(0, 2).to(args.device), _llama(1, 1).to(args.device)
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    best: dict = {}  # (γ, n) → per-part minimum over repeats of the per-step medians (a shared CPU drifts)
    with torch.inference_mode():
        for _ in range(args.repeats):
            for gamma in gammas:
                for n in sizes:
                    if args.stub:
                        r = measure_stub(target, draft, n, gamma, args.steps, args.temperature)
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
