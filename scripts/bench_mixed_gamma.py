"""Half plain, half speculative traffic through ONE engine (every request's γ its own cap, `num_draft_tokens`) against
the same traffic split over TWO engines (a plain one and a speculative one, stepped in turn on one thread: what
`specdec.load` did before one engine served every γ), on the shipped demo pair (or --pair DIR).

    python scripts/bench_mixed_gamma.py --quick                       # CPU, a few minutes
    python scripts/bench_mixed_gamma.py --device cuda --dtype bfloat16 --requests 256 --rate 64 --json $OUT/mixed.json

Traffic: `--requests` prompts (the pair's six, repeated), request i plain when i is even, else γ = `--gamma`; they
arrive at seeded exponential gaps of mean 1 / `--rate` seconds (arrivals while others run), each decoding
`--max-new-tokens` tokens at `--temperature` (seeded). Each arm runs the same schedule: an untimed warm-up pass, then
`--repeats` timed passes in alternating order; a row is the (lower) median pass. Reported per arm: output tokens/s over the
pass (first arrival to last token), mean request latency, K/V cache bytes held, and whether every request's tokens
equal the one-engine arm's (greedy: they must). A benchmark, not a test: nothing is asserted about times.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from specdec.bench.demo_pair import DEMO_PAIR, PAIR_PROMPTS, load_pair
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


def schedule(requests: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets in seconds (the first at 0)."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(requests):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def drive(engines: list[Engine], route, prompts, params, arrivals) -> tuple[float, list[float], list[list[int]]]:
    """Feed request i to `engines[route(i)]` at its arrival, step every busy engine in turn until all finish →
    (seconds, each request's latency, each request's tokens)."""
    sync = [e.device for e in engines if e.device.type == "cuda"]
    start, pending, owner = time.perf_counter(), list(range(len(prompts))), {}
    tokens: list[list[int]] = [[] for _ in prompts]
    done: list[float] = [0.0] * len(prompts)
    while pending or any(e.has_unfinished() for e in engines):
        now = time.perf_counter() - start
        while pending and arrivals[pending[0]] <= now:
            i = pending.pop(0)
            owner[engines[route(i)].add_request(prompts[i], params[i], request_id=f"r{i}")] = i
        if not any(e.has_unfinished() for e in engines):
            time.sleep(max(arrivals[pending[0]] - now, 0.0))
            continue
        for engine in engines:
            if engine.has_unfinished():
                for out in engine.step():
                    i = owner[out.request_id]
                    tokens[i] += out.new_token_ids
                    if out.finished:
                        done[i] = time.perf_counter() - start - arrivals[i]
    for device in sync:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, done, tokens


def cache_bytes(engine: Engine) -> int:
    drafter_cache = getattr(engine.drafter, "cache", None)
    return engine.cache.nbytes + (drafter_cache.nbytes if drafter_cache is not None else 0)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", type=Path, default=DEMO_PAIR)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rate", type=float, default=8.0, help="arrivals per second (mean)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 requests of 16 tokens, 2 repeats (CPU)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_new_tokens, args.repeats = 8, 16, 2
    torch.manual_seed(args.seed)
    target, draft, tokenizer = load_pair(args.pair, device=args.device, dtype=args.dtype)
    prompts = [tokenizer.encode(PAIR_PROMPTS[i % len(PAIR_PROMPTS)]) for i in range(args.requests)]
    seq_len = max(len(p) for p in prompts) + args.max_new_tokens
    params = [SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed + i,
                             num_draft_tokens=0 if i % 2 == 0 else args.gamma) for i in range(args.requests)]
    arrivals = schedule(args.requests, args.rate, args.seed)

    def config(gamma):
        return EngineConfig(max_batch_size=args.max_batch_size, max_seq_len=seq_len, num_draft_tokens=gamma)

    one = [Engine(target, draft, config(args.gamma))]
    split = [Engine(target, None, config(0)), Engine(target, draft, config(args.gamma))]
    arms = {"one engine": (one, lambda i: 0), "two engines": (split, lambda i: 0 if i % 2 == 0 else 1)}
    runs: dict = {name: [] for name in arms}
    for name, (engines, route) in arms.items():  # warm-up: first calls, captures on CUDA
        drive(engines, route, prompts, params, [0.0] * len(prompts))
    for k in range(args.repeats):
        for name in (list(arms) if k % 2 == 0 else list(arms)[::-1]):
            engines, route = arms[name]
            seconds, latency, tokens = drive(engines, route, prompts, params, arrivals)
            runs[name].append({"seconds": seconds, "latency": statistics.mean(latency), "tokens": tokens})
    reference = runs["one engine"][0]["tokens"]
    rows = []
    for name, passes in runs.items():
        engines = arms[name][0]
        median = sorted(passes, key=lambda r: r["seconds"])[(len(passes) - 1) // 2]  # (the lower median)
        produced = sum(len(t) for t in median["tokens"])
        rows.append({"arm": name, "tokens_per_s": produced / median["seconds"], "seconds": median["seconds"],
                     "mean_latency_s": median["latency"], "cache_bytes": sum(cache_bytes(e) for e in engines),
                     "passes_s": [round(r["seconds"], 3) for r in passes],
                     "same_tokens": all(r["tokens"] == reference for r in passes)})
    for row in rows:
        print(f"{row['arm']:>12}: {row['tokens_per_s']:8.1f} tok/s  {row['seconds']:6.2f} s  latency "
              f"{row['mean_latency_s']:.2f} s  cache {row['cache_bytes'] / 2**20:7.1f} MiB  passes {row['passes_s']}  "
              f"same tokens: {row['same_tokens']}")
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": rows,
              "ratio": rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]}
    print(f"one engine / two engines: {result['ratio']:.2f}x tokens/s")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
