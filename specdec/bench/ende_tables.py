"""The paper's own setting on our hardware: an encoder-decoder EnDe translator, two drafts, Tables 2, 3, 4.

`run_ende_tables(data_dir, out_dir)` (scripts/device_run.sh ende-tables runs it on one GPU, ~10 minutes):

1. trains, with `specdec.zoo.pipeline.train_pair`, a T5-style target and two T5-style drafts of different
   sizes (the paper's T5-small / T5-base analogs), each pre-trained then distilled (KL(p‖q)), on the
   gettext EnDe pairs of a folder written by `specdec train prepare --corpus ende`;
2. the target's translation quality on the in-domain test set (random held-out messages) and on the
   out-of-domain one (whole held-out catalogs of other programs): greedy translations scored with sacrebleu
   (BLEU, chrF); hypotheses and references are saved, so `score_translations` can score them later where
   sacrebleu is installed;
3. Table 3: α = mean Σ min(p, q), exact, teacher-forced on the target's own translations of held-out
   sentences (greedy for T = 0, sampled for T = 1), for unigram and bigram tables (fitted on the training
   German side) and both model drafts;
4. Table 2: walltime speedup by drafter and γ, batch 1, `specdec.generate` on the fast encoder-decoder path
   (`specdec.fast.seq2seq`: CUDA graphs over a static cache) when on CUDA and it covers the models, else on
   the transformers path (`path` in each row says which); plain decoding timed before and after the
   speculative runs of each temperature;
5. Table 4: α (Table 3), c (measured in the Table 2 runs), the γ* and speedup Thm 3.8 predicts from them,
   and the speedup measured at γ*.

It writes OUT/ende_tables.json (every number), OUT/ende_tables.md (the section for docs/PAPER_TABLES.md,
made by `specdec.bench.ende_report`), OUT/ende_speedup.png and OUT/translations.jsonl;
`scripts/paper_tables.py ende-merge` puts them into the docs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from specdec.analysis import optimal_gamma, walltime_improvement
from specdec.bench.alpha_table import NGramLM
from specdec.bench.ende_report import DRAFT_NAMES, ende_markdown, plot_speedups
from specdec.drafters.ngram import NGramDrafter
from specdec.metrics import SpecStats
from specdec.zoo.presets import PRESETS, DistillConfig, DraftRecipe, ModelShape, PairPreset, TrainConfig

logger = logging.getLogger(__name__)

def _seconds(s: float, lr: float = 1e-3, warmup: int = 100) -> TrainConfig:
    return TrainConfig(steps=100_000, max_seconds=s, batch_size=256, seq_len=96, lr=lr, warmup_steps=warmup,
                       eval_every=200, eval_batches=8, batch_tokens=PRESETS["gpu-ende"].target_train.batch_tokens)


def _distill(s: float) -> DistillConfig:
    return DistillConfig(replace(_seconds(s, lr=1.5e-3, warmup=30), z_loss=0.0, min_lr_ratio=0.05))


# One H200, ~6 minutes of training: the zoo's gpu-ende target (6+6 layers × 512, 240 s) and two drafts,
# "small" (1+1 layers × 128, ~33× fewer parameters) and "base" (2+2 layers × 256, ~8.5× fewer), 140 s together,
# all on batches of ~64K padded positions. Session 3 gave the drafts 11-14 s of pre-training and 20-30 s of
# distillation on 256-pair batches (~100 ms a step: 60-136 steps), and they reached α 0.19 / 0.35 at T = 0.
ENDE_TABLES_PRESET = PairPreset(
    name="ende-tables",
    corpus="ende",
    target=PRESETS["gpu-ende"].target,
    target_train=PRESETS["gpu-ende"].target_train,
    drafts=(
        DraftRecipe(ModelShape("t5", dim=128, layers=1, heads=2, ff=384, max_len=128),
                    pretrain=_seconds(25, lr=2e-3), distill=_distill(40)),
        DraftRecipe(ModelShape("t5", dim=256, layers=2, heads=4, ff=768, max_len=128),
                    pretrain=_seconds(30, lr=2e-3), distill=_distill(45)),
    ),
    description="EnDe Tables 2/3/4: T5-style target + small and base drafts, one GPU",
)

# CPU smoke run of the whole script (tests, and to know it runs before spending GPU time): seconds.
_TINY = TrainConfig(steps=30, batch_size=16, seq_len=96, lr=3e-3, warmup_steps=5, eval_every=15, eval_batches=2)
ENDE_TINY_PRESET = PairPreset(
    name="ende-tables-tiny",
    corpus="ende",
    target=ModelShape("t5", dim=64, layers=2, heads=2, ff=128, max_len=128),
    target_train=_TINY,
    drafts=(DraftRecipe(ModelShape("t5", dim=32, layers=1, heads=1, ff=64, max_len=128), pretrain=_TINY,
                        distill=DistillConfig(replace(_TINY, steps=10), alpha_batches=1)),
            DraftRecipe(ModelShape("t5", dim=48, layers=1, heads=2, ff=96, max_len=128), pretrain=_TINY,
                        distill=DistillConfig(replace(_TINY, steps=10), alpha_batches=1))),
    description="CPU smoke run of the EnDe tables script",
)
ENDE_PRESETS = {"ende-tables": ENDE_TABLES_PRESET, "ende-tables-tiny": ENDE_TINY_PRESET}


@dataclass(frozen=True)
class EndeTablesConfig:
    budget_scale: float = 1.0  # multiplies every training time budget
    quality_sentences: int | None = 2000  # in-domain test pairs translated for BLEU/chrF (None = all; a random
    # sample: val.jsonl.gz is shuffled); the out-of-domain set is translated whole
    alpha_sentences: int = 512  # held-out sources whose target translations α is measured on
    speed_sentences: int = 32  # held-out sources decoded at batch 1 for Table 2
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 7)  # dense at small γ, where Thm 3.8's γ* falls for these pairs
    temperatures: tuple[float, ...] = (0.0, 1.0)
    max_new_tokens: int = 96
    batch_size: int = 64  # for translation and α (not for Table 2, which is batch 1)
    seed: int = 0
    fast_path: str = "auto"  # Table 2: "auto" (fast on CUDA when covered), "never", "always" (also on CPU)


# ------------------------------------------------------------------------------------- measurements


@torch.inference_mode()
def translate(target, sources: Sequence[Sequence[int]], *, temperature: float, max_new_tokens: int,
              batch_size: int = 64, seed: int = 0) -> list[list[int]]:
    """The target's own translations (plain decoding through `specdec.generate`, cut after EOS)."""
    import specdec

    out: list[list[int]] = []
    for lo in range(0, len(sources), batch_size):
        res = specdec.generate(target, [list(s) for s in sources[lo : lo + batch_size]], drafter=None,
                               max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + lo)
        out += res.sequences
    return out


@torch.inference_mode()
def seq2seq_alpha(target, draft, sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                  temperature: float, batch_size: int = 64) -> tuple[float, int]:
    """(α, positions): mean Σ_x min(p(x), q(x)) over every decoder position of `outputs` (teacher-forced:
    the decoder reads its start token + output[:-1]); `draft` is an encoder-decoder model or an `NGramLM`."""
    from specdec.core import SamplingConfig, standardize_logits
    from specdec.models.seq2seq import decoder_start_token_id

    sampling = SamplingConfig(temperature=temperature)
    device = next(target.parameters()).device
    start = decoder_start_token_id(target)
    total, count = 0.0, 0
    for lo in range(0, len(sources), batch_size):
        rows = [(s, y) for s, y in zip(sources[lo : lo + batch_size], outputs[lo : lo + batch_size]) if len(y)]
        if not rows:
            continue
        s_len, y_len = max(len(s) for s, _ in rows), max(len(y) for _, y in rows)
        input_ids = torch.zeros(len(rows), s_len, dtype=torch.long)
        attention = torch.zeros(len(rows), s_len, dtype=torch.long)
        decoder_ids = torch.full((len(rows), y_len), start, dtype=torch.long)
        mask = torch.zeros(len(rows), y_len, dtype=torch.bool)
        for b, (s, y) in enumerate(rows):
            input_ids[b, : len(s)] = torch.tensor(s)
            attention[b, : len(s)] = 1
            decoder_ids[b, 1 : len(y)] = torch.tensor(y[:-1])
            mask[b, : len(y)] = True  # causal decoder: right padding never changes the real positions
        input_ids, attention, decoder_ids = input_ids.to(device), attention.to(device), decoder_ids.to(device)
        p_logits = target(input_ids=input_ids, attention_mask=attention, decoder_input_ids=decoder_ids).logits
        if isinstance(draft, NGramLM):
            q_logits = draft(decoder_ids).logits
        else:
            q_logits = draft(input_ids=input_ids, attention_mask=attention, decoder_input_ids=decoder_ids).logits
        mask = mask.to(device)
        p = standardize_logits(p_logits[mask].float(), sampling)
        q = standardize_logits(q_logits[mask].float(), sampling).to(p.device)
        total += float(torch.minimum(p, q).sum(-1).clamp(max=1.0).sum())
        count += int(mask.sum())
    return total / max(1, count), count


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacrebleu corpus BLEU and chrF (default settings: 13a tokenization, chrF β = 2)."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(bleu_score.score, 2), "chrf": round(chrf_score.score, 2),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
            "sentences": len(hypotheses)}


def speed_models(target, drafters: Mapping[str, object], max_gamma: int, fast_path: str = "auto"):
    """(target, drafters, path) for Table 2: the fast encoder-decoder path ("fast") when `fast_path` is "always",
    or "auto" on CUDA, and it covers the target and every model draft; else the models as given ("transformers")."""
    from specdec.fast.seq2seq import FastSeq2SeqDrafter, FastSeq2SeqTarget, covers_seq2seq

    if fast_path not in ("auto", "never", "always"):
        raise ValueError(f"fast_path must be 'auto', 'never' or 'always', got {fast_path!r}")
    models = [target, *(d for d in drafters.values() if isinstance(d, torch.nn.Module))]
    on_cuda = next(target.parameters()).device.type == "cuda"
    if fast_path == "never" or (fast_path == "auto" and not on_cuda) or not all(map(covers_seq2seq, models)):
        return target, dict(drafters), "transformers"
    fast = {name: FastSeq2SeqDrafter(d, max_draft_tokens=max_gamma) if isinstance(d, torch.nn.Module) else d
            for name, d in drafters.items()}
    return FastSeq2SeqTarget(target, max_draft_tokens=max_gamma), fast, "fast"


@torch.inference_mode()
def speed_table(target, drafters: Mapping[str, object], sources: Sequence[Sequence[int]], *,
                gammas: Sequence[int], temperatures: Sequence[float], max_new_tokens: int, seed: int = 0,
                warmup: bool = False) -> list[dict]:
    """Table 2 rows: batch 1, every source once per configuration; plain timed before and after.
    warmup: run each configuration untimed first on one source of each encoder width (the fast path captures
    its CUDA graphs there, once per padded width)."""
    import specdec
    from specdec.fast.seq2seq import source_width

    by_width: dict[int, Sequence[int]] = {}
    for s in sources:
        by_width.setdefault(source_width(len(s)), s)

    def run(drafter, t, gamma):
        def stats_of(chosen):
            return [specdec.generate(target, [list(s)], drafter=drafter, max_new_tokens=max_new_tokens,
                                     temperature=t, num_draft_tokens=gamma, seed=seed + i).stats
                    for i, s in enumerate(chosen)]

        if warmup:
            stats_of(list(by_width.values()))
        return SpecStats.pooled(stats_of(sources))

    rows = []
    run(None, 0.0, 1)  # warm-up
    for t in temperatures:
        before = run(None, t, 1)
        spec = {(name, g): run(d, t, g) for name, d in drafters.items() for g in gammas}
        after = run(None, t, 1)
        plain_tokens = before.num_generated_tokens + after.num_generated_tokens
        plain_tps = plain_tokens / (before.wall_time_s + after.wall_time_s)
        rows.append({"drafter": "plain", "temperature": t, "gamma": 0, "tokens_per_s": plain_tps})
        for (name, g), s in spec.items():
            c, predicted = s.cost_ratio, s.predicted_speedup
            if c is None and s.drafted_tokens and s.num_steps and s.verify_time_s > 0:
                # a table drafter runs no forward pass: its c is the time per drafted token over a verification's
                c = (s.draft_time_s / s.drafted_tokens) / (s.verify_time_s / s.num_steps)
                predicted = None if s.alpha is None else walltime_improvement(s.alpha, g, c)
            rows.append({"drafter": name, "temperature": t, "gamma": g, "tokens_per_s": s.tokens_per_second,
                         "speedup": s.tokens_per_second / plain_tps, "alpha": s.alpha,
                         "tau": s.mean_accepted_length, "cost_ratio": c, "predicted_speedup": predicted})
            logger.info("T=%g %s γ=%d: %.2fx (α %.3f)", t, name, g, rows[-1]["speedup"], s.alpha or 0)
    return rows


def prediction_table(alpha_rows: Sequence[dict], speed_rows: Sequence[dict]) -> list[dict]:
    """Table 4: α (Table 3, the target's text), c (mean over the Table 2 runs of that drafter and T), the γ*
    and speedup Thm 3.8 predicts, and the speedup measured at the γ of the grid nearest γ*."""
    out = []
    for a in alpha_rows:
        runs = [r for r in speed_rows if r["drafter"] == a["drafter"] and r["temperature"] == a["temperature"]]
        if not runs:
            continue
        costs = [r["cost_ratio"] for r in runs if r["cost_ratio"] is not None]
        c = sum(costs) / len(costs) if costs else 0.0  # tables: no drafter forward pass, c ≈ 0
        gamma = optimal_gamma(a["alpha"], c, max_gamma=max(r["gamma"] for r in runs)) if a["alpha"] > c else 0
        measured = min(runs, key=lambda r: (abs(r["gamma"] - gamma), r["gamma"]))
        out.append({"drafter": a["drafter"], "temperature": a["temperature"], "alpha": a["alpha"], "cost_ratio": c,
                    "predicted_gamma": gamma,
                    "predicted_speedup": walltime_improvement(a["alpha"], gamma, c) if gamma else 1.0,
                    "measured_gamma": measured["gamma"], "measured_speedup": measured["speedup"],
                    "best_measured_gamma": max(runs, key=lambda r: r["speedup"])["gamma"],
                    "best_measured_speedup": max(r["speedup"] for r in runs)})
    return out


# ------------------------------------------------------------------------------------------ the run


def run_ende_tables(data_dir: str | Path, out_dir: str | Path, *, preset: PairPreset = ENDE_TABLES_PRESET,
                    config: EndeTablesConfig = EndeTablesConfig(), device: str = "auto",
                    pair_dir: str | Path | None = None) -> dict:
    """Train (unless `pair_dir` holds a trained pair), measure, write OUT/ende_tables.{json,md}; returns the dict."""
    from transformers import AutoModelForSeq2SeqLM

    from specdec.zoo.data import PairData
    from specdec.zoo.pipeline import train_pair
    from specdec.zoo.presets import scale_budget
    from specdec.zoo.tokenizer import load_tokenizer
    from specdec.zoo.models import resolve_device

    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(device)
    result: dict = {"preset": asdict(preset), "config": asdict(config), "device": str(dev),
                    "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                    "torch": torch.__version__}
    if pair_dir is None:
        pair_dir = out / "pair"
        run_preset = scale_budget(preset, config.budget_scale) if config.budget_scale != 1.0 else preset
        summary = train_pair(run_preset, data_dir, pair_dir, device=dev, progress=False)
        result["training"] = _training_brief(summary)
    result["train_seconds"] = round(time.perf_counter() - t0, 1)
    pair_dir = Path(pair_dir)

    def load(name: str):
        return AutoModelForSeq2SeqLM.from_pretrained(str(pair_dir / name), dtype=torch.float32).to(dev).eval()

    target = load("target")
    drafts = {name: load(f"draft{i}") for i, name in enumerate(DRAFT_NAMES) if (pair_dir / f"draft{i}").is_dir()}
    result["params"] = {"target": _params(target), **{n: _params(m) for n, m in drafts.items()}}
    data = PairData.load(data_dir)  # the max_len training used (train_pair → load_data)
    tokenizer = load_tokenizer(data.tokenizer_dir)
    vocab = target.config.vocab_size

    # 2. translation quality (greedy): the in-domain test set (a random sample of the corpus's English messages)
    # and, when the folder has one, the out-of-domain set (whole catalogs of other programs)
    sets = {"val": data.val[: config.quality_sentences] if config.quality_sentences else data.val, "ood": data.ood}
    with open(out / "translations.jsonl", "w", encoding="utf-8") as fh:
        for split, rows in sets.items():
            if not rows:
                continue
            hyps = translate(target, [s for s, _ in rows], temperature=0.0, max_new_tokens=config.max_new_tokens,
                             batch_size=config.batch_size)
            texts = tokenizer.batch_decode(hyps, skip_special_tokens=True)
            refs = tokenizer.batch_decode([t for _, t in rows], skip_special_tokens=True)
            srcs = tokenizer.batch_decode([s for s, _ in rows], skip_special_tokens=True)
            for s, h, r in zip(srcs, texts, refs):
                fh.write(json.dumps({"set": split, "en": s, "hyp": h, "ref": r}, ensure_ascii=False) + "\n")
            key = "quality" if split == "val" else "quality_ood"
            try:
                result[key] = score_translations(texts, refs)
            except ImportError:
                result[key] = {"pending": "sacrebleu not installed here; score OUT/translations.jsonl later",
                               "sentences": len(texts)}
            result[key]["of"] = len(data.val) if split == "val" else len(rows)
    result["val_set"] = data.meta.get("val", "held-out catalogs")
    result["ood_catalogs"] = data.meta.get("ood_catalogs", data.meta.get("val_catalogs"))
    _save(result, out)  # after every stage: a run cut short by a time limit keeps what it measured

    # 3. Table 3: α on the target's own translations
    start = int(target.generation_config.decoder_start_token_id or 0)
    fit = [[start] + t for _, t in data.train]
    tables = {"unigram": NGramLM(NGramDrafter(1).fit(fit, vocab)), "bigram": NGramLM(NGramDrafter(2).fit(fit, vocab))}
    sources = [s for s, _ in data.val[: config.alpha_sentences]]
    alpha_rows = []
    for t in config.temperatures:
        outputs = translate(target, sources, temperature=t, max_new_tokens=config.max_new_tokens,
                            batch_size=config.batch_size, seed=config.seed)
        for name, d in {**tables, **drafts}.items():
            alpha, n = seq2seq_alpha(target, d, sources, outputs, temperature=t, batch_size=config.batch_size)
            alpha_rows.append({"drafter": name, "temperature": t, "alpha": alpha, "positions": n})
    result["table3"] = alpha_rows
    _save(result, out)

    # 4. Table 2: speedups at batch 1; the bigram table drafts as a real drafter (c ≈ 0), the unigram is
    # measured for α only, as in the paper. 5. Table 4 is refreshed after each temperature.
    speed_sources = [s for s, _ in data.val[-config.speed_sentences :]]
    speed_target, speed_drafters, path = speed_models(target, {"bigram": tables["bigram"].drafter, **drafts},
                                                      max(config.gammas), config.fast_path)
    result["table2_path"] = path
    result["table2"] = []
    for t in config.temperatures:  # one temperature at a time, saved after each
        rows = speed_table(speed_target, speed_drafters, speed_sources, gammas=config.gammas, temperatures=(t,),
                           max_new_tokens=config.max_new_tokens, seed=config.seed, warmup=path == "fast")
        result["table2"] += [{**r, "path": path} for r in rows]
        result["table4"] = prediction_table(alpha_rows, result["table2"])
        _save(result, out)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    _save(result, out)
    try:
        plot_speedups(result["table2"], out / "ende_speedup.png")
    except ImportError:  # matplotlib is optional on the device
        logger.warning("matplotlib missing: no plot")
    return result


def _save(result: dict, out: Path) -> None:
    (out / "ende_tables.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "ende_tables.md").write_text(ende_markdown(result) + "\n")


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _training_brief(summary: dict) -> dict:
    target = summary["target"]
    out = {"total_seconds": summary.get("total_seconds"),
           "target": {k: target.get(k) for k in ("params", "steps", "seconds", "val_loss", "tokens_per_s", "mfu")},
           "drafts": []}
    for name, d in zip(DRAFT_NAMES, summary.get("drafts", [])):
        row = {"name": name, **{k: d.get(k) for k in ("params", "params_ratio", "steps", "seconds", "val_loss")}}
        if "distill" in d:
            row["alpha_before"], row["alpha_after"] = d["distill"]["alpha_before"], d["distill"]["alpha_after"]
        out["drafts"].append(row)
    return out
