"""Token trees against chains on the engine: tokens/s, τ and target calls for plain decoding, a chain of γ drafts and
draft trees, at batch 1 and under load, each at T = 0 and T = 1, on the shipped demo pair (or --pair DIR).

    python scripts/bench_engine_trees.py --device cuda --dtype bfloat16 --batches 1,32 --json $OUT/trees.json

A batch size b is an `Engine(max_batch_size=b)` fed max(b, 6) requests (the six prompts, repeated): at b = 1 they
are decoded one at a time, at b = 32 thirty-two run together. Every configuration runs the same requests through it
(public API: `add_request` / `step`): a warm-up pass first (CUDA graphs captured, not timed), then a timed pass. Rows are (batch, T, configuration); speedups are
against plain decoding of the same batch and temperature. Chains run a fixed γ (`policy.set_fixed`), trees run
their own shape per request (`SamplingParams.draft_tree`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.bench.demo_pair import DEMO_PAIR, PAIR_PROMPTS, load_pair
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams
from specdec.metrics import SpecStats


def parse_trees(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(k) for k in tree.split(",")) for tree in text.split(";") if tree]


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, float, list, SpecStats]:
    """Wall seconds, this process's CPU seconds, the tokens of each request, engine statistics of one pass over
    the requests (on a shared CPU the process time is the steadier clock)."""
    engine.stats = SpecStats()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start, cpu = time.perf_counter(), time.process_time()
    ids = [engine.add_request(prompt, p) for prompt, p in zip(prompts, params)]
    tokens = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - start, time.process_time() - cpu, [tokens[rid] for rid in ids], engine.stats


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default=str(DEMO_PAIR), help="a folder with target/ and draft/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--batches", default="1,32", help="requests decoded together, comma-separated")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--gamma", type=int, default=4, help="the chain's γ")
    parser.add_argument("--trees", default="1,1,1,1;2,2,1;3,2,1,1;4,2,2;2,2,2,2",
                        help="draft trees, ';'-separated, each 'k1,k2,...'")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    target, draft, tokenizer = load_pair(Path(args.pair), device=args.device, dtype=dtype)
    texts = [tokenizer(p)["input_ids"] for p in PAIR_PROMPTS]
    batches = [int(b) for b in args.batches.split(",")]
    trees = parse_trees(args.trees)
    depth = max([args.gamma] + [len(t) for t in trees])
    longest = max(len(t) for t in texts) + args.max_new_tokens
    rows = []
    for batch in batches:
        config = EngineConfig(max_batch_size=batch, max_seq_len=1 << (longest + 1).bit_length(),
                              num_draft_tokens=args.gamma, max_draft_tokens=max(8, depth), max_tree_nodes=64)
        engine = Engine(target, draft, config)
        prompts = [texts[i % len(texts)] for i in range(max(batch, len(texts)))]
        for temperature in (float(t) for t in args.temperatures.split(",")):
            plain_tps = plain_tokens = None
            for name, gamma, tree in [("plain", 0, None), (f"chain γ={args.gamma}", args.gamma, None)] + \
                    [(str(list(t)), args.gamma, t) for t in trees]:
                engine.policy.set_fixed(gamma)
                params = [SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=i,
                                         eos_token_ids=(), draft_tree=tree) for i in range(len(prompts))]
                run(engine, prompts, params)  # warm-up: graphs captured
                seconds, cpu_seconds, outputs, stats = run(engine, prompts, params)
                tokens = sum(len(t) for t in outputs)
                tps = tokens / seconds
                if gamma == 0:
                    plain_tps, plain_tokens = tps, outputs
                # greedy: the share of requests whose text is plain decoding's (1.0 in fp32; bf16 may flip a near-tie)
                same = sum(a == b for a, b in zip(outputs, plain_tokens)) / len(outputs) if temperature == 0 else None
                rows.append({"batch": batch, "temperature": temperature, "config": name, "tokens": tokens,
                             "seconds": round(seconds, 4), "tokens_per_s": round(tps, 1),
                             "tokens_per_cpu_s": round(tokens / cpu_seconds, 1),
                             "speedup_vs_plain": round(tps / plain_tps, 3), "tau": round(stats.mean_accepted_length, 3),
                             "target_calls": stats.target_calls, "drafter_calls": stats.drafter_calls,
                             "same_text_as_plain": same})
                print(json.dumps(rows[-1]), flush=True)
        del engine  # (its caches and graphs) before the next batch size's
    result = {"pair": args.pair, "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "dtype": dtype, "max_new_tokens": args.max_new_tokens, "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
