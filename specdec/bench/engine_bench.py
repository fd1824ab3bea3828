"""Benchmark of the request-level engine on real traffic shapes (results returned, never printed here).

    python -m specdec.bench.engine_bench --pair DIR|random --data data/code [--train --budget-scale 0.5]
        --out results/engine [--quick]

Measured side by side in one process, on the held-in code prompt set (`specdec.bench.prompts`):
  latency      batch 1: each prompt's first request vs the same prompt again (new length vs repeated);
               per-request p50/p99 ratio
  batch1       batch 1, T=0, every prompt in turn: plain vs speculative (fixed γ=4 and "auto") tokens/s
  concurrent   N requests submitted at once (N = 8, 32, 64; continuous batching), plain vs each drafter
               (model, bigram, prompt lookup), T=0 and T=1, γ "auto": tokens/s and the ratio to plain
  shapes       8B-shaped Llama and Qwen2 random weights: plain decoding tok/s at batch 1 and the MBU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

__all__ = ["run_requests", "latency", "batch1", "concurrent", "shapes", "main"]


def run_requests(engine: Engine, prompts, params: SamplingParams) -> tuple[float, int, list]:
    """Submit every prompt at once, run to completion → (seconds, tokens generated, final outputs)."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for p in prompts:
        engine.add_request(p, params)
    tokens, finals = 0, []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                finals.append(out)
    return time.perf_counter() - start, tokens, finals


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


def batch1(engine_plain: Engine, engine_spec: Engine, prompts, max_new: int, temperature: float = 0.0) -> dict:
    out = {}
    for name, engine, gamma in (("plain", engine_plain, 0), ("gamma4", engine_spec, 4), ("auto", engine_spec, "auto")):
        engine.policy.set_fixed(gamma)
        engine.stats = type(engine.stats)()
        seconds, tokens = 0.0, 0
        for i, p in enumerate(prompts):
            s, t, _ = run_requests(engine, [p], SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=i))
            seconds += s
            tokens += t
        out[name] = {"tok_s": tokens / seconds, "alpha": engine.stats.alpha,
                     "tau": engine.stats.mean_accepted_length, "mean_gamma": engine.stats.mean_num_draft_tokens}
    for name in ("gamma4", "auto"):
        out[name]["speedup"] = out[name]["tok_s"] / out["plain"]["tok_s"]
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
        run_requests(engine, [prompt], SamplingParams(temperature=0, max_new_tokens=max_new))  # capture
        seconds, tokens, _ = run_requests(engine, [prompt], SamplingParams(temperature=0, max_new_tokens=max_new))
        rate = tokens / seconds
        bandwidth = documented_peak_bandwidth(torch.cuda.get_device_name())
        rows.append({"shape": name, "tok_s": rate, "weight_gb": model.weight_bytes / 1e9,
                     "mbu": rate * model.weight_bytes / bandwidth if bandwidth else None})
        del engine, model
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> dict:
    from specdec.bench.presets import _load_pair, _random_zoo_pair, train_gpu_pair
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
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    if args.train:
        results["training"] = train_gpu_pair(Path(args.data), Path(args.pair), args.budget_scale, device)
    hf_target, hf_draft = (_random_zoo_pair(device, dtype) if args.pair == "random"
                           else _load_pair(Path(args.pair), device, dtype))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.data) / "tokenizer" / "tokenizer.json"))
    max_new = args.max_new_tokens
    seq = 512 if args.quick else 1024
    count = 24 if args.quick else 160  # held-in code prompts, 30..600 tokens
    prompts = code_prompts(lambda s: tokenizer.encode(s).ids, count=count, max_tokens=seq - max_new - 16)
    results["prompts"] = {"count": len(prompts), "min": min(map(len, prompts)),
                          "median": statistics.median(map(len, prompts)), "max": max(map(len, prompts))}
    from specdec.zoo.data import TokenData

    corpus = TokenData.load(Path(args.data)).train[:4_000_000].astype("int64").tolist()
    bigram = NGramDrafter(order=2).fit([corpus], hf_target.config.vocab_size)
    config = EngineConfig(max_batch_size=8 if args.quick else 64, max_seq_len=seq, num_draft_tokens="auto", max_draft_tokens=8)
    engines = {"plain": (Engine(hf_target, None, config), 0), "model": (Engine(hf_target, hf_draft, config), "auto"),
               "bigram": (Engine(hf_target, bigram, config), "auto"),
               "prompt_lookup": (Engine(hf_target, PromptLookupDrafter(), config), "auto")}
    if args.head:
        engines["head"] = (Engine(hf_target, args.head, config), "auto")
    def save() -> None:  # after every section, so a run cut off by its time limit keeps what it measured
        (out_dir / "engine.json").write_text(json.dumps(results, indent=1, default=str))

    t0 = time.perf_counter()
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= config.max_batch_size)
    for engine, _ in engines.values():  # every shape the runs below can reach, as a server does at start-up
        engine.warmup(batch_sizes=buckets, max_length=seq, temperatures=(0.0, 1.0))
    results["warmup_s"] = time.perf_counter() - t0
    n_lat = 12 if args.quick else 40
    results["latency_plain"] = latency(engines["plain"][0], prompts[:n_lat], max_new, 0)
    results["latency_model"] = latency(engines["model"][0], prompts[:n_lat], max_new, 4)
    save()
    n_b1 = 12 if args.quick else 48
    results["batch1_T0"] = batch1(engines["plain"][0], engines["model"][0], prompts[:n_b1], max_new, 0.0)
    results["batch1_T1"] = batch1(engines["plain"][0], engines["model"][0], prompts[:n_b1], max_new, 1.0)
    if args.head:
        for t in (0.0, 1.0):
            results[f"batch1_T{t:.0f}_head"] = batch1(engines["plain"][0], engines["head"][0], prompts[:n_b1], max_new, t)
    save()
    sizes = (8,) if args.quick else (8, 32, 64)
    results["concurrent"] = concurrent(engines, prompts, max_new, sizes=sizes)
    save()
    if device.type == "cuda":
        results["profile"] = [step_profile(engine, [prompts[i] for i in range(n)], gamma)
                              for n in (1, 64) for engine, gamma in ((engines["plain"][0], 0), (engines["model"][0], 4))]
    del engines
    if device.type == "cuda" and not args.no_shapes:
        torch.cuda.empty_cache()
        results["shapes"] = shapes(device)
    (out_dir / "engine.json").write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    res = main()
    print(json.dumps(res, indent=1, default=str))
