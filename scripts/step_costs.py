"""Step costs of the engine per batch bucket: plain vs fixed γ vs "auto", zoo-`gpu`-shaped random pair.

    python scripts/step_costs.py --out step_costs.json [--alpha 0.75] [--sizes 1 8 64]

Each draft is accepted with probability --alpha (`EngineConfig.synthetic_acceptance`, BENCHMARK ONLY: the output
is not the target's law), so the policy sees a known acceptance on random weights. For N concurrent requests
(one prompt length per request, 30..520 tokens, 128 new tokens) and each arm, after an untimed run that captures
the graphs: tokens/s, the ratio to plain, wall / draft / verify ms per step, the steps the drafter was caught up,
the graphs captured during the timed run, and the γ the policy chose (histogram). Prints one line per row.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch

from specdec.bench.presets import _random_zoo_pair
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


def run(engine: Engine, prompts, params) -> dict:
    gammas = collections.Counter()
    catch_ups = 0
    original_choose, original_catch_up = engine.policy.choose, engine._catch_up_drafter

    def choose(*a, **k):
        g = original_choose(*a, **k)
        gammas[g] += 1
        return g

    def catch_up(gamma):
        nonlocal catch_ups
        fed = original_catch_up(gamma)
        catch_ups += bool(fed)
        return fed

    engine.policy.choose, engine._catch_up_drafter = choose, catch_up
    graphs_before = len(engine._steps)
    engine.stats = type(engine.stats)()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for p in prompts:
        engine.add_request(p, params)
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    seconds = time.perf_counter() - start
    engine.policy.choose, engine._catch_up_drafter = original_choose, original_catch_up
    st = engine.stats
    steps = max(st.num_steps, 1)
    return {"tok_s": tokens / seconds, "seconds": seconds, "steps": st.num_steps,
            "wall_ms_per_step": 1e3 * seconds / steps, "draft_ms_per_step": 1e3 * st.draft_time_s / steps,
            "verify_ms_per_step": 1e3 * st.verify_time_s / steps, "tau": st.mean_accepted_length,
            "catch_ups": catch_ups, "graphs_captured_in_run": len(engine._steps) - graphs_before,
            "gammas": dict(sorted(gammas.items()))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--alpha", type=float, default=0.75)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    target, draft = _random_zoo_pair(device, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    lengths = [30, 45, 61, 80, 120, 200, 350, 520]
    config = EngineConfig(max_batch_size=64, max_seq_len=1024, max_draft_tokens=8,
                          synthetic_acceptance=args.alpha)
    engines = {"plain": (Engine(target, None, EngineConfig(max_batch_size=64, max_seq_len=1024)), 0),
               "gamma4": (Engine(target, draft, config), 4), "auto": (Engine(target, draft, config), "auto")}
    t0 = time.perf_counter()
    for engine, _ in engines.values():
        engine.warmup(batch_sizes=(1, 2, 4, 8, 16, 32, 64), max_length=1024, temperatures=(0.0, 1.0))
    rows = [{"warmup_s": time.perf_counter() - t0}]
    for n in args.sizes:
        prompts = [torch.randint(3, 8000, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(n)]
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
