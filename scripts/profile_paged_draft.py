"""Where a speculative step's extra time on the paged pool goes: the CUDA kernels of batch-1 steps (random zoo `gpu`
pair, fixed γ, greedy) under the static layout and the paged pool, side by side (torch.profiler), with wall µs per
step. The held-in batch-1 table read the drafter's steps 15–20% slower on the pool (BENCHMARKS).

    python scripts/profile_paged_draft.py --gamma 4 --new 128 --out prof.json      (CUDA; --device cpu runs it here)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdec.bench.presets import random_zoo_pair
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


def run(engine: Engine, prompt: list[int], new: int) -> int:
    engine.add_request(prompt, SamplingParams(max_new_tokens=new, temperature=0.0))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def profile(layout: str, target, draft, gamma: int, new: int, device: torch.device, top: int) -> dict:
    config = EngineConfig(max_batch_size=1, max_seq_len=1024, num_draft_tokens=gamma, kv_layout=layout)
    engine = Engine(target, draft, config)
    engine.policy.set_fixed(gamma)
    engine.warmup(batch_sizes=(1,), max_length=1024, temperatures=(0.0,))
    prompt = list(range(10, 74))
    run(engine, prompt, new)  # warm
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    steps = run(engine, prompt, new)
    sync()
    wall_us = (time.perf_counter() - t0) * 1e6 / steps
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        steps = run(engine, prompt, new)
        sync()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, attr))
    rows = [{"name": e.key[:90], "count": e.count, "us_per_step": getattr(e, attr) / steps} for e in events[:top]]
    total = sum(getattr(e, attr) for e in prof.key_averages()) / steps
    return {"layout": layout, "steps": steps, "wall_us_per_step": wall_us, "kernel_us_per_step": total, "top": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python scripts/profile_paged_draft.py")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    target, draft = random_zoo_pair(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    result = {layout: profile(layout, target, draft, args.gamma, args.new, device, args.top)
              for layout in ("static", "paged")}
    for layout, r in result.items():
        print(f"== {layout}: {r['steps']} steps, wall {r['wall_us_per_step']:.1f} us/step, "
              f"kernels {r['kernel_us_per_step']:.1f} us/step")
        for row in r["top"]:
            print(f"  {row['us_per_step']:8.2f} us  x{row['count'] // max(r['steps'], 1):3d}/step  {row['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
