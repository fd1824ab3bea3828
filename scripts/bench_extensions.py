"""Measure the paper's extensions on the shipped demo pair (CPU): lenience, hierarchical drafts, speculative
beam search, token trees. Prints markdown tables (the ones in docs/EXTENSIONS.md) and writes a JSON file.

Run:  OMP_NUM_THREADS=1 python scripts/bench_extensions.py --part all --json /tmp/extensions.json
Each configuration decodes the 6 demo prompts one at a time (batch 1, one thread; at T = 1 with seeds 0, 1, 2,
as sampled runs vary a lot with the seed) and sums the CPU time of
this process (time.process_time: with one thread it is the compute time, steady on a shared machine where
wall time is not); tokens/s and speedups are computed from it.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import torch

import specdec
from specdec.bench.demo_pair import DEMO_PAIR, load_pair
from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS


def clock() -> float:
    # CPU seconds of this (one-thread) process: steady on a shared machine, where wall time is not
    return time.process_time()


SEEDS = {0.0: (0,), 1.0: (0, 1, 2)}  # sampled runs vary with the seed: T = 1 sums three seeds


def run_prompts(fn, prompts, temperature=0.0):
    """fn(prompt, seed) → result with .stats, for every prompt (and seed at T > 0) → (results, CPU seconds)."""
    t0 = clock()
    results = [fn(p, seed) for seed in SEEDS[temperature] for p in prompts]
    return results, clock() - t0


def fold(results):
    tokens = sum(r.stats.num_generated_tokens for r in results)
    calls = sum(r.stats.target_calls for r in results)
    beta = sum(r.stats.beta_sum for r in results)
    count = sum(r.stats.beta_count for r in results)
    algo = sum(r.stats.algorithm_tokens for r in results)
    row_steps = sum(r.stats.row_steps for r in results)
    return {"tokens": tokens, "target_calls": calls, "alpha": beta / count if count else None,
            "tau": algo / row_steps if row_steps else None, "drafter_calls": sum(r.stats.drafter_calls for r in results)}


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def print_table(title: str, header: str, rows: list[str]) -> None:
    """A Markdown section: `### title`, the header row, its rule, then `rows`."""
    print(f"\n### {title}\n")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    print("\n".join(rows))


def lenience(target, draft, ids, n, gamma):
    rows, out = [], []
    for temperature in (0.0, 1.0):
        plain, plain_s = run_prompts(lambda p, seed: specdec.generate(
            target, [p], None, max_new_tokens=n, temperature=temperature, seed=seed, eos_token_id=[], engine="hf"),
            ids, temperature)
        exact_text = [r.sequences[0] for r in plain] if temperature == 0 else None
        for leniency in (1.0, 0.5, 0.2, 0.1, 0.01):
            res, wall = run_prompts(lambda p, seed: specdec.generate(
                target, [p], draft, max_new_tokens=n, temperature=temperature, num_draft_tokens=gamma, seed=seed,
                eos_token_id=[], leniency=leniency, engine="hf"), ids, temperature)
            f = fold(res)
            same = None
            if exact_text is not None:
                same = sum(sum(a == b for a, b in zip(r.sequences[0], e)) for r, e in zip(res, exact_text)) / f["tokens"]
            row = {"temperature": temperature, "leniency": leniency, **f, "tok_s": f["tokens"] / wall,
                   "speedup": plain_s / wall, "same_as_exact": same}
            out.append(row)
            rows.append(f"| {temperature:g} | {leniency:g} | {fmt(f['alpha'], 3)} | {fmt(f['tau'])} | {f['target_calls']} | "
                        f"{f['tokens'] / wall:.1f} | {plain_s / wall:.2f}× | {fmt(same) if same is not None else '–'} |")
    print_table(f"Lenience (γ = {gamma}, {len(ids)} prompts × {n} tokens; T = 1: × 3 seeds)",
                "| T | l | α | τ | target calls | tokens/s | speedup vs plain | same tokens as exact (T=0) |", rows)
    return out


def stdlib_bigram(tokenizer, vocab, files=300):
    """A bigram table fitted on the first `files` stdlib modules (sorted paths), tokenized like the demo."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:files]
    seqs = [tokenizer(p.read_text(errors="ignore"))["input_ids"] for p in paths]
    return specdec.NGramDrafter(2, top_k_successors=16).fit(seqs, vocab)


def hierarchical(target, draft, tok, ids, n, gamma):
    from specdec.drafters.hierarchical import HierarchicalDrafter

    bigram = stdlib_bigram(tok, target.config.vocab_size)
    configs = [("draft model alone", lambda: draft, 0)]
    for k in (2, 4):
        configs.append((f"draft ← prompt lookup, k={k}", lambda k=k: HierarchicalDrafter(draft, specdec.PromptLookupDrafter(), k), k))
        configs.append((f"draft ← stdlib bigram, k={k}", lambda k=k: HierarchicalDrafter(draft, bigram, k), k))
    rows, out = [], []
    for temperature in (0.0, 1.0):
        plain, plain_s = run_prompts(lambda p, seed: specdec.generate(
            target, [p], None, max_new_tokens=n, temperature=temperature, seed=seed, eos_token_id=[], engine="hf"),
            ids, temperature)
        for name, make, k in configs:
            drafters = []

            def one(p, seed):
                d = make()
                drafters.append(d)
                return specdec.generate(target, [p], d, max_new_tokens=n, temperature=temperature, num_draft_tokens=gamma,
                                        seed=seed, eos_token_id=[], engine="hf")

            res, wall = run_prompts(one, ids, temperature)
            f = fold(res)
            steps = sum(r.stats.num_steps for r in res)
            if k:
                c = [d.counters for d in drafters]
                middle = sum(x.middle_calls for x in c)
                inner = sum(x.inner_accepted for x in c) / max(1, sum(x.inner_drafted for x in c))
            else:
                middle, inner = f["drafter_calls"], None
            draft_s = sum(r.stats.draft_time_s for r in res)  # wall time inside the loop
            row = {"temperature": temperature, "drafter": name, **f, "middle_calls_per_step": middle / steps,
                   "inner_acceptance": inner, "draft_s": draft_s, "tok_s": f["tokens"] / wall, "speedup": plain_s / wall}
            out.append(row)
            rows.append(f"| {temperature:g} | {name} | {fmt(f['alpha'], 3)} | {fmt(f['tau'])} | {middle / steps:.2f} | "
                        f"{fmt(inner)} | {draft_s:.2f} | {f['tokens'] / wall:.1f} | {plain_s / wall:.2f}× |")
    print_table(f"Hierarchical drafts (γ = {gamma}, {len(ids)} prompts × {n} tokens; T = 1: × 3 seeds)",
                "| T | drafter | α | τ | draft-model passes per step | inner acceptance | drafting time (s) | tokens/s | speedup vs plain |", rows)
    return out


def beams(target, draft, ids, n):
    rows, out = [], []
    for w in (2, 4):
        t0 = clock()
        for p in ids:
            target.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
                            num_beams=w, num_return_sequences=w, max_new_tokens=n, pad_token_id=0, eos_token_id=None)
        hf_s = clock() - t0
        plain, plain_s = run_prompts(lambda p, seed: specdec.beam_search(target, [p], None, num_beams=w, max_new_tokens=n,
                                                                         eos_token_id=[]), ids)
        reference = [r.sequences for r in plain]
        rows.append(f"| {w} | – | 0 | {sum(r.stats.target_calls for r in plain)} | 1.00 | {plain_s:.2f} | 1.00× | {hf_s:.2f} | yes |")
        for u in (w, 2 * w):
            for gamma in (1, 3, 5):
                res, wall = run_prompts(lambda p, seed: specdec.beam_search(target, [p], draft, num_beams=w, draft_beams=u,
                                                                      num_draft_tokens=gamma, max_new_tokens=n,
                                                                      eos_token_id=[]), ids)
                same = [r.sequences for r in res] == reference
                calls = sum(r.stats.target_calls for r in res)
                spp = sum(r.stats.beam_steps for r in res) / sum(r.stats.prompt_passes for r in res)
                out.append({"w": w, "u": u, "gamma": gamma, "target_calls": calls, "steps_per_pass": spp, "wall_s": wall,
                            "plain_wall_s": plain_s, "hf_wall_s": hf_s, "identical": same})
                rows.append(f"| {w} | {u} | {gamma} | {calls} | {spp:.2f} | {wall:.2f} | {plain_s / wall:.2f}× | {hf_s:.2f} | "
                            f"{'yes' if same else 'NO'} |")
    print_table(f"Speculative beam search ({len(ids)} prompts × {n} tokens, no EOS)",
                "| w | u | γ | target calls | beam steps per pass | CPU (s) | speedup vs plain beam | transformers beam (s) | identical beams |", rows)
    return out


def trees(target, draft, ids, n):
    rows, out = [], []
    for temperature in (0.0, 1.0):
        plain, plain_s = run_prompts(lambda p, seed: specdec.generate(
            target, [p], None, max_new_tokens=n, temperature=temperature, seed=seed, eos_token_id=[], engine="hf"),
            ids, temperature)
        configs = [("chain γ=4 (plain speculative)", None), ("[1,1,1,1]", [1, 1, 1, 1]), ("[2,2,1]", [2, 2, 1]),
                   ("[2,2,2,1]", [2, 2, 2, 1]), ("[3,2,1,1]", [3, 2, 1, 1]), ("[4,2,2]", [4, 2, 2])]
        chain_s = None
        for name, tree in configs:
            res, wall = run_prompts(lambda p, seed: specdec.generate(
                target, [p], draft, max_new_tokens=n, temperature=temperature, num_draft_tokens=4, seed=seed,
                eos_token_id=[], draft_tree=tree, engine="hf"), ids, temperature)
            f = fold(res)
            chain_s = wall if tree is None else chain_s
            out.append({"temperature": temperature, "tree": name, **f, "tok_s": f["tokens"] / wall,
                        "speedup": plain_s / wall, "vs_chain": chain_s / wall})
            rows.append(f"| {temperature:g} | {name} | {fmt(f['tau'])} | {f['target_calls']} | {f['drafter_calls']} | "
                        f"{f['tokens'] / wall:.1f} | {plain_s / wall:.2f}× | {chain_s / wall:.2f}× |")
    print_table(f"Token trees ({len(ids)} prompts × {n} tokens; T = 1: × 3 seeds; tree_mode without_replacement)",
                "| T | draft | τ | target calls | drafter calls | tokens/s | speedup vs plain | vs chain γ=4 |", rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["lenience", "hierarchical", "beam", "tree", "all"], default="all")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--beam-tokens", type=int, default=32)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft, tok = load_pair(DEMO_PAIR)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    # warm-up (first calls allocate)
    specdec.generate(target, ids[:1], draft, max_new_tokens=8, temperature=0, engine="hf")
    out = {}
    if args.part in ("lenience", "all"):
        out["lenience"] = lenience(target, draft, ids, args.max_new_tokens, args.num_draft_tokens)
    if args.part in ("hierarchical", "all"):
        out["hierarchical"] = hierarchical(target, draft, tok, ids, args.max_new_tokens, args.num_draft_tokens)
    if args.part in ("beam", "all"):
        out["beam"] = beams(target, draft, ids, args.beam_tokens)
    if args.part in ("tree", "all"):
        out["tree"] = trees(target, draft, ids, args.max_new_tokens)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
