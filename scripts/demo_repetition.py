"""How repetitive the demo pair's greedy completions are (the measure next to α and the speedup in its model card).

    python scripts/demo_repetition.py [--max-new-tokens 128]

For each built-in demo prompt: the share of non-empty completion lines that repeat an earlier line of the same
completion, and the share of distinct token 4-grams among all 4-grams of the completion (1.0 = no repetition).
"""

import argparse

import torch

import specdec
from specdec.bench.demo_pair import DEMO_PAIR
from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS
from specdec.loading import load_model, load_tokenizer


def repetition(text: str, ids: list[int]) -> tuple[int, int, int, int]:
    """(repeated lines, non-empty lines, distinct 4-grams, 4-grams)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    seen, repeated = set(), 0
    for line in lines:
        repeated += line in seen
        seen.add(line)
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    return repeated, len(lines), len(set(grams)), len(grams)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = load_model(DEMO_PAIR / "target", device="cpu", what="target")
    tokenizer = load_tokenizer(DEMO_PAIR / "target")
    total = [0, 0, 0, 0]
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer(prompt)["input_ids"]
            out = specdec.generate(target, [ids], max_new_tokens=args.max_new_tokens, temperature=0,
                                   eos_token_id=tokenizer.eos_token_id).sequences[0]
            counts = repetition(tokenizer.decode(out), out)
            total = [a + b for a, b in zip(total, counts)]
            print(f"{counts[0]:3d}/{counts[1]:3d} repeated lines, {counts[2]:3d}/{counts[3]:3d} distinct 4-grams  "
                  f"{prompt.splitlines()[-1]!r}")
    print(f"all: repeated lines {total[0]}/{total[1]} = {total[0] / max(total[1], 1):.2f}, "
          f"distinct 4-grams {total[2]}/{total[3]} = {total[2] / max(total[3], 1):.2f}")


if __name__ == "__main__":
    main()
