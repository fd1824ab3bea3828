"""Beam search on the shipped demo pair, batch 1: the engine's beam groups (`specdec.beam_search(engine="fast")`)
against the same search on `fast.tree_lm.FastTreeLM` outside the engine (the wave-2 fast path), plain beams on the
engine (no drafter) and transformers' own `generate(num_beams=w)`. Tokens/s = the best beam's tokens over wall time,
summed over the 6 prompts, each configuration warmed up once first; every speculative row checks its beams equal the
plain ones.

Run:  python scripts/bench_engine_beams.py --device cuda --out $OUT/beams.json     (≈ 1 min on an H100)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.bench.demo_pair import PAIR_PROMPTS, load_pair
from specdec.engine import Engine, EngineConfig
from specdec.engine.beam import BeamParams
from specdec.fast.model import FastLlama
from specdec.fast.tree_lm import FastTreeLM
from specdec.loop.beam import BeamSearch
from specdec.loop.beam_rules import BeamConfig
from specdec.request import SamplingParams


def timed(fn, prompts, device):
    """fn(prompt) → (best-beam tokens, beams) per prompt → (results, tokens, seconds)."""
    fn(prompts[0])  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    results = [fn(p) for p in prompts]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return results, sum(len(r[0]) for r in results), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", help="float32 keeps the beam equality free of bf16 near-ties")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--draft-beams", type=int, default=4)
    parser.add_argument("--num-draft-tokens", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PAIR_PROMPTS))
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)
    target, draft, tokenizer = load_pair(device=args.device, dtype=args.dtype)
    device = target.device
    prompts = [tokenizer(p)["input_ids"] for p in PAIR_PROMPTS[: args.prompts]]
    w, u, gamma, n = args.num_beams, args.draft_beams, args.num_draft_tokens, args.max_new_tokens
    kw = dict(num_beams=w, max_new_tokens=n, eos_token_id=[])
    fast_target, fast_draft = FastLlama.from_hf(target), FastLlama.from_hf(draft)

    def engine(drafter):
        """One engine for every prompt (built here, outside the timing), a beam request per prompt."""
        built = Engine(target, drafter, EngineConfig(max_batch_size=w, max_seq_len=max(map(len, prompts)) + n))
        beams = BeamParams(w, u, gamma if drafter is not None else 0, num_return_sequences=w)
        params = SamplingParams(temperature=0, max_new_tokens=n)

        def run(prompt):
            rid = built.add_request(prompt, params, beams=beams)
            while built.has_unfinished():
                for out in built.step():
                    if out.request_id == rid and out.finished:
                        final = out
            return final.new_token_ids, [list(b) for b in final.beams]
        return run

    def tree_lm(prompt):
        config = BeamConfig(w, n, (), 1.0, False)
        res = BeamSearch(FastTreeLM(fast_target), FastTreeLM(fast_draft), config, u, gamma).run([prompt])
        return res.sequences[0][0], res.sequences[0]

    def hf(prompt):
        out = target.generate(torch.tensor([prompt], device=device), do_sample=False, num_beams=w, max_new_tokens=n,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                              pad_token_id=0, eos_token_id=None)
        return out[0, len(prompt):].tolist(), None

    rows, plain = [], None
    for name, fn in [("plain beams, engine (no drafter)", engine(None)),
                     (f"speculative beams, engine (w={w}, u={u}, γ={gamma})", engine(draft)),
                     (f"speculative beams, FastTreeLM outside the engine (w={w}, u={u}, γ={gamma})", tree_lm),
                     (f"transformers generate(num_beams={w})", hf)]:
        results, tokens, seconds = timed(fn, prompts, device)
        beams = [r[1] for r in results]
        if plain is None:
            plain = beams
        same = None if beams[0] is None else beams == plain
        rows.append({"name": name, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                     "identical_beams": same})
    base = rows[0]["tokens_per_s"]
    lines = [f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {args.dtype}, "
             f"{len(prompts)} prompts × {n} tokens, batch 1, no EOS",
             "| configuration | tokens/s | vs plain engine beams | identical beams |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f}x | "
                     f"{'-' if r['identical_beams'] is None else ('yes' if r['identical_beams'] else 'NO')} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "table": lines}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
