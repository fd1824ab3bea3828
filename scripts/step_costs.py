"""Step costs of the engine per batch bucket: plain vs fixed γ vs "auto", zoo-`gpu`-shaped random pair.

    python scripts/step_costs.py --out step_costs.json [--alpha 0.75] [--sizes 1 8 64]
    python scripts/step_costs.py --out F.json --pair /tmp/pair [--head /tmp/pair/head] --data data/code  # trained pair

Each draft is accepted with probability --alpha (`EngineConfig.synthetic_acceptance`, BENCHMARK ONLY: the output
is not the target's law), so the policy sees a known acceptance on random weights. For N concurrent requests
(one prompt length per request, 30..520 tokens, 128 new tokens) and each arm, after an untimed run that captures
the graphs: tokens/s, the ratio to plain, wall / draft / verify ms per step, the steps the drafter was caught up,
the graphs captured during the timed run, and the γ the policy chose (histogram). Prints one line per row.
With --pair (a trained zoo pair, real acceptance, the held-in code prompts) the arms are plain, then γ=4 and
"auto" for the 2-layer drafter and (with --head) the feature head. Every row also splits the run's wall time:
admission (prefill, synchronized), the decode steps (p50 / p99 / max step wall), and the rest (the host loop).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch

from specdec.bench.presets import random_zoo_pair
from specdec.engine import Engine, EngineConfig
from specdec.engine.profile import phase_timer
from specdec.request import SamplingParams


def run(engine: Engine, prompts, params) -> dict:
    gammas = collections.Counter()
    step_walls = []
    graphs_before = engine.num_step_shapes
    engine.stats = type(engine.stats)()
    # the catch-up synchronized around it, to time it (the engine itself never waits there)
    choose = engine.policy.choose

    def counted(*args, **kwargs):  # the γ the policy picks, counted
        gamma = choose(*args, **kwargs)
        gammas[gamma] += 1
        return gamma

    engine.policy.choose = counted
    with phase_timer(engine, ("admit", "catch_up"), synchronize=("catch_up",)) as timer:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for p in prompts:
            engine.add_request(p, params)
        tokens = 0
        while engine.has_unfinished():
            t, before = time.perf_counter(), timer.seconds.get("admit", 0.0)
            tokens += sum(len(o.new_token_ids) for o in engine.step())
            step_walls.append(time.perf_counter() - t - (timer.seconds.get("admit", 0.0) - before))
        seconds = time.perf_counter() - start
    del engine.policy.choose  # back to the class's method
    admit_s = timer.seconds.get("admit", 0.0)
    walls = sorted(step_walls) or [0.0]
    st = engine.stats
    steps = max(st.num_steps, 1)
    return {"tok_s": tokens / seconds, "seconds": seconds, "steps": st.num_steps,
            "wall_ms_per_step": 1e3 * seconds / steps, "draft_ms_per_step": 1e3 * st.draft_time_s / steps,
            "verify_ms_per_step": 1e3 * st.verify_time_s / steps, "tau": st.mean_accepted_length,
            "catch_ups": timer.truthy.get("catch_up", 0), "catch_up_s": timer.seconds.get("catch_up", 0.0),
            "graphs_captured_in_run": engine.num_step_shapes - graphs_before,
            "gammas": dict(sorted(gammas.items())), "alpha": st.alpha,
            "admission_s": admit_s, "steps_s": sum(step_walls), "other_s": seconds - admit_s - sum(step_walls),
            "step_wall_ms_p50": 1e3 * walls[len(walls) // 2], "step_wall_ms_p99": 1e3 * walls[int(0.99 * (len(walls) - 1))],
            "step_wall_ms_max": 1e3 * walls[-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--alpha", type=float, default=0.75)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--pair", default=None, help="a trained zoo pair folder (real acceptance; needs --data)")
    parser.add_argument("--head", default=None, help="with --pair: a feature head folder, added as two more arms")
    parser.add_argument("--data", default="data/code", help="with --pair: the prepared code corpus (prompts)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    lengths = [30, 45, 61, 80, 120, 200, 350, 520]
    plain_config = EngineConfig(max_batch_size=64, max_seq_len=1024)
    if args.pair:
        from pathlib import Path

        from tokenizers import Tokenizer

        from specdec.bench.presets import load_pair
        from specdec.bench.prompts import code_prompts

        target, draft = load_pair(Path(args.pair), device, torch.bfloat16)
        tokenizer = Tokenizer.from_file(str(Path(args.data) / "tokenizer" / "tokenizer.json"))
        pool = code_prompts(lambda s: tokenizer.encode(s).ids, count=160, max_tokens=1024 - 128 - 16)
        config = EngineConfig(max_batch_size=64, max_seq_len=1024, max_draft_tokens=8)
        engines = {"plain": (Engine(target, None, plain_config), 0), "model4": (Engine(target, draft, config), 4),
                   "model_auto": (Engine(target, draft, config), "auto")}
        if args.head:
            engines["head4"] = (Engine(target, args.head, config), 4)
            engines["head_auto"] = (Engine(target, args.head, config), "auto")
    else:
        target, draft = random_zoo_pair(device, torch.bfloat16)
        pool = None
        config = EngineConfig(max_batch_size=64, max_seq_len=1024, max_draft_tokens=8,
                              synthetic_acceptance=args.alpha)
        engines = {"plain": (Engine(target, None, plain_config), 0),
                   "gamma4": (Engine(target, draft, config), 4), "auto": (Engine(target, draft, config), "auto")}
    t0 = time.perf_counter()
    for engine, _ in engines.values():
        engine.warmup(batch_sizes=[b for b in (1, 2, 4, 8, 16, 32, 64) if b < 2 * max(args.sizes)], max_length=1024,
                      temperatures=args.temperatures)
    rows = [{"warmup_s": time.perf_counter() - t0}]
    for n in args.sizes:
        prompts = ([pool[i % len(pool)] for i in range(n)] if pool is not None else
                   [torch.randint(3, 8000, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(n)])
        for temperature in args.temperatures:
            params = SamplingParams(temperature=temperature, max_new_tokens=128, seed=1)  # no EOS ids: 128 each
            plain = None
            for name, (engine, gamma) in engines.items():
                engine.policy.set_fixed(gamma)
                run(engine, prompts, params)  # untimed: graphs, policy arms
                row = {"requests": n, "temperature": temperature, "arm": name, **run(engine, prompts, params)}
                plain = row["tok_s"] if name == "plain" else plain
                row["vs_plain"] = row["tok_s"] / plain
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
