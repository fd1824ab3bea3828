"""Forward costs of the Qwen2.5-Coder pair on the CPU: T(target pass of k tokens) / T(one-token target pass) for
k = 1..9 (a verify pass of γ + 1 tokens is k = γ + 1), and T(draft pass of k tokens) / T(one-token target pass).

    SPECDEC_QWEN_PAIR=/work/models python scripts/pair_costs.py [--modes onednn weight_major] [--repeats 5]

    SPECDEC_QWEN_PAIR=/work/models python scripts/pair_costs.py --gemms [--modes onednn weight_major packed]

Each pass appends k tokens to a cache already holding `--context` tokens (not advanced: every pass sees the same
context), through the engine's own `FastLlama` over the models' weights (held once). Every repeat times every
(model, k) once, round-robin, so a machine whose speed drifts slows all of them alike; the numbers are the medians
(and ranges) over the repeats, and the ratios are taken within a repeat before the median. One JSON line per mode.

`--gemms`: the target's matrices alone (random fp32 weights of the shapes in its config.json: q|k|v, o, gate|up,
down, LM head; 1.1 GB, so "packed" fits beside them), each product of k rows timed per mode, round-robin; a pass's
GEMM time is layers × the per-layer sum + the LM head. Says which GEMMs the pair should use without loading it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_fast_pair(folder: Path, draft: bool = True):
    """(target FastLlama, draft FastLlama or None, tokenizer) over the pair's fp32 weights, held once."""
    from specdec.bench.demo_pair import QWEN_DRAFT, QWEN_TARGET
    from specdec.fast.held_once import adopt_hf
    from specdec.loading import load_model, load_tokenizer

    target = adopt_hf(load_model(folder / QWEN_TARGET, device="cpu", dtype="float32", what="target"))
    small = adopt_hf(load_model(folder / QWEN_DRAFT, device="cpu", dtype="float32", what="draft")) if draft else None
    return target, small, load_tokenizer(folder / QWEN_TARGET)


@torch.inference_mode()
def pass_times(models: dict, ks: dict, context: int, repeats: int, clock: str = "wall") -> dict:
    """name → k → [seconds per repeat] for a pass of k tokens (ks[name]) after `context` tokens (round-robin over
    (name, k)). clock "cpu": the process's CPU seconds (`time.process_time`) in place of wall seconds: on a machine
    shared with other jobs, what one pass costs the cores it gets, not how long it waited for them (take it with
    one thread: several threads spin while waiting for each other, which counts as CPU time too)."""
    caches = {}
    gen = torch.Generator().manual_seed(0)
    high = min(model.shape.vocab_size for model in models.values())
    for name, model in models.items():
        cache = model.new_cache(1, context + max(ks[name]) + 1)
        prompt = torch.randint(0, high, (1, context), generator=gen)
        model(prompt, cache, last_only=True)  # prefill (advances the cache to `context`)
        caches[name] = cache
    times = {name: {k: [] for k in ks[name]} for name in models}
    tokens = {k: torch.randint(0, high, (1, k), generator=gen) for k in {k for v in ks.values() for k in v}}
    for name, model in models.items():  # warm-up: one pass of each k
        for k in ks[name]:
            model(tokens[k], caches[name], advance=False)
    for _ in range(repeats):
        for name, model in models.items():
            for k in ks[name]:
                start, cpu = time.perf_counter(), time.process_time()
                model(tokens[k], caches[name], advance=False)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                times[name][k].append(cpu if clock == "cpu" else wall)
    return times


def summarize(times: dict, base: tuple[str, int] = ("target", 1)) -> dict:
    """Medians, ranges and per-repeat ratios to T(base)."""
    ref = times[base[0]][base[1]]
    out = {}
    for name, by_k in times.items():
        for k, values in by_k.items():
            ratios = [v / r for v, r in zip(values, ref)]
            out[f"{name}_k{k}"] = {"ms": round(1e3 * statistics.median(values), 1),
                                   "ms_range": [round(1e3 * min(values), 1), round(1e3 * max(values), 1)],
                                   "ratio": round(statistics.median(ratios), 3),
                                   "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}
    return out


def gemm_times(config: dict, modes: list[str], ks: list[int], repeats: int) -> dict:
    """mode → {ms: GEMM time of a k-row pass (median per matrix), ratio: / the same mode's one-row pass, vs_first:
    / the first mode's one-row pass} over the target's matrix shapes (CPU seconds: `time.process_time`)."""
    from specdec.fast.kernels import cpu_linear

    h, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    shapes = {"qkv": (h + 2 * kv, h), "o": (h, h), "gate_up": (2 * inter, h), "down": (h, inter),
              "lm_head": (config["vocab_size"], h)}
    gen = torch.Generator().manual_seed(0)
    weights = {n: torch.randn(shape, generator=gen) * 0.02 for n, shape in shapes.items()}
    xs = {(n, k): torch.randn(k, shape[1], generator=gen) for n, shape in shapes.items() for k in ks}
    times = {(m, n, k): [] for m in modes for n in shapes for k in ks}
    with torch.inference_mode():
        for rep in range(repeats + 1):  # the first round warms up (and packs, in "packed")
            for m in modes:
                cpu_linear.MODE = m
                for n in shapes:
                    for k in ks:
                        start = time.process_time()
                        cpu_linear.linear(xs[(n, k)], weights[n])
                        if rep:
                            times[(m, n, k)].append(time.process_time() - start)
    cpu_linear.clear_packed()
    out, base = {}, None
    for m in modes:
        med = {(n, k): statistics.median(times[(m, n, k)]) for n in shapes for k in ks}
        total = {k: config["num_hidden_layers"] * sum(med[(n, k)] for n in shapes if n != "lm_head")
                 + med[("lm_head", k)] for k in ks}
        base = base or total[ks[0]]
        out[m] = {"ms": {k: round(1e3 * v, 1) for k, v in total.items()},
                  "ratio": {k: round(v / total[ks[0]], 2) for k, v in total.items()},
                  "vs_first": {k: round(v / base, 2) for k, v in total.items()}}
    return out


def main(argv=None) -> int:
    from specdec.bench.demo_pair import QWEN_CPU_LINEAR, qwen_pair_folder
    from specdec.fast.kernels import cpu_linear

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=[QWEN_CPU_LINEAR, "weight_major"], choices=cpu_linear.MODES,
                    help=f"cpu_linear modes, one JSON line each (default: {QWEN_CPU_LINEAR}, the pair's, and "
                         "weight_major; packed holds a second copy of every weight: ≈ 8 GB more)")
    ap.add_argument("--ks", type=int, nargs="+", default=list(range(1, 10)))
    ap.add_argument("--draft-ks", type=int, nargs="+", default=[1, 2, 5])
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: CPU seconds of the process (with --threads 1: not inflated by other jobs' load)")
    ap.add_argument("--gemms", action="store_true", help="the target's matrices alone (random weights; no model)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.gemms:
        from specdec.bench.demo_pair import QWEN_TARGET

        config = json.loads((qwen_pair_folder() / QWEN_TARGET / "config.json").read_text())
        ks = [k for k in args.ks if k in (1, 2, 3, 5)] if args.ks == list(range(1, 10)) else args.ks
        print(json.dumps({"gemms": gemm_times(config, args.modes, ks, args.repeats), "threads": args.threads}))
        return 0
    target, draft, _ = load_fast_pair(qwen_pair_folder())
    for mode in args.modes:
        cpu_linear.MODE = mode
        both = pass_times({"target": target, "draft": draft}, {"target": args.ks, "draft": args.draft_ks},
                          args.context, args.repeats, args.clock)
        print(json.dumps({"mode": mode, "clock": args.clock, "context": args.context, "repeats": args.repeats, "threads": args.threads,
                          **summarize(both)}), flush=True)
        cpu_linear.clear_packed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
