"""The paper's Table 3 analog: α of unigram, bigram and model drafters at temperatures 0 and 1, measured exactly.

α = E[β], β = Σ_x min(p(x), q(x)) (Cor 3.6), computed by `specdec.analysis.measure_alpha` from the full
standardized distributions p (target) and q (drafter), teacher-forced on

- `generated`: text the target itself produced at the same temperature from held-out prompts (the paper's
  α is an expectation over the target's own output: greedy text for T = 0, sampled text for T = 1), and
- `heldout`: held-out corpus text as it is (what the drafter would see on real data).

N-gram drafters enter `measure_alpha` through `NGramLM`, a module whose logits are log q(· | previous
token) of a fitted `specdec.NGramDrafter`, so one code path measures every drafter.
`code_pair_table3` runs the whole measurement on the shipped demo pair (Python code); `PAPER_TABLE3`
holds the paper's numbers for the side-by-side table in docs/PAPER_TABLES.md.
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from specdec.analysis import measure_alpha
from specdec.drafters.ngram import NGramDrafter

logger = logging.getLogger(__name__)

# The paper's Table 3 (Leviathan et al. 2023): (target, drafter, temperature, α).
PAPER_TABLE3: tuple[tuple[str, str, float, float], ...] = (
    ("GPT-like 97M (lm1b)", "unigram", 0.0, 0.03), ("GPT-like 97M (lm1b)", "bigram", 0.0, 0.05),
    ("GPT-like 97M (lm1b)", "GPT-like 6M", 0.0, 0.88), ("GPT-like 97M (lm1b)", "unigram", 1.0, 0.03),
    ("GPT-like 97M (lm1b)", "bigram", 1.0, 0.05), ("GPT-like 97M (lm1b)", "GPT-like 6M", 1.0, 0.89),
    ("T5-XXL (EnDe)", "unigram", 0.0, 0.08), ("T5-XXL (EnDe)", "bigram", 0.0, 0.20),
    ("T5-XXL (EnDe)", "T5-small", 0.0, 0.75), ("T5-XXL (EnDe)", "T5-base", 0.0, 0.80),
    ("T5-XXL (EnDe)", "T5-large", 0.0, 0.82), ("T5-XXL (EnDe)", "unigram", 1.0, 0.07),
    ("T5-XXL (EnDe)", "bigram", 1.0, 0.19), ("T5-XXL (EnDe)", "T5-small", 1.0, 0.62),
    ("T5-XXL (EnDe)", "T5-base", 1.0, 0.68), ("T5-XXL (EnDe)", "T5-large", 1.0, 0.71),
    ("T5-XXL (CNNDM)", "unigram", 0.0, 0.13), ("T5-XXL (CNNDM)", "bigram", 0.0, 0.23),
    ("T5-XXL (CNNDM)", "T5-small", 0.0, 0.65), ("T5-XXL (CNNDM)", "T5-base", 0.0, 0.73),
    ("T5-XXL (CNNDM)", "T5-large", 0.0, 0.74), ("T5-XXL (CNNDM)", "unigram", 1.0, 0.08),
    ("T5-XXL (CNNDM)", "bigram", 1.0, 0.16), ("T5-XXL (CNNDM)", "T5-small", 1.0, 0.53),
    ("T5-XXL (CNNDM)", "T5-base", 1.0, 0.55), ("T5-XXL (CNNDM)", "T5-large", 1.0, 0.56),
    ("LaMDA 137B", "LaMDA 100M", 0.0, 0.61), ("LaMDA 137B", "LaMDA 2B", 0.0, 0.71),
    ("LaMDA 137B", "LaMDA 8B", 0.0, 0.75), ("LaMDA 137B", "LaMDA 100M", 1.0, 0.57),
    ("LaMDA 137B", "LaMDA 2B", 1.0, 0.71), ("LaMDA 137B", "LaMDA 8B", 1.0, 0.74),
)


def paper_alpha(target_prefix: str, drafter: str, temperature: float) -> float | None:
    """The paper's α for the first Table 3 row whose target starts with `target_prefix`."""
    for target, name, t, alpha in PAPER_TABLE3:
        if target.startswith(target_prefix) and name == drafter and t == temperature:
            return alpha
    return None


class NGramLM(torch.nn.Module):
    """A fitted `NGramDrafter` as a causal LM: `forward(input_ids [B, T]).logits [B, T, V]` = log q(· | token t).

    Only for measuring: `measure_alpha` standardizes these logits exactly as the drafter standardizes its
    table when it proposes (temperature, top-k, top-p on log q), so β is the drafter's real β.
    """

    def __init__(self, drafter: NGramDrafter):
        super().__init__()
        if drafter.unigram is None:
            raise ValueError("drafter is not fitted: call .fit(sequences, vocab_size) first")
        self.drafter = drafter
        self._anchor = torch.nn.Parameter(torch.zeros(0), requires_grad=False)  # gives the module a device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        del attention_mask  # q depends on one previous token only
        q = self.drafter._distribution(input_ids.flatten().cpu())  # [B·T, V]
        logits = q.clamp_min(1e-30).log().view(*input_ids.shape, -1)
        return SimpleNamespace(logits=logits.to(input_ids.device))


@dataclass(frozen=True)
class AlphaRow:
    drafter: str
    temperature: float
    text: str  # "generated" (the target's own text at this temperature) or "heldout" (corpus text)
    alpha: float
    positions: int


@torch.inference_mode()
def target_text(target, prompts: Sequence[Sequence[int]], new_tokens: int, temperature: float, seed: int = 0,
                batch_size: int = 16) -> list[list[int]]:
    """prompt + the target's own continuation (plain decoding via `specdec.generate`, cut at EOS)."""
    import specdec

    out = []
    for lo in range(0, len(prompts), batch_size):
        batch = [list(p) for p in prompts[lo : lo + batch_size]]
        res = specdec.generate(target, batch, drafter=None, max_new_tokens=new_tokens, temperature=temperature,
                               seed=seed + lo)
        out += [p + s for p, s in zip(batch, res.sequences)]
    return out


def alpha_table(
    target: torch.nn.Module,
    drafters: Mapping[str, torch.nn.Module],
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int = 128,
    temperatures: Sequence[float] = (0.0, 1.0),
    heldout: Sequence[Sequence[int]] | None = None,
    seed: int = 0,
) -> list[AlphaRow]:
    """α for every drafter × temperature: on the target's own text from `prompts` (generated once per
    temperature and shared by all drafters) and, if given, teacher-forced on `heldout` sequences (each
    `prompts[i]` followed by real text; β is measured on the part after the prompt)."""
    starts = [len(p) for p in prompts]
    if heldout is not None and (len(heldout) != len(prompts)
                                or any(list(h[: len(p)]) != list(p) for h, p in zip(heldout, prompts))):
        raise ValueError("heldout must hold one sequence per prompt, each starting with its prompt")
    rows = []
    for t in temperatures:
        seqs = target_text(target, prompts, new_tokens, t, seed=seed)
        for name, drafter in drafters.items():
            m = measure_alpha(target, drafter, seqs, prompt_lengths=starts, temperature=t)
            rows.append(AlphaRow(name, t, "generated", m.alpha, m.num_positions))
            if heldout:
                h = measure_alpha(target, drafter, heldout, prompt_lengths=starts, temperature=t)
                rows.append(AlphaRow(name, t, "heldout", h.alpha, h.num_positions))
            logger.info("α(%s, T=%g) = %.3f", name, t, m.alpha)
    return rows


# ------------------------------------------------------------------------------- the code pair


def ngram_fitting_tokens(tokenizer, max_tokens: int, val_fraction: float = 0.01,
                         roots=None) -> tuple[list[list[int]], dict]:
    """Training-split Python files (the zoo's split: content hash ≥ val_fraction), in hash order, each file
    followed by EOS as in the zoo's streams, until `max_tokens`: the n-gram drafters' training text."""
    from specdec.zoo.corpus import code_documents

    docs = sorted((d for d in code_documents(roots, val_fraction=val_fraction) if d.split == "train"),
                  key=lambda d: d.sha256)
    eos = tokenizer.eos_token_id
    seqs, total = [], 0
    backend = tokenizer.backend_tokenizer
    for lo in range(0, len(docs), 256):
        for enc in backend.encode_batch([d.text for d in docs[lo : lo + 256]], add_special_tokens=False):
            seqs.append(enc.ids + [eos])
            total += len(seqs[-1])
            if total >= max_tokens:
                return seqs, {"files": len(seqs), "tokens": total}
    return seqs, {"files": len(seqs), "tokens": total}


def code_pair_table3(
    pair_dir: str | Path | None = None,
    *,
    num_prompts: int = 16,
    prompt_tokens: int = 128,
    new_tokens: int = 256,
    ngram_tokens: int = 5_000_000,
    seed: int = 0,
    extra_drafters: dict[str, str | Path] | None = None,
) -> dict:
    """The Table 3 analog on the shipped demo pair: unigram, bigram (fitted on `ngram_tokens` tokens of
    training-split Python) and the pair's one-layer drafter, at T = 0 and T = 1; `extra_drafters` (name →
    model folder, e.g. from scripts/code_small_vs_distilled.py) add rows. Returns a JSON-ready dict."""
    from specdec.bench.demo_pair import DEMO_PAIR, load_pair
    from specdec.bench.workloads import code_workload
    from specdec.loading import load_model

    t0 = time.perf_counter()
    target, draft, tokenizer = load_pair(Path(pair_dir) if pair_dir else DEMO_PAIR)
    vocab = target.config.vocab_size
    extra = {name: load_model(folder, device="cpu", dtype="float32", what=f"extra drafter {name!r}")
             for name, folder in (extra_drafters or {}).items()}
    for name, model in extra.items():
        if model.config.vocab_size != vocab:
            raise ValueError(f"extra drafter {name!r}: {model.config.vocab_size} tokens, the target has {vocab}")
    fit_seqs, fit_meta = ngram_fitting_tokens(tokenizer, ngram_tokens)
    drafters = {"unigram": NGramLM(NGramDrafter(1).fit(fit_seqs, vocab)),
                "bigram": NGramLM(NGramDrafter(2).fit(fit_seqs, vocab)),
                "small model (1 layer, distilled)": draft, **extra}
    del fit_seqs
    # held-out stdlib files (the zoo's validation split): a prompt of `prompt_tokens` tokens from each
    # file's first def/class; the file's real next `new_tokens` tokens are the `heldout` text
    work = code_workload(tokenizer, num_prompts=num_prompts, prompt_tokens=prompt_tokens + new_tokens)
    heldout = [list(p) for p in work.prompts]
    prompts = [h[: len(h) - new_tokens] for h in heldout]
    rows = alpha_table(target, drafters, prompts, new_tokens=new_tokens, heldout=heldout, seed=seed)
    return {
        "pair": str(pair_dir) if pair_dir else "specdec/assets/demo_pair",
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "extra_drafters": {name: str(folder) for name, folder in (extra_drafters or {}).items()},
        "ngram_fit": fit_meta,
        "prompts": {"count": len(prompts), "tokens": prompt_tokens, "new_tokens": new_tokens,
                    "sources": list(work.sources)},
        "rows": [asdict(r) for r in rows],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def image_pair_table3(pair_dir: str | Path | None = None, *, samples_per_class: int = 20, seed: int = 0) -> dict:
    """The Table 3 analog on the shipped digit-image pair: unigram and bigram tables fitted on the training
    images (shifts included) and the pair's drafter, α on the target's own images from `<s> <digit d>`
    (T = 0: the ten greedy images; T = 1: `samples_per_class` sampled images per class)."""
    from specdec.zoo.images import IMAGE_PAIR, load_digits_data, load_image_pair

    t0 = time.perf_counter()
    pair = load_image_pair(pair_dir or IMAGE_PAIR)
    layout = pair.layout
    data = load_digits_data(layout)
    fit = data.train.tolist()
    drafters = {"unigram": NGramLM(NGramDrafter(1).fit(fit, layout.vocab_size)),
                "bigram": NGramLM(NGramDrafter(2).fit(fit, layout.vocab_size)),
                "small model (1 layer, distilled)": pair.draft}
    rows = []
    for t, per_class in ((0.0, 1), (1.0, samples_per_class)):
        prompts = [layout.prompt(d) for d in range(layout.num_classes) for _ in range(per_class)]
        rows += alpha_table(pair.target, drafters, prompts, new_tokens=layout.num_pixels, temperatures=(t,),
                            seed=seed)
    return {"pair": str(pair_dir) if pair_dir else "specdec/assets/image_pair",
            "target_params": sum(p.numel() for p in pair.target.parameters()),
            "draft_params": sum(p.numel() for p in pair.draft.parameters()),
            "ngram_fit": {"sequences": len(fit), "tokens": sum(len(r) for r in fit)},
            "samples_per_class": {"0.0": 1, "1.0": samples_per_class},
            "rows": [asdict(r) for r in rows], "seconds": round(time.perf_counter() - t0, 1)}


def table3_markdown(rows: Sequence[dict], paper_target: str = "GPT-like") -> str:
    """Our α (generated / held-out text) next to the paper's α for the matching drafter kind."""
    paper_name = {"unigram": "unigram", "bigram": "bigram"}
    lines = ["| drafter | T | α on the target's own text (ours) | α on the real held-out continuation (ours) "
             "| paper α (GPT-like 97M, lm1b) |", "|---|---|---|---|---|"]
    by_key = {(r["drafter"], r["temperature"], r["text"]): r for r in rows}
    for name, t in dict.fromkeys((r["drafter"], r["temperature"]) for r in rows):
        gen, held = by_key.get((name, t, "generated")), by_key.get((name, t, "heldout"))
        paper = paper_alpha(paper_target, paper_name.get(name, "GPT-like 6M"), t)
        gen_s = "–" if gen is None else f"{gen['alpha']:.3f} ({gen['positions']} positions)"
        held_s = "–" if held is None else f"{held['alpha']:.3f} ({held['positions']} positions)"
        paper_s = "–" if paper is None else f"{paper:.2f}"
        lines.append(f"| {name} | {t:g} | {gen_s} | {held_s} | {paper_s} |")
    return "\n".join(lines)


def plot_table3(rows: Sequence[dict], path: str | Path, *, title: str, paper_target: str = "GPT-like",
                model_paper_name: str = "GPT-like 6M", paper_label: str = "GPT-like 97M, lm1b") -> Path:
    """Grouped bars: our α (target's text) and the paper's α, per drafter and temperature (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen = [r for r in rows if r["text"] == "generated"]
    labels = ["\n".join(textwrap.wrap(r["drafter"], 18)) + f"\nT={r['temperature']:g}" for r in gen]
    ours = [r["alpha"] for r in gen]
    paper = [paper_alpha(paper_target, r["drafter"] if r["drafter"] in ("unigram", "bigram") else model_paper_name,
                         r["temperature"]) for r in gen]
    x = range(len(gen))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(gen)), 4.0))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="ours (measured, Σ min(p, q))")
    ax.bar([i + 0.2 for i in x], [p if p is not None else 0 for p in paper], width=0.4,
           label=f"paper ({paper_label})", alpha=0.6)
    for i, (a, b) in enumerate(zip(ours, paper)):
        ax.text(i - 0.2, a + 0.01, f"{a:.2f}", ha="center", fontsize=7)
        if b is not None:
            ax.text(i + 0.2, b + 0.01, f"{b:.2f}", ha="center", fontsize=7)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("α")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
