"""α and τ of drafters (model folders and feature heads) on one target, through the engine.

    python scripts/feature_head_alpha.py --target DIR --data DATA --drafter DRAFT_DIR --drafter HEAD_DIR \
        [--untrained-head] [--prompts 12] [--max-new-tokens 48] [--gamma 4] --out results/head_alpha.json

Prompts: the first `--prompts` windows of DATA's validation stream (lengths 32, 38, 44, ...); temperatures 0
and 1, one seed. `--untrained-head` adds a head as the zoo trainer starts it (the target's last layer).
CUDA when present (bf16), else CPU (fp32). Writes JSON to --out and prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specdec
from specdec.fast.head import HeadConfig, is_feature_head
from specdec.fast.model import LlamaShape
from specdec.loading import load_model
from specdec.zoo.data import TokenData
from specdec.zoo.feature_head import TrainableHead


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="scripts/feature_head_alpha.py")
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", required=True, help="a prepared code folder in the target's tokenizer")
    parser.add_argument("--drafter", action="append", default=[], help="a draft model or feature head folder")
    parser.add_argument("--untrained-head", action="store_true")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    torch.set_num_threads(1 if not cuda else torch.get_num_threads())
    target = load_model(args.target, device=device, dtype=dtype, what="--target")
    data = TokenData.load(args.data)
    prompts = [row[: 32 + 6 * i].tolist() for i, row in enumerate(data.val_batches(args.prompts, 32 + 6 * args.prompts, 1)[0])]
    drafters = {}
    for folder in args.drafter:
        drafters[folder] = folder if is_feature_head(folder) else load_model(folder, device=device, dtype=dtype,
                                                                             what="--drafter")
    if args.untrained_head:
        head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)))
        head.init_from(target)
        drafters["untrained head"] = head.to_feature_head()
    results = {"device": torch.cuda.get_device_name() if cuda else "cpu", "prompts": len(prompts),
               "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "drafters": {}}
    for name, drafter in drafters.items():
        for temperature in (0.0, 1.0):
            res = specdec.generate(target, prompts, drafter=drafter, max_new_tokens=args.max_new_tokens,
                                   temperature=temperature, num_draft_tokens=args.gamma, eos_token_id=[],
                                   engine="fast", seed=0)
            results["drafters"].setdefault(name, {})[f"T={temperature:g}"] = {
                "alpha": res.stats.alpha, "tau": res.stats.mean_accepted_length}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
