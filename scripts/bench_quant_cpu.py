"""CPU products over GGUF-quantized weights, and the memory of a model that keeps them (issue 38's CPU half).

  python scripts/bench_quant_cpu.py gemm [--threads 2] [--rows 1 5]
      per SmolLM2-135M matrix shape (q|k|v, o, gate|up, down, the LM head): µs per product of specdec's quantized
      kernel (Q4_1; Q8_0 for the head, as the file has them), oneDNN's fp32 product on a packed copy (the engine's
      path before), and torch's weight-only CPU ops `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm` (group 32 /
      per channel: what they would cost, not exact for these formats)
  python scripts/bench_quant_cpu.py types [--threads 1] [--rows 1 5 8] [--kinds Q4_1 Q8_0 ...] [--rounds 5] [--isa 2]
      per block type (random values of its layout: 4-bit Q4_*, 8-bit Q5_* / Q6_K / Q8_0) at SmolLM2's gate|up and down
      shapes: µs per product of the quantized kernel at each row count, the types and row counts interleaved ROUNDS
      times (the minimum of each round's calls, then the median over rounds), and each row count's cost over one
      row's; one JSON line per type and shape, with the load average
  python scripts/bench_quant_cpu.py decode [--prompts 2] [--tokens 64]
      the chat demo's target (SmolLM2-135M-Instruct Q4_1, `specdec demo`'s GGUF) and shipped head: greedy tokens/s of
      plain and speculative decoding (γ 4) on the engine over its first prompts, after a warm-up, and whether the
      texts are identical; one JSON line. Run it twice, with and without SPECDEC_GGUF_WEIGHTS=dequantized
  python scripts/bench_quant_cpu.py step [--threads 1] [--repeats 5] [--context 128] [--gguf PATH]
      [--weights quantized,dequantized]
      the demo's target (or GGUF) as the engine's `FastLlama`, quantized (q8_mm) and dequantized (oneDNN fp32), in one
      process: ms per forward of 1 row (a decode step) and 5 rows (a γ-4 verify pass) after a CONTEXT-token
      prefill, the two models interleaved REPEATS times; one JSON line per model and row count (median, min, max)
  python scripts/bench_quant_cpu.py logits
      the demo's target kept quantized against transformers' dequantized float32 model: the logits' largest and
      mean difference, argmax agreement and KL on an 11-token prompt and 64 seeded random tokens; one JSON line each
  python scripts/bench_quant_cpu.py memory GGUF
      resident memory (RSS) the engine's model adds, the transformers model dropped: the quantized path
      (`SPECDEC_GGUF_WEIGHTS` unset) or the dense float32 one (`SPECDEC_GGUF_WEIGHTS=dequantized`), against the
      file's size — on the process's first load (with the modules transformers' load imports), what that left once
      the model was dropped, and on a second load (the model's own); the model's bytes against the file's; one
      JSON line

Benchmarks are not tests: nothing is asserted. The machine's load changes the times: quote medians of paired runs.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

SHAPES = {"wqkv": (960, 576), "wo": (576, 576), "w_gate_up": (3072, 576), "w_down": (576, 1536), "lm_head": (49152, 576)}


def _time_us(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e6)


def gemm(args) -> None:
    from gguf import GGMLQuantizationType, quants

    from specdec.fast.kernels import cpu_linear
    from specdec.fast.quant import from_blocks, kernel_name, quant_linear

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}; kernel: {kernel_name()}")
    for name, (n, k) in SHAPES.items():
        kind = "Q8_0" if name == "lm_head" else "Q4_1"
        w = rng.standard_normal((n, k)).astype(np.float32)
        weight = from_blocks(kind, quants.quantize(w, GGMLQuantizationType[kind]), (n, k))
        dense = weight.dequantize()
        int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.values().int() if kind == "Q4_1" else
                                                                   torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
        scales_zeros = torch.randn(k // 32, n, 2)
        int8, channel = torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n)
        repeats = 20 if n > 10000 else 200
        for rows in args.rows:
            x = torch.randn(rows, k)
            row = {"weight": name, "type": kind, "rows": rows,
                   "quant_us": _time_us(lambda: quant_linear(x, weight), repeats),
                   "onednn_fp32_us": _time_us(lambda: cpu_linear.linear(x, dense), repeats),
                   "torch_int4pack_us": _time_us(
                       lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, int4, 32, scales_zeros), repeats),
                   "torch_int8pack_us": _time_us(lambda: torch.ops.aten._weight_int8pack_mm(x, int8, channel), repeats)}
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}))


def _random_weight(kind: str, n: int, k: int, gen: torch.Generator):
    """A `QuantWeight` with random values of `kind`'s layout (speed only: the values are not a real model's)."""
    from specdec.fast.quant.weight import QuantWeight

    bits, group = (4 if kind.startswith("Q4") else 8), (16 if kind == "Q6_K" else 32)
    qs = (torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen) if bits == 4 else
          torch.randint(-32, 32, (n, k), dtype=torch.int8, generator=gen))
    scale = torch.rand(n, k // group, generator=gen) * 0.01
    offset = None if kind in ("Q8_0", "Q6_K", "Q5_0") else -torch.rand(n, k // group, generator=gen) * 0.1
    return QuantWeight(qs, scale, offset, bits, group, (n, k), kind)


def types(args) -> None:
    from specdec.fast.quant import kernel_name, quant_linear

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    shapes = {"gate_up": (3072, 576), "down": (576, 1536)}
    weights = {(kind, s): _random_weight(kind, *shapes[s], gen) for kind in args.kinds for s in shapes}
    xs = {(rows, s): torch.randn(rows, shapes[s][1], generator=gen) for rows in args.rows for s in shapes}
    times = {(key, rows): [] for key in weights for rows in args.rows}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for key, w in weights.items():
            for rows in args.rows:
                x = xs[(rows, key[1])]
                for _ in range(3):
                    quant_linear(x, w, isa=args.isa)
                best = float("inf")
                for _ in range(args.calls):
                    start = time.perf_counter()
                    quant_linear(x, w, isa=args.isa)
                    best = min(best, time.perf_counter() - start)
                times[(key, rows)].append(best * 1e6)
        load.append(os.getloadavg()[0])
    print(json.dumps({"kernel": kernel_name(), "isa": args.isa, "threads": args.threads, "rounds": args.rounds,
                      "load": [round(v, 1) for v in load]}))
    for key in weights:
        us = {rows: float(np.median(times[(key, rows)])) for rows in args.rows}
        print(json.dumps({"type": key[0], "shape": key[1], **{f"us_{r}": round(v, 1) for r, v in us.items()},
                          **{f"ratio_{r}_1": round(v / us[1], 2) for r, v in us.items() if r != 1 and 1 in us}}))


def _rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _trim() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # (freed heap pages back to the system: RSS then counts what is held)


def _engine_model(path: str):
    """The engine's model of the GGUF `path`, the transformers model it was built over dropped; and that model's
    parameter bytes."""
    from specdec.engine.build import build_model
    from specdec.loading import load_model

    model = load_model(path, device="cpu", dtype="float32", what="target")
    fast = build_model(model)
    hf_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    _trim()
    return fast, hf_bytes


def memory(args) -> None:
    import transformers  # noqa: F401 - imported before the baseline: its own pages are not the model's

    from specdec.fast.quant import kernel_available
    from specdec.fast.quant.attach import quantized_bytes

    kernel_available()  # (the extension's pages before the baseline too)
    _trim()
    base = _rss()
    fast, hf_bytes = _engine_model(args.gguf)
    cold = _rss() - base  # the first load in the process: with the imports of transformers' modeling stack
    quant = quantized_bytes(fast)
    dense = sum(p.numel() * p.element_size() for p in {id(p): p for p in fast.parameters() if not p.is_meta}.values())
    del fast
    _trim()
    left = _rss() - base  # nothing of the model is alive: the code and interpreter state those imports left
    base_warm = _rss()
    fast, _ = _engine_model(args.gguf)
    warm = _rss() - base_warm  # a second load in the same process: what the model itself adds
    size = Path(args.gguf).stat().st_size
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    print(json.dumps({"file": Path(args.gguf).name, "file_mib": mib(size),
                      "weights": os.environ.get("SPECDEC_GGUF_WEIGHTS", "quantized"),
                      "rss_added_mib": mib(cold), "rss_vs_file": round(cold / size, 2),
                      "rss_left_by_first_load_mib": mib(left),
                      "rss_added_second_load_mib": mib(warm), "rss_second_load_vs_file": round(warm / size, 2),
                      "quantized_mib": mib(quant), "dense_mib": mib(dense),
                      "model_vs_file": round((quant + dense) / size, 2), "transformers_model_mib": mib(hf_bytes),
                      "load_average": round(os.getloadavg()[0], 2)}))


def decode(args) -> None:
    import specdec
    from specdec.cli.demo_chat import SHIPPED_HEAD, find_gguf, load_gguf
    from specdec.zoo.instructions import DEMO_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids, stop_token_ids

    torch.set_num_threads(args.threads)
    target, tokenizer = load_gguf(find_gguf())
    prompts = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS)[: args.prompts])
    eos = stop_token_ids(target, tokenizer)
    arms = {"plain": {"drafter": None}, "speculative": {"drafter": str(SHIPPED_HEAD), "num_draft_tokens": 4}}
    tokens, seconds, texts = dict.fromkeys(arms, 0), dict.fromkeys(arms, 0.0), {arm: [] for arm in arms}
    with torch.inference_mode():
        for options in arms.values():  # warm-up: engines built and cached on the target
            specdec.generate(target, [prompts[0]], max_new_tokens=8, temperature=0, eos_token_id=eos, engine="fast",
                             **options)
        for ids in prompts:
            for arm, options in arms.items():
                result = specdec.generate(target, [ids], max_new_tokens=args.tokens, temperature=0, eos_token_id=eos,
                                          engine="fast", **options)
                tokens[arm] += len(result.sequences[0])
                seconds[arm] += len(result.sequences[0]) / result.stats.tokens_per_second
                texts[arm].append(result.sequences[0])
    print(json.dumps({"weights": os.environ.get("SPECDEC_GGUF_WEIGHTS", "quantized"), "threads": args.threads,
                      "prompts": len(prompts), "max_new_tokens": args.tokens,
                      **{f"{arm}_tokens_per_second": round(tokens[arm] / seconds[arm], 2) for arm in arms},
                      "identical": texts["plain"] == texts["speculative"]}))


def logits(args) -> None:
    from specdec.cli.demo_chat import find_gguf, load_gguf
    from specdec.fast.quant.attach import quantized_from_hf

    target, _ = load_gguf(find_gguf())
    fast = quantized_from_hf(target, weights="quantized")
    prompts = {"11 tokens": torch.tensor([[1, 504, 3458, 314, 260, 1345, 28, 339, 2000, 17, 5]]),
               "64 random tokens": torch.randint(100, 20000, (1, 64), generator=torch.Generator().manual_seed(0))}
    with torch.inference_mode():
        for name, ids in prompts.items():
            lq, lh = fast(ids, fast.new_cache(1, 128)), target(ids).logits
            d = (lq - lh).abs()
            p, q = torch.log_softmax(lh, -1), torch.log_softmax(lq, -1)
            kl = (p.exp() * (p - q)).sum(-1)
            print(json.dumps({"prompt": name, "max_abs_diff": round(d.max().item(), 3),
                              "max_abs_logit": round(lh.abs().max().item(), 2), "mean_abs_diff": round(d.mean().item(), 3),
                              "argmax_equal": f"{int((lq.argmax(-1) == lh.argmax(-1)).sum())}/{ids.shape[1]}",
                              "kl_mean": round(kl.mean().item(), 5), "kl_max": round(kl.max().item(), 5)}))


def step(args) -> None:
    from specdec.cli.demo_chat import find_gguf, load_gguf
    from specdec.fast.model import FastLlama
    from specdec.fast.quant.attach import quantized_from_hf

    torch.set_num_threads(args.threads)
    target, _ = load_gguf(find_gguf(args.gguf))
    build = {"quantized": lambda: quantized_from_hf(target, weights="quantized"),
             "dequantized": lambda: FastLlama.from_hf(target)}
    models = {name: build[name]() for name in args.weights.split(",")}
    prompt = torch.randint(100, 20000, (1, args.context), generator=torch.Generator().manual_seed(0))
    times = {(name, rows): [] for name in models for rows in (1, 5)}
    with torch.inference_mode():
        caches = {name: m.new_cache(1, args.context + 64) for name, m in models.items()}
        for name, m in models.items():
            m(prompt, caches[name])
        for _ in range(args.repeats):
            for name, m in models.items():
                for rows in (1, 5):
                    x = prompt[:, :rows]
                    for _ in range(2):  # (a warm call, then the timed one, at the same positions)
                        caches[name].lengths.fill_(args.context)  # (rewound: the prompt's K/V stay)
                        start = time.perf_counter()
                        m(x, caches[name])
                    times[(name, rows)].append((time.perf_counter() - start) * 1e3)
    for (name, rows), t in times.items():
        print(json.dumps({"weights": name, "rows": rows, "threads": args.threads, "context": args.context,
                          "ms_median": round(float(np.median(t)), 2), "ms_min": round(min(t), 2),
                          "ms_max": round(max(t), 2), "load": round(os.getloadavg()[0], 1)}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    st = sub.add_parser("step")
    st.add_argument("--threads", type=int, default=1)
    st.add_argument("--repeats", type=int, default=5)
    st.add_argument("--context", type=int, default=128)
    st.add_argument("--gguf", default=None, help="another GGUF than the demo's target (e.g. the Qwen pair's)")
    st.add_argument("--weights", default="quantized,dequantized", help="the arms, comma-separated")
    g = sub.add_parser("gemm")
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--rows", type=int, nargs="+", default=[1, 5])
    t = sub.add_parser("types")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--rows", type=int, nargs="+", default=[1, 5, 8])
    t.add_argument("--kinds", nargs="+", default=["Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--calls", type=int, default=20)
    t.add_argument("--isa", type=int, default=0, help="the kernel's path: 0 the best, 1 C++, 2 AVX2, 3 AVX-512 VNNI")
    d = sub.add_parser("decode")
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--prompts", type=int, default=2)
    d.add_argument("--tokens", type=int, default=64)
    sub.add_parser("logits")
    m = sub.add_parser("memory")
    m.add_argument("gguf")
    args = parser.parse_args(argv)
    {"gemm": gemm, "types": types, "decode": decode, "memory": memory, "step": step, "logits": logits}[args.what](args)


if __name__ == "__main__":
    main()
