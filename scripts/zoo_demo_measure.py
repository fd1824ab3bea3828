"""Measure the shipped demo pair on this CPU: α (temperatures 0 and 1) on held-out corpus text and on the
target's own greedy text, and one-token / five-token forward times. Prints one JSON object.

Run: .venv/bin/python scripts/zoo_demo_measure.py [--data data/code]   (numbers go into MODEL_CARD.md)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import specdec
from specdec.analysis import measure_alpha
from specdec.bench.demo_pair import DEMO_PAIR, load_pair
from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS


@torch.inference_mode()
def time_forward(model, context: int = 200, new: int = 1, reps: int = 40) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, context))
    out = model(ids, use_cache=True)
    cache = out.past_key_values
    step = torch.randint(0, model.config.vocab_size, (1, new))
    times = []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        model(step, past_key_values=cache, use_cache=True)
        dt = time.perf_counter() - t0
        cache.crop(-new)  # 5.24 takes "tokens to remove"
        if i >= 5:
            times.append(dt)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/code", help="prepared code folder (held-out split)")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--window-len", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft, tok = load_pair(DEMO_PAIR)
    out: dict = {"threads": 1, "target_params": sum(p.numel() for p in target.parameters()),
                 "draft_params": sum(p.numel() for p in draft.parameters())}
    out["weights_MiB"] = round(sum(p.stat().st_size for p in DEMO_PAIR.glob("*/*.safetensors")) / 2**20, 2)
    # α on held-out corpus text (validation files, never trained on)
    from specdec.zoo.data import TokenData

    data = TokenData.load(args.data)
    windows = [w.tolist() for b in data.val_batches(8, args.window_len - 1, args.windows // 8) for w in b]
    for t in (0.0, 1.0):
        out[f"alpha_heldout_T{t:g}"] = measure_alpha(target, draft, windows, temperature=t).alpha
    # α on the target's own greedy text from the demo prompts (what `specdec demo` verifies)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    res = specdec.generate(target, ids, drafter=None, max_new_tokens=128, temperature=0)
    seqs = [p + s for p, s in zip(ids, res.sequences)]
    for t in (0.0, 1.0):
        out[f"alpha_greedy_text_T{t:g}"] = measure_alpha(target, draft, seqs, prompt_lengths=[len(p) for p in ids],
                                                         temperature=t).alpha
    # forward times with a KV cache, batch 1, 200 tokens of context, fp32, median of 40
    with torch.inference_mode():
        for name, model in (("target", target), ("draft", draft)):
            for new in (1, 5):
                out[f"{name}_forward_{new}tok_ms"] = round(1e3 * time_forward(model, context=200, new=new), 2)
    out["c_one_token"] = round(out["draft_forward_1tok_ms"] / out["target_forward_1tok_ms"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
