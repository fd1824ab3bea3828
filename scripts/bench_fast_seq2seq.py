"""The fast encoder-decoder path against the transformers path, on the EnDe tables' model shapes (one GPU, ~1 min).

    python scripts/bench_fast_seq2seq.py --out /tmp/out/fast_seq2seq.json [--pair DIR] [--device cuda]

Without --pair the models are randomly initialized with the `ende-tables` preset's shapes (target 6+6 × 512,
drafts "small" 1+1 × 128 and "base" 2+2 × 256; random drafts agree little with the target, so their α and
speedups mean nothing: read c and tokens/s). With --pair DIR (a folder from `train_pair`: target/, draft0/,
draft1/) the trained models are loaded. For each path, batch 1 over --sources random sources: plain decoding
tokens/s, and per draft and γ: tokens/s, speedup over that path's plain decoding, α, c (draft time per
drafted token over verify time). Also checks that the two paths' greedy outputs are the same. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

import specdec
from specdec.bench.ende_tables import ENDE_TABLES_PRESET, speed_models
from specdec.metrics import SpecStats


def load_models(pair: Path | None, vocab: int, device: str):
    if pair is not None:
        from transformers import AutoModelForSeq2SeqLM

        def load(name):
            return AutoModelForSeq2SeqLM.from_pretrained(str(pair / name), dtype=torch.float32).to(device).eval()

        drafts = {n: f"draft{i}" for i, n in enumerate(("small", "base")) if (pair / f"draft{i}").is_dir()}
        return load("target"), {n: load(folder) for n, folder in drafts.items()}
    from specdec.zoo.models import build_model

    target = build_model(ENDE_TABLES_PRESET.target, vocab, seed=0).to(device).eval()
    drafts = {n: build_model(r.shape, vocab, seed=1 + i).to(device).eval()
              for i, (n, r) in enumerate(zip(("small", "base"), ENDE_TABLES_PRESET.drafts))}
    return target, drafts


def timed(target, drafter, sources, gamma, max_new_tokens, temperature):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    results = [specdec.generate(target, [s], drafter=drafter, max_new_tokens=max_new_tokens, temperature=temperature,
                                num_draft_tokens=gamma, seed=i, eos_token_id=[]) for i, s in enumerate(sources)]
    return SpecStats.pooled([r.stats for r in results]), [r.sequences[0] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pair", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gammas", default="1,3,5")
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]
    target, drafts = load_models(args.pair, args.vocab, args.device)
    vocab = target.config.vocab_size
    rng = random.Random(0)
    sources = [[rng.randrange(3, vocab) for _ in range(rng.randrange(5, 60))] + [2] for _ in range(args.sources)]
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
           "torch": torch.__version__, "pair": str(args.pair) if args.pair else "random (ende-tables shapes)",
           "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "paths": {}}
    outputs = {}
    for mode in ("never", "always"):
        t0 = time.perf_counter()
        tgt, drs, path = speed_models(target, drafts, max(gammas), mode)
        rows = []
        for warm_and_time in (False, True):  # the first pass captures graphs / warms kernels, untimed
            plain, seqs = timed(tgt, None, sources, 1, args.max_new_tokens, args.temperature)
            rows = [{"drafter": "plain", "tokens_per_s": round(plain.tokens_per_second, 1)}]
            outputs[path] = seqs
            for name, d in drs.items():
                for g in gammas:
                    s, _ = timed(tgt, d, sources, g, args.max_new_tokens, args.temperature)
                    rows.append({"drafter": name, "gamma": g, "tokens_per_s": round(s.tokens_per_second, 1),
                                 "speedup": round(s.tokens_per_second / plain.tokens_per_second, 3),
                                 "alpha": s.alpha, "c": s.cost_ratio, "tau": s.mean_accepted_length})
        out["paths"][path] = {"rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"== {path} path ({out['paths'][path]['seconds']} s)")
        for r in rows:
            print("  " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    same = sum(a == b for a, b in zip(outputs["fast"], outputs["transformers"]))
    out["greedy_rows_equal"] = f"{same}/{len(sources)}" if args.temperature == 0 else "n/a (sampling)"
    print(f"plain outputs equal on both paths: {out['greedy_rows_equal']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
