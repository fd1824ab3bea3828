"""The CPU demo's verify-pass GEMMs: `F.linear` vs the weight-major product (`specdec.fast.kernels.cpu_linear`).

    python scripts/smol_cpu_gemm.py gemm --threads 1            # SmolLM2-135M's matrices, 1..8 rows, both products
    python scripts/smol_cpu_gemm.py demo --threads 2            # the demo's prompts, plain vs speculative, both ways

`gemm` times one pass over 30 layers' worth of distinct random matrices of SmolLM2-135M's shapes plus its LM head
(so the weights stream from memory as in the model), interleaving the products, and prints each median over a
one-row `F.linear` pass. `demo` runs `specdec demo`'s six prompts (greedy, γ = 4, the shipped head) with
`cpu_linear.FEW_ROWS` = 6 (the default) and 0 (F.linear everywhere) in alternation, and prints the speedup, the
verify pass in plain steps and whether every text is identical, per setting. Run both on a quiet machine: the ratios
move with the load (two threads under heavy load make every multi-row GEMM pathologically slow).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.fast.kernels import cpu_linear  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # one layer as FastLlama holds it: qkv, o, gate+up, down


def gemm(args) -> dict:
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.05 for _ in range(30) for o, i in SHAPES] + [torch.randn(49152, 576) * 0.05]
    out = {}
    for rows in args.rows:
        xs = [torch.randn(rows, w.shape[1]) for w in weights]
        one = [x[:1].contiguous() for x in xs]
        arms = {"linear_1row": lambda: [F.linear(x, w) for x, w in zip(one, weights)],
                "linear": lambda: [F.linear(x, w) for x, w in zip(xs, weights)],
                "weight_major": lambda: [cpu_linear.linear_weight_major(x, w) for x, w in zip(xs, weights)]}
        times = {k: [] for k in arms}
        for f in arms.values():
            f()
        for _ in range(args.repeats):
            for k, f in arms.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[rows] = {"ms": {k: round(1e3 * v, 1) for k, v in med.items()},
                     "vs_1row": {k: round(v / med["linear_1row"], 2) for k, v in med.items()}}
        print(rows, json.dumps(out[rows]), flush=True)
    return out


def demo(args) -> dict:
    import specdec
    from specdec.cli.demo import compare_runs
    from specdec.cli.demo_chat import SHIPPED_HEAD, find_gguf, load_gguf
    from specdec.zoo.instructions import DEMO_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids, stop_token_ids

    target, tokenizer = load_gguf(find_gguf(None))
    ids = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS))
    eos, head = stop_token_ids(target, tokenizer), str(args.draft or SHIPPED_HEAD)

    def go(prompt, drafter):
        return specdec.generate(target, [prompt], drafter=drafter, max_new_tokens=args.max_new_tokens, temperature=0,
                                num_draft_tokens=args.gamma, eos_token_id=eos, engine="fast")

    pairs = {mode: [] for mode in args.modes}
    with torch.inference_mode():
        for mode in args.modes:  # warm-up (and oneDNN's weight packing) for every product
            cpu_linear.MODE = mode
            go(ids[0], None), go(ids[0], head)
        for r in range(args.repeats):
            for i, prompt in enumerate(ids):
                shift = (i + r) % len(args.modes)  # rotate which product runs first
                for mode in args.modes[shift:] + args.modes[:shift]:
                    cpu_linear.MODE = mode
                    if (i + r) % 2:
                        fast = go(prompt, head)
                        base = go(prompt, None)
                    else:
                        base = go(prompt, None)
                        fast = go(prompt, head)
                    pairs[mode].append((base, fast))
    cpu_linear.MODE = "auto"
    out = {}
    for mode, runs in pairs.items():
        s = compare_runs(runs)
        out[mode] = {k: s[k] for k in ("identical", "alpha", "mean_accepted_length", "speedup",
                                       "verify_step_vs_plain_step", "cost_ratio", "plain_tokens_per_second",
                                       "speculative_tokens_per_second")}
    texts = {mode: [b.sequences for b, _ in runs] for mode, runs in pairs.items()}
    out["same_text_across_products"] = all(t == texts[args.modes[0]] for t in texts.values())
    print(json.dumps(out, indent=1))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/smol_cpu_gemm.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("gemm", "demo"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--draft", default=None, help="feature head folder (default: the shipped one)")
    p.add_argument("--modes", nargs="+", choices=cpu_linear.MODES, default=["auto", "linear"],
                   help="cpu_linear.MODE settings the demo compares (default: auto linear)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.max_new_tokens < 1 or args.gamma < 1:
        p.error("--threads and --repeats must be ≥ 1")
    torch.set_num_threads(args.threads)
    gemm(args) if args.what == "gemm" else demo(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
