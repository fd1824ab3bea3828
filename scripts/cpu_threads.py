"""Tokens/s of the demo pair with 1 vs 2 torch CPU threads (the measurement behind the CLI's default --threads).

    OMP_NUM_THREADS=2 python scripts/cpu_threads.py [--repeats 3] [--max-new-tokens 64]

Greedy, batch 1, γ = 4, the first three demo prompts; plain and speculative runs interleaved across thread
counts so that a drifting CPU slows every configuration alike; prints the median tokens/s per setting.
"""

import argparse
import statistics

import torch

import specdec
from specdec.cli.demo import DEMO_PAIR, PROMPTS
from specdec.loading import load_model, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    target = load_model(DEMO_PAIR / "target", device="cpu", what="target")
    draft = load_model(DEMO_PAIR / "draft", device="cpu", what="draft")
    tokenizer = load_tokenizer(DEMO_PAIR / "target")
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    runs = {(n, kind): [] for n in counts for kind in ("plain", "speculative")}
    with torch.inference_mode():
        for n in counts:  # warm-up
            torch.set_num_threads(n)
            specdec.generate(target, [prompts[0]], max_new_tokens=8, temperature=0)
        for _ in range(args.repeats):
            for n in counts:
                torch.set_num_threads(n)
                for kind, drafter in (("plain", None), ("speculative", draft)):
                    tokens = seconds = 0.0
                    for ids in prompts:
                        stats = specdec.generate(target, [ids], drafter=drafter, max_new_tokens=args.max_new_tokens,
                                                 temperature=0, num_draft_tokens=4, eos_token_id=[]).stats
                        tokens, seconds = tokens + stats.num_generated_tokens, seconds + stats.wall_time_s
                    runs[n, kind].append(tokens / seconds)
    for (n, kind), values in runs.items():
        print(f"threads={n} {kind:12s} median {statistics.median(values):6.1f} tok/s  runs {[round(v, 1) for v in values]}")


if __name__ == "__main__":
    main()
