"""Benchmark of the request-level engine on real traffic shapes (results returned, never printed here).

    python -m specdec.bench.engine_bench --pair DIR|random --data data/code [--train --budget-scale 0.5]
        --out results/engine [--quick]

Measured side by side in one process, on the held-in code prompt set (`specdec.bench.prompts`):
  latency      batch 1: each prompt's first request vs the same prompt again (new length vs repeated);
               per-request p50/p99 ratio
  batch1       batch 1, T=0, every prompt in turn: plain vs speculative (fixed γ=4 and "auto") tokens/s
  concurrent   N requests submitted at once (N = 8, 32, 64; continuous batching), plain vs each drafter
               (model, bigram, prompt lookup, head), T=0 and T=1, γ "auto" (and γ=4 for model and head):
               tokens/s and the ratio to plain
  shapes       8B-shaped Llama and Qwen2 random weights: plain decoding tok/s at batch 1 and the MBU
  synthetic    8B-shaped target with a small random drafter, each draft accepted with probability α = 0.8
               (EngineConfig.synthetic_acceptance), γ = 4: measured speedup vs Thm 3.8 at the measured c

Each speculative batch-1 row carries two predictions next to the measured speedup: the paper's Thm 3.8,
E(α, γ) / (γc + 1), and the cost-aware one, E(α, γ) / (γc + r), where c = one drafter forward / one plain
(1-token) target step and r = the (γ+1)-token verify / the 1-token step, all timed on the device in this run
(`cost_model`). Host time is in neither prediction: measured / cost-aware is what the host and the rest cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.analysis import timed
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

SECTIONS = ("latency", "batch1", "concurrent", "profile", "shapes", "synthetic")

__all__ = ["run_requests", "latency", "batch1", "cost_model", "concurrent", "shapes", "synthetic", "main"]


def run_requests(engine: Engine, prompts, params: SamplingParams) -> tuple[float, int, list]:
    """Submit every prompt at once, run to completion → (seconds, tokens generated, final outputs)."""
    def run() -> tuple[int, list]:
        for p in prompts:
            engine.add_request(p, params)
        tokens, finals = 0, []
        while engine.has_unfinished():
            for out in engine.step():
                tokens += len(out.new_token_ids)
                if out.finished:
                    finals.append(out)
        return tokens, finals

    seconds, (tokens, finals) = timed(run, engine.device)
    return seconds, tokens, finals


def latency(engine: Engine, prompts, max_new: int, gamma) -> dict:
    engine.policy.set_fixed(gamma)
    params = SamplingParams(temperature=0, max_new_tokens=max_new)
    first, repeat = [], []
    for p in prompts:
        first.append(run_requests(engine, [p], params)[0])
        repeat.append(run_requests(engine, [p], params)[0])
    ratios = sorted(f / r for f, r in zip(first, repeat))
    return {"gamma": gamma, "requests": len(prompts), "first_p50_s": statistics.median(first),
            "repeat_p50_s": statistics.median(repeat), "ratio_p50": statistics.median(ratios),
            "ratio_p99": ratios[min(len(ratios) - 1, int(0.99 * len(ratios)))]}


def cost_model(plain, spec) -> dict:
    """The two predictions of a speculative run from device timings of this run (see the module doc).

    plain, spec: `SpecStats` of a plain run and a speculative run of the same prompts.
    """
    from specdec.analysis import expected_tokens

    step_1 = plain.verify_time_s / max(plain.num_steps, 1)  # one 1-token target step
    out = {"plain_step_ms": 1e3 * step_1}
    alpha, gamma = spec.alpha, spec.mean_num_draft_tokens
    if alpha is None or gamma <= 0 or step_1 <= 0 or not spec.num_steps:
        return out
    c = (spec.draft_time_s / spec.drafter_calls) / step_1 if spec.drafter_calls else 0.0
    r = (spec.verify_time_s / spec.num_steps) / step_1
    g = round(gamma)
    e = expected_tokens(alpha, g)
    out.update({"c": c, "verify_ratio": r, "draft_ms_per_step": 1e3 * spec.draft_time_s / spec.num_steps,
                "verify_ms_per_step": 1e3 * spec.verify_time_s / spec.num_steps,
                "predicted_thm38": e / (g * c + 1.0), "predicted_cost_aware": e / (g * c + r)})
    return out


def batch1(engine_plain: Engine, spec_engines: dict, prompts, max_new: int, temperature: float = 0.0,
           gammas=(4, 8, "auto")) -> dict:
    """Batch 1, every prompt in turn: plain, then each drafter (name → engine) at each γ."""
    out = {}
    arms = [("plain", engine_plain, 0)] + [(f"{d}_gamma{g}" if g != "auto" else f"{d}_auto", e, g)
                                           for d, e in spec_engines.items() for g in gammas]
    for name, engine, gamma in arms:
        engine.policy.set_fixed(gamma)
        engine.stats = type(engine.stats)()
        seconds, tokens = 0.0, 0
        for i, p in enumerate(prompts):
            s, t, _ = run_requests(engine, [p], SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=i))
            seconds += s
            tokens += t
        out[name] = {"tok_s": tokens / seconds, "alpha": engine.stats.alpha,
                     "tau": engine.stats.mean_accepted_length, "mean_gamma": engine.stats.mean_num_draft_tokens,
                     "stats": engine.stats}
        if gamma == "auto" and hasattr(engine.policy, "report"):  # what "auto" measured and chose (its life so far)
            out[name]["policy"] = engine.policy.report()
    plain = out["plain"]
    for name, row in out.items():
        if name != "plain":
            row["speedup"] = row["tok_s"] / plain["tok_s"]
            row.update(cost_model(plain["stats"], row["stats"]))
            if "predicted_cost_aware" in row:
                row["measured_vs_cost_aware"] = row["speedup"] / row["predicted_cost_aware"]
    for row in out.values():
        row.pop("stats")
    return out


def concurrent(engines: dict, prompts, max_new: int, sizes=(8, 32, 64), temperatures=(0.0, 1.0)) -> list[dict]:
    rows = []
    for n in sizes:
        batch = [prompts[i % len(prompts)] for i in range(n)]
        for temperature in temperatures:
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=1)
            plain = None
            for name, (engine, gamma) in engines.items():
                engine.policy.set_fixed(gamma)
                run_requests(engine, batch, params)  # the same run once untimed: its graphs are captured here
                engine.stats = type(engine.stats)()
                seconds, tokens, _ = run_requests(engine, batch, params)
                rate = tokens / seconds
                plain = rate if name == "plain" else plain
                rows.append({"requests": n, "temperature": temperature, "drafter": name, "tok_s": rate,
                             "vs_plain": rate / plain, "alpha": engine.stats.alpha,
                             "mean_gamma": engine.stats.mean_num_draft_tokens})
    return rows


def step_profile(engine: Engine, prompts, gamma, max_new: int = 64) -> dict:
    """Where a step's time goes at this batch size: host vs device per step (graphs), and the device time
    by kernel kind from an eager profile of the same steps (kernels inside graph replays are not traced)."""
    from specdec.bench.profile import profile_steps
    from specdec.metrics import SpecStats

    engine.policy.set_fixed(gamma)
    params = SamplingParams(temperature=0, max_new_tokens=max_new)
    run_requests(engine, prompts, params)
    engine.stats = SpecStats()
    seconds, tokens, _ = run_requests(engine, prompts, params)
    st = engine.stats
    steps = max(st.num_steps, 1)
    out = {"requests": len(prompts), "gamma": gamma, "steps": st.num_steps, "tokens_per_step": tokens / steps,
           "wall_ms_per_step": 1e3 * seconds / steps, "draft_ms_per_step": 1e3 * st.draft_time_s / steps,
           "verify_ms_per_step": 1e3 * st.verify_time_s / steps}
    engine.cuda_graphs = False
    try:
        engine.stats = SpecStats()
        prof = profile_steps(lambda: run_requests(engine, prompts, params), 1, engine.device)
        eager_steps = max(engine.stats.num_steps // 2, 1)  # profile_steps runs fn twice (warm + profiled)
        out["eager_kernel_ms_per_step"] = prof["kernel_ms_per_step"] / eager_steps
        out["eager_kernels_per_step"] = prof["kernels_per_step"] / eager_steps
        out["eager_ms_by_kind_per_step"] = {k: v / eager_steps for k, v in prof["by_kind_ms_per_step"].items()}
    finally:
        engine.cuda_graphs = True
    return out


def shapes(device: torch.device, max_new: int = 128) -> list[dict]:
    from specdec.bench.device import documented_peak_bandwidth
    from specdec.fast.model import FastLlama, LlamaShape

    llama8b = LlamaShape(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                         intermediate_size=14336, rope_theta=500000.0, max_positions=8192)
    qwen7b = LlamaShape(vocab_size=152064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128,
                        intermediate_size=18944, rope_theta=1000000.0, qkv_bias=True, max_positions=8192)
    rows = []
    for name, shape in (("llama-8B", llama8b), ("qwen2-7B", qwen7b)):
        model = FastLlama.random(shape, device=device, dtype=torch.bfloat16)
        engine = Engine(model, None, EngineConfig(max_batch_size=1, max_seq_len=1024))
        prompt = list(range(1000, 1128))
        for _ in range(2):  # decode graphs captured at the first run, the prefill graph at the second
            run_requests(engine, [prompt], SamplingParams(temperature=0, max_new_tokens=max_new))
        seconds, tokens, _ = run_requests(engine, [prompt], SamplingParams(temperature=0, max_new_tokens=max_new))
        rate = tokens / seconds
        bandwidth = documented_peak_bandwidth(torch.cuda.get_device_name())
        rows.append({"shape": name, "tok_s": rate, "weight_gb": model.weight_bytes / 1e9,
                     "mbu": rate * model.weight_bytes / bandwidth if bandwidth else None})
        del engine, model
        torch.cuda.empty_cache()
    return rows


def synthetic(device: torch.device, alpha: float = 0.8, gamma: int = 4, max_new: int = 256) -> dict:
    """8B-shaped target, a small random drafter, each draft accepted with probability `alpha`: measured
    speedup over plain decoding vs Thm 3.8 at the c measured in the same run (batch 1)."""
    from specdec.analysis import walltime_improvement
    from specdec.fast.model import FastLlama, LlamaShape

    target_shape = LlamaShape(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                              intermediate_size=14336, rope_theta=500000.0, max_positions=8192)
    draft_shape = LlamaShape(vocab_size=128256, dim=1024, n_layers=2, n_heads=8, n_kv_heads=8, head_dim=128,
                             intermediate_size=2816, rope_theta=500000.0, max_positions=8192)
    target = FastLlama.random(target_shape, device=device, dtype=torch.bfloat16)
    draft = FastLlama.random(draft_shape, device=device, dtype=torch.bfloat16, seed=1)
    prompt = list(range(1000, 1128))
    params = SamplingParams(temperature=0, max_new_tokens=max_new)
    rows = {}
    for name, drafter, gamma_ in (("plain", None, 0), ("synthetic", draft, gamma)):
        config = EngineConfig(max_batch_size=1, max_seq_len=1024, num_draft_tokens=gamma_, max_draft_tokens=max(gamma, 1),
                              synthetic_acceptance=alpha if drafter is not None else None)
        engine = Engine(target, drafter, config)
        for _ in range(2):  # decode graphs captured at the first run, the prefill graph at the second
            run_requests(engine, [prompt], params)
        engine.stats = type(engine.stats)()
        seconds, tokens, _ = run_requests(engine, [prompt], params)
        rows[name] = {"tok_s": tokens / seconds, "stats": engine.stats}
        del engine
    plain, spec = rows["plain"], rows["synthetic"]
    costs = cost_model(plain["stats"], spec["stats"])
    c = costs.get("c", 0.0)
    thm = walltime_improvement(alpha, gamma, c)
    speedup = spec["tok_s"] / plain["tok_s"]
    del target, draft
    torch.cuda.empty_cache()
    return {"alpha": alpha, "gamma": gamma, "plain_tok_s": plain["tok_s"], "spec_tok_s": spec["tok_s"],
            "speedup": speedup, "predicted_thm38": thm, "measured_vs_thm38": speedup / thm,
            "tau": spec["stats"].mean_accepted_length, **costs}


def main(argv=None) -> dict:
    from specdec.bench.presets import random_zoo_pair, load_pair, train_gpu_pair
    from specdec.bench.prompts import code_prompts
    from specdec.drafters import NGramDrafter, PromptLookupDrafter

    parser = argparse.ArgumentParser(prog="python -m specdec.bench.engine_bench")
    parser.add_argument("--pair", required=True, help="a trained zoo pair folder, or 'random'")
    parser.add_argument("--data", default="data/code", help="prepared code corpus (tokenizer + bigram text)")
    parser.add_argument("--train", action="store_true", help="train the zoo gpu pair into --pair first")
    parser.add_argument("--budget-scale", type=float, default=0.5)
    parser.add_argument("--out", default="results/engine")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="fewer prompts and sizes (a smoke run)")
    parser.add_argument("--no-shapes", action="store_true")
    parser.add_argument("--head", default=None, help="a feature head folder (`specdec train head`): adds a 'head' drafter")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="what to run (default: all; e.g. `--sections batch1` for the batch-1 table alone)")
    parser.add_argument("--batch1-prompts", type=int, default=None,
                        help="prompts per batch-1 arm (default 48, --quick 12)")
    parser.add_argument("--kv-layout", choices=("paged", "static"), default="paged",
                        help="the engines' K/V layout (default paged, the engine's default; static for before/after)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="turn the paged pool's prefix cache off (it is on by default)")
    args = parser.parse_args(argv)
    if args.kv_layout == "static" and args.no_prefix_caching:
        parser.error("--no-prefix-caching applies to --kv-layout paged (the static layout has no prefix cache)")
    if args.batch1_prompts is not None and not 1 <= args.batch1_prompts <= 160:
        parser.error(f"--batch1-prompts must be in [1, 160], got {args.batch1_prompts}")
    sections = set(args.sections)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    if args.train:
        results["training"] = train_gpu_pair(Path(args.data), Path(args.pair), args.budget_scale, device)
    hf_target, hf_draft = (random_zoo_pair(device, dtype) if args.pair == "random"
                           else load_pair(Path(args.pair), device, dtype))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.data) / "tokenizer" / "tokenizer.json"))
    max_new = args.max_new_tokens
    seq = 512 if args.quick else 1024
    count = 24 if args.quick else 160  # held-in code prompts, 30..600 tokens
    prompts = code_prompts(lambda s: tokenizer.encode(s).ids, count=count, max_tokens=seq - max_new - 16)
    results["prompts"] = {"count": len(prompts), "min": min(map(len, prompts)),
                          "median": statistics.median(map(len, prompts)), "max": max(map(len, prompts))}
    from specdec.zoo.data import TokenData

    layout = {"kv_layout": args.kv_layout}
    if args.kv_layout == "paged":
        layout["enable_prefix_caching"] = not args.no_prefix_caching
    config = EngineConfig(max_batch_size=8 if args.quick else 64, max_seq_len=seq, num_draft_tokens="auto",
                          max_draft_tokens=8, **layout)
    results["kv_layout"] = layout
    engines = {"plain": (Engine(hf_target, None, config), 0), "model": (Engine(hf_target, hf_draft, config), "auto")}
    if "concurrent" in sections:
        corpus = TokenData.load(Path(args.data)).train[:4_000_000].astype("int64").tolist()
        bigram = NGramDrafter(order=2).fit([corpus], hf_target.config.vocab_size)
        engines["bigram"] = (Engine(hf_target, bigram, config), "auto")
        engines["prompt_lookup"] = (Engine(hf_target, PromptLookupDrafter(), config), "auto")
    if args.head:
        engines["head"] = (Engine(hf_target, args.head, config), "auto")
    fixed = {f"{name}_gamma4": (engines[name][0], 4) for name in ("model", "head") if name in engines}
    def save() -> None:  # after every section, so a run cut off by its time limit keeps what it measured
        (out_dir / "engine.json").write_text(json.dumps(results, indent=1, default=str))

    t0 = time.perf_counter()
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= config.max_batch_size)
    if "concurrent" not in sections:  # batch 1 only: capture batch 1's shapes alone
        buckets = (1,)
    for engine, _ in engines.values():  # every shape the runs below can reach, as a server does at start-up
        engine.warmup(batch_sizes=buckets, max_length=seq, temperatures=(0.0, 1.0))
    results["warmup_s"] = time.perf_counter() - t0
    n_lat = 12 if args.quick else 40
    if "latency" in sections:
        results["latency_plain"] = latency(engines["plain"][0], prompts[:n_lat], max_new, 0)
        results["latency_model"] = latency(engines["model"][0], prompts[:n_lat], max_new, 4)
        save()
    n_b1 = args.batch1_prompts or (12 if args.quick else 48)
    spec = {"model": engines["model"][0]}
    if args.head:
        spec["head"] = engines["head"][0]
    if "batch1" in sections:
        results["batch1_T0"] = batch1(engines["plain"][0], spec, prompts[:n_b1], max_new, 0.0)
        results["batch1_T1"] = batch1(engines["plain"][0], spec, prompts[:n_b1], max_new, 1.0, gammas=(4, "auto"))
        save()
    sizes = (8,) if args.quick else (8, 32, 64)
    if "concurrent" in sections:
        results["concurrent"] = concurrent({**engines, **fixed}, prompts, max_new, sizes=sizes)  # auto and γ=4
        save()
    if device.type == "cuda" and "profile" in sections:
        results["profile"] = [step_profile(engine, [prompts[i] for i in range(n)], gamma)
                              for n in (1, 64) for engine, gamma in ((engines["plain"][0], 0), (engines["model"][0], 4))]
    del engines
    if device.type == "cuda" and not args.no_shapes and "shapes" in sections:
        torch.cuda.empty_cache()
        results["shapes"] = shapes(device)
        save()
    if device.type == "cuda" and not args.no_shapes and "synthetic" in sections:
        torch.cuda.empty_cache()
        results["synthetic"] = synthetic(device)
    (out_dir / "engine.json").write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    res = main()
    print(json.dumps(res, indent=1, default=str))
