"""Reports of the EnDe paper-tables run (`specdec.bench.ende_tables`): the Markdown section for
docs/PAPER_TABLES.md with the paper's numbers beside ours, and the speedup plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specdec.bench.alpha_table import paper_alpha

DRAFT_NAMES = ("small", "base")  # the run's draft0, draft1

# The paper's Table 2 (EnDe rows; T5-XXL target on TPU-v4, batch 1): drafter, T, γ, α, speedup.
PAPER_TABLE2_ENDE = (
    ("T5-small", 0.0, 7, 0.75, 3.4), ("T5-base", 0.0, 7, 0.80, 2.8), ("T5-large", 0.0, 7, 0.82, 1.7),
    ("T5-small", 1.0, 7, 0.62, 2.6), ("T5-base", 1.0, 5, 0.68, 2.4), ("T5-large", 1.0, 3, 0.71, 1.4),
)
# The paper's Table 4, the EnDe rows quoted in /work/shared/PAPER.md: drafter, T, α, c, predicted, measured.
PAPER_TABLE4_ENDE = (("T5-small", 0.0, 0.75, 0.02, 3.2, 3.4), ("T5-large", 0.0, 0.82, 0.11, 2.5, 1.7))
# our drafts' counterparts in the paper (by rank of size)
PAPER_NAME = {"small": "T5-small", "base": "T5-base", "unigram": "unigram", "bigram": "bigram"}


def _f(value, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _alphas(draft: dict) -> str:
    before, after = draft.get("alpha_before") or {}, draft.get("alpha_after") or {}
    return ", ".join(f"T={k}: {before[k]:.3f} → {after[k]:.3f}" for k in after if k in before) or "–"


def _score(q: dict) -> str:
    if "bleu" not in q:
        return f"pending ({q.get('pending')})"
    of = f" of {q['of']}" if q.get("of") and q["of"] != q["sentences"] else ""
    return f"BLEU {q['bleu']}, chrF {q['chrf']} ({q['sentences']}{of} sentences)"


def _quality_line(result: dict) -> str:
    """Both test sets: in-domain (random held-out messages) and out-of-domain (whole held-out catalogs).
    Results of the older one-set runs (the held-out catalogs in "quality") read as before."""
    q, ood = result.get("quality", {}), result.get("quality_ood")
    catalogs = ", ".join(result.get("ood_catalogs") or result.get("val_catalogs") or [])
    signature = next((x["bleu_signature"] for x in (q, ood or {}) if "bleu_signature" in x), None)
    sig = f" (sacrebleu `{signature}`)" if signature else ""
    if ood is None and "val_set" not in result:  # a run from before the in-domain split
        return (f"**Translation quality** of the target (greedy) on the held-out catalogs ({catalogs}): "
                f"{_score(q)}{sig}.")
    line = (f"**Translation quality** of the target (greedy): in-domain test set (random held-out messages, no "
            f"English message also in training; the analog of WMT's news test sets): {_score(q)}")
    if ood is not None:
        line += f"; out-of-domain (whole catalogs of other programs: {catalogs}): {_score(ood)}"
    return line + f"{sig}."


def ende_markdown(result: dict) -> str:
    """The EnDe section of docs/PAPER_TABLES.md: quality, Tables 3, 2, 4 with the paper's numbers beside ours."""
    p = result.get("params", {})
    lines = [f"Measured on {result.get('device_name')} (torch {result.get('torch')}); target "
             f"{p.get('target', 0) / 1e6:.1f}M parameters, drafts "
             + ", ".join(f"{n} {p[n] / 1e6:.2f}M" for n in DRAFT_NAMES if n in p) + ".", ""]
    train = result.get("training")
    if train:
        t = train["target"]
        drafts = "; ".join(f"{d['name']}: {d.get('params_ratio')}× fewer parameters, {d.get('seconds')} s of "
                           f"pre-training, α before → after distillation {_alphas(d)}" for d in train["drafts"])
        lines += [f"**Training** ({train.get('total_seconds')} s): target {t.get('steps')} steps in "
                  f"{t.get('seconds')} s, held-out loss {_f(t.get('val_loss'))}; {drafts}.", ""]
    lines += [_quality_line(result), ""]
    lines += ["**Table 3 analog** (α = mean Σ min(p, q), exact, on the target's own translations):", "",
              "| drafter | T | α (ours) | positions | paper α (T5-XXL EnDe) |", "|---|---|---|---|---|"]
    for r in result.get("table3", []):
        paper = paper_alpha("T5-XXL (EnDe)", PAPER_NAME.get(r["drafter"], ""), r["temperature"])
        lines.append(f"| {r['drafter']} | {r['temperature']:g} | {r['alpha']:.3f} | {r['positions']} | "
                     f"{_f(paper, '.2f')} |")
    path = ("fast encoder-decoder path (specdec.fast.seq2seq, CUDA graphs)" if result.get("table2_path") == "fast"
            else "transformers encoder-decoder path")
    lines += ["", f"**Table 2 analog** (batch 1, {path}, tokens/s and speedup over plain). α here is the mean β "
              "over the positions this run verified (which depend on γ: a bonus token's position is never verified), "
              "on fewer sentences; Table 3's α is over every position of 512 translations. c is a draft token's time "
              "over a verification's (the bigram table runs no forward pass: its c is the eager table lookup's time "
              "per drafted token).",
              "", "| drafter | T | γ | α | τ | c | speedup (ours) | Thm 3.8 from this run |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result.get("table2", []):
        if r["drafter"] == "plain":
            lines.append(f"| plain | {r['temperature']:g} | – | – | – | – | {r['tokens_per_s']:.1f} tok/s | – |")
            continue
        lines.append(f"| {r['drafter']} | {r['temperature']:g} | {r['gamma']} | {_f(r['alpha'])} | {r['tau']:.2f} | "
                     f"{_f(r['cost_ratio'])} | {r['speedup']:.2f}× | {_f(r['predicted_speedup'], '.2f')}× |")
    lines += ["", "Paper (T5-XXL on TPU-v4): " + "; ".join(f"{d} T={t:g} γ={g}: α {a}, {s}×"
                                                       for d, t, g, a, s in PAPER_TABLE2_ENDE) + ".", "",
              "**Table 4 analog** (predicted from α and c by Thm 3.8 vs measured):", "",
              "| drafter | T | α | c | γ* | predicted | measured at γ* | best measured (γ) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result.get("table4", []):
        gamma = r["predicted_gamma"] or "0 (plain)"
        lines.append(f"| {r['drafter']} | {r['temperature']:g} | {r['alpha']:.3f} | {r['cost_ratio']:.3f} | "
                     f"{gamma} | {r['predicted_speedup']:.2f}× | {r['measured_speedup']:.2f}× "
                     f"(γ={r['measured_gamma']}) | {r['best_measured_speedup']:.2f}× ({r['best_measured_gamma']}) |")
    lines += ["", "Paper: " + "; ".join(f"{d} T={t:g}: α {a}, c {c}, predicted {pr}×, measured {m}×"
                                        for d, t, a, c, pr, m in PAPER_TABLE4_ENDE) + "."]
    return "\n".join(lines)


def plot_speedups(rows: Sequence[dict], path: str | Path) -> Path:
    """Speedup vs γ, one line per drafter, one panel per temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(4.5 * len(temps), 3.4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for name in dict.fromkeys(r["drafter"] for r in rows if r["drafter"] != "plain"):
            pts = sorted((r["gamma"], r["speedup"]) for r in rows if r["drafter"] == name and r["temperature"] == t)
            ax.plot([g for g, _ in pts], [s for _, s in pts], marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("γ")
        ax.set_ylabel("speedup over plain")
        ax.set_title(f"EnDe, T={t:g}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def translation_samples(rows: Sequence[dict], per_set: dict[str, int] | None = None, seed: int = 0) -> str:
    """A seeded random (not hand-picked) sample of the target's greedy translations beside the references, as
    Markdown: `rows` are translations.jsonl lines ({"set", "en", "hyp", "ref"}); `per_set` says how many per set."""
    import random

    per_set = per_set or {"val": 10, "ood": 4}
    names = {"val": "in-domain", "ood": "out-of-domain"}

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [f"**Sample translations** (greedy; {', '.join(f'{n} {names.get(s, s)}' for s, n in per_set.items())}, "
             f"drawn with random.Random({seed}), not picked):", "",
             "| set | English | ours | reference |", "|---|---|---|---|"]
    rng = random.Random(seed)
    for split, n in per_set.items():
        chosen = [r for r in rows if r.get("set", "val") == split]
        for r in rng.sample(chosen, min(n, len(chosen))):
            lines.append(f"| {names.get(split, split)} | {cell(r['en'])} | {cell(r['hyp'])} | {cell(r['ref'])} |")
    return "\n".join(lines)
