"""Where a plain step and a verify pass of `specdec demo` spend their time on the CPU (issue 23).

    python scripts/smol_cpu_profile.py --threads 1                    # the default product (cpu_linear.MODE auto)
    python scripts/smol_cpu_profile.py --threads 1 --modes auto linear

Two parts, both on SmolLM2-135M-Instruct (fp32) and the shipped head, one thread unless told:

1. `forward`: the target alone. Prefills a demo prompt (chat template), then times forwards of 1 token (a plain step)
   and of γ + 1 tokens (a verify pass) at the same cache length, interleaved, `--repeats` times each (the cache is
   cropped back after each), per `cpu_linear.MODE`; then one `torch.profiler` run of each, its CPU time split into
   the layers' GEMMs, the LM head, attention, the norms / RoPE / SiLU / cache writes, and the rest.
2. `engine`: `specdec.generate` on the demo's prompts, plain and speculative interleaved (as the demo runs them),
   with the target's and the drafter's forwards timed by wrappers: per plain step and per speculative step, the
   target forward, the drafter's forwards and the engine's host work (everything else).

Prints one JSON object. Timings move with the machine's load: compare only numbers of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.fast.kernels import cpu_linear  # noqa: E402

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise", "aten::linear", "aten::matmul")


def _category(name: str, shapes) -> str:
    if name in ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise"):
        dims = [d for s in shapes if s for d in s]
        return "lm_head" if any(d >= 32000 for d in dims) else "layer_gemms"
    if "scaled_dot_product" in name or name in ("aten::_softmax", "aten::bmm"):
        return "attention"
    if any(k in name for k in ("rms_norm", "pow", "mean", "rsqrt", "silu", "roll", "addcmul", "scatter")):
        return "norm_rope_silu_cache"
    return "other_ops"


def _profile(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    parts = defaultdict(float)
    for ev in prof.key_averages(group_by_input_shape=True):
        parts[_category(ev.key, ev.input_shapes)] += ev.self_cpu_time_total / 1e3
    return {k: round(v, 2) for k, v in sorted(parts.items())}


def forward_part(args, target, ids) -> dict:
    from specdec.fast import FastLlama

    model = FastLlama.from_hf(target, kernels="reference")
    prompt = torch.tensor([ids])
    cache = model.new_cache(1, len(ids) + 256)
    out = {}
    with torch.inference_mode():
        model(prompt, cache)
        extra = torch.tensor([ids[-args.gamma - 1 :]])

        def step(k):
            model(extra[:, :k], cache)
            cache.lengths.sub_(k)

        for mode in args.modes:
            cpu_linear.MODE = mode
            step(1), step(args.gamma + 1)
        times = {(m, k): [] for m in args.modes for k in (1, args.gamma + 1)}
        for _ in range(args.repeats):
            for mode in args.modes:
                cpu_linear.MODE = mode
                for k in (1, args.gamma + 1):
                    t = time.perf_counter()
                    step(k)
                    times[(mode, k)].append(time.perf_counter() - t)
        for mode in args.modes:
            cpu_linear.MODE = mode
            plain = statistics.median(times[(mode, 1)]) * 1e3
            verify = statistics.median(times[(mode, args.gamma + 1)]) * 1e3
            out[mode] = {"plain_step_ms": round(plain, 2), "verify_pass_ms": round(verify, 2),
                         "verify_vs_plain": round(verify / plain, 3),
                         "profile_plain_ms": _profile(lambda: step(1)),
                         "profile_verify_ms": _profile(lambda: step(args.gamma + 1))}
    cpu_linear.MODE = "auto"
    return {"cache_length": len(ids), "gamma": args.gamma, **out}


def engine_part(args, target, prompt_ids, eos) -> dict:
    import specdec
    from specdec.cli.demo_chat import SHIPPED_HEAD
    from specdec.fast import FastLlama

    head = str(args.draft or SHIPPED_HEAD)
    from specdec.fast.head import FeatureHead

    clock = defaultdict(float)
    count = defaultdict(int)
    originals = {(FastLlama, "forward"): FastLlama.forward, (FeatureHead, "forward"): FeatureHead.forward,
                 (FeatureHead, "logits"): FeatureHead.logits}

    def wrap(cls, name):
        original = originals[(cls, name)]

        def timed(self, *a, **kw):
            if cls is FastLlama and self.shape.n_layers == 1:  # the head's own layer: counted by the head's forward
                return original(self, *a, **kw)
            t = time.perf_counter()
            result = original(self, *a, **kw)
            if cls is FastLlama:
                tokens = a[0] if a and a[0] is not None else kw.get("tokens", kw.get("embeds"))
                key = ("target", tokens.shape[1])
            else:  # the drafter: its fc + layer (forward) and its LM head over the draft vocabulary (logits)
                key = ("drafter", name)
            clock[key] += time.perf_counter() - t
            count[key] += name != "logits"
            return result
        return timed

    def go(ids, drafter):
        return specdec.generate(target, [ids], drafter=drafter, max_new_tokens=args.max_new_tokens, temperature=0,
                                num_draft_tokens=args.gamma, eos_token_id=eos, engine="fast")

    out = {}
    with torch.inference_mode():
        for mode in args.modes:
            cpu_linear.MODE = mode
            go(prompt_ids[0], None), go(prompt_ids[0], head)
        for (cls, name) in originals:
            setattr(cls, name, wrap(cls, name))
        try:
            for mode in args.modes:
                cpu_linear.MODE = mode
                acc = {"plain": defaultdict(float), "spec": defaultdict(float)}
                for i, ids in enumerate(prompt_ids):
                    for kind in (("plain", "spec") if i % 2 == 0 else ("spec", "plain")):
                        clock.clear(), count.clear()
                        t = time.perf_counter()
                        res = go(ids, None if kind == "plain" else head)
                        wall = time.perf_counter() - t
                        a = acc[kind]
                        a["wall"] += wall
                        a["steps"] += res.stats.num_steps
                        a["tokens"] += res.stats.num_generated_tokens
                        a["target_step"] += sum(v for (w, r), v in clock.items()
                                                if w == "target" and r == (1 if kind == "plain" else args.gamma + 1))
                        a["target_other"] += sum(v for (w, r), v in clock.items() if w == "target")
                        a["drafter"] += sum(v for (w, _), v in clock.items() if w == "drafter")
                        a["drafter_calls"] += sum(c for (w, _), c in count.items() if w == "drafter")
                summary = {}
                for kind, a in acc.items():
                    other_target = a["target_other"] - a["target_step"]  # prefill (+ nothing else)
                    host = a["wall"] - a["target_other"] - a["drafter"]
                    n = a["steps"]
                    summary[kind] = {"steps": int(n), "tokens": int(a["tokens"]),
                                     "ms_per_step": round(1e3 * a["wall"] / n, 2),
                                     "target_forward_ms": round(1e3 * a["target_step"] / n, 2),
                                     "prefill_ms_per_step": round(1e3 * other_target / n, 2),
                                     "drafter_ms": round(1e3 * a["drafter"] / n, 2),  # (fc, layer, LM head)
                                     "drafter_calls_per_step": round(a["drafter_calls"] / n, 2),
                                     "host_ms": round(1e3 * host / n, 2)}
                p, s = acc["plain"], acc["spec"]
                summary["speedup"] = round((s["tokens"] / s["wall"]) / (p["tokens"] / p["wall"]), 3)
                summary["tau"] = round(s["tokens"] / s["steps"], 3)
                out[mode] = summary
        finally:
            for (cls, name), original in originals.items():
                setattr(cls, name, original)
    cpu_linear.MODE = "auto"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/smol_cpu_profile.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--repeats", type=int, default=20, help="forwards timed per setting (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--modes", nargs="+", choices=cpu_linear.MODES, default=["auto"])
    p.add_argument("--parts", nargs="+", choices=("forward", "engine"), default=["forward", "engine"])
    p.add_argument("--draft", default=None, help="feature head folder (default: the shipped one)")
    args = p.parse_args(argv)
    if min(args.threads, args.gamma, args.repeats, args.max_new_tokens) < 1:
        p.error("--threads, --gamma, --repeats and --max-new-tokens must be >= 1")
    torch.set_num_threads(args.threads)
    from specdec.cli.demo_chat import find_gguf, load_gguf
    from specdec.zoo.instructions import DEMO_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids, stop_token_ids

    target, tokenizer = load_gguf(find_gguf(None))
    prompt_ids = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS))
    result = {"threads": args.threads, "load_average": os.getloadavg()[0]}
    if "forward" in args.parts:
        result["forward"] = forward_part(args, target, prompt_ids[1])
    if "engine" in args.parts:
        result["engine"] = engine_part(args, target, prompt_ids, stop_token_ids(target, tokenizer))
    result["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
