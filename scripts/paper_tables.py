"""Reproduce the paper-table analogs in docs/PAPER_TABLES.md.

    python scripts/paper_tables.py code [--out docs/paper_tables]       # Table 3, shipped code pair (CPU)
    python scripts/paper_tables.py images [--out docs/paper_tables]     # Table 3, shipped digit-image pair (CPU)
    python scripts/paper_tables.py ende --data data/ende --out OUT      # train the EnDe pair, Tables 2/3/4 (GPU)
    python scripts/paper_tables.py ende-merge --from OUT                # put OUT's EnDe section into the docs

`code` writes OUT/code_table3.{json,png} and prints the Markdown table. `ende` (run by scripts/device_run.sh ende-tables
on one GPU) writes OUT/ende_tables.{json,md}, OUT/ende_speedup.png and OUT/translations.jsonl.
`ende-merge` scores the translations with sacrebleu if the device could not, then replaces the text between
the `ende:begin` / `ende:end` markers of docs/PAPER_TABLES.md and copies the JSON and plot to docs/paper_tables/.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "PAPER_TABLES.md"
BEGIN, END = "<!-- ende:begin -->", "<!-- ende:end -->"


def code(args) -> None:
    from specdec.bench.alpha_table import code_pair_table3, plot_table3, table3_markdown

    torch.set_num_threads(args.threads)
    extra = {}
    for item in args.extra_draft:
        name, sep, folder = item.rpartition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--extra-draft: expected NAME=FOLDER, got {item!r}")
        extra[name] = folder
    result = code_pair_table3(num_prompts=args.prompts, new_tokens=args.new_tokens, ngram_tokens=args.ngram_tokens,
                              extra_drafters=extra)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "code_table3.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_table3(result["rows"], args.out / "code_table3.png",
                title="Table 3 analog: code target (12.2M, 24 layers) vs the paper's GPT-like 97M (lm1b)")
    print(table3_markdown(result["rows"]))


def images(args) -> None:
    from specdec.bench.alpha_table import image_pair_table3, table3_markdown

    torch.set_num_threads(args.threads)
    result = image_pair_table3(samples_per_class=args.samples_per_class)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "image_table3.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table3_markdown(result["rows"]))


def ende(args) -> None:
    from specdec.bench.ende_tables import ENDE_PRESETS, EndeTablesConfig, run_ende_tables

    config = EndeTablesConfig(budget_scale=args.budget_scale, speed_sentences=args.speed_sentences,
                              alpha_sentences=args.alpha_sentences, quality_sentences=args.quality_sentences or None,
                              gammas=tuple(int(g) for g in args.gammas.split(",")), fast_path=args.fast_path)
    result = run_ende_tables(args.data, args.out, preset=ENDE_PRESETS[args.preset], config=config,
                             device=args.device, pair_dir=args.pair)
    print((args.out / "ende_tables.md").read_text())
    print(json.dumps({"seconds": result["seconds"], "train_seconds": result["train_seconds"],
                      "path": result.get("table2_path")}))


def ende_merge(args) -> None:
    from specdec.bench.ende_tables import ende_markdown, score_translations

    src = args.source
    result = json.loads((src / "ende_tables.json").read_text())
    rows = None
    for key, split in (("quality", "val"), ("quality_ood", "ood")):  # in-domain and out-of-domain test sets
        if key not in result or "bleu" in result[key]:
            continue
        if rows is None:
            rows = [json.loads(line) for line in (src / "translations.jsonl").read_text(encoding="utf-8").splitlines()]
        chosen = [r for r in rows if r.get("set", "val") == split]
        result[key] = {**score_translations([r["hyp"] for r in chosen], [r["ref"] for r in chosen]),
                       "of": result[key].get("of", len(chosen)),
                       "scored": "after the run, by scripts/paper_tables.py ende-merge"}
    assets = DOC.parent / "paper_tables"
    assets.mkdir(parents=True, exist_ok=True)
    (assets / "ende_tables.json").write_text(json.dumps(result, indent=1) + "\n")
    if (src / "ende_speedup.png").is_file():
        shutil.copy(src / "ende_speedup.png", assets / "ende_speedup.png")
    elif result.get("table2"):  # the run stopped before plotting
        from specdec.bench.ende_report import plot_speedups

        plot_speedups(result["table2"], assets / "ende_speedup.png")
    command = ("Reproduce: `bash scripts/device_run.sh ende-tables` on one H200 with `data/ende` carried (see the script's "
               "header), "
               "then `python scripts/paper_tables.py ende-merge --from DIR/ende`; every number is in "
               "`docs/paper_tables/ende_tables.json`.")
    section = f"{command}\n\n{ende_markdown(result)}\n\n![EnDe speedup vs γ](paper_tables/ende_speedup.png)"
    if (src / "translations.jsonl").is_file():
        from specdec.bench.ende_report import translation_samples

        if rows is None:
            rows = [json.loads(line) for line in (src / "translations.jsonl").read_text(encoding="utf-8").splitlines()]
        section += "\n\n" + translation_samples(rows)
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{section}\n{END}{tail}")
    print(f"updated {DOC}")


def main() -> None:
    from specdec.bench.ende_tables import EndeTablesConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="table", required=True)
    c = sub.add_parser("code", help="Table 3 analog on the shipped demo pair (Python code), CPU")
    c.add_argument("--out", type=Path, default=Path("docs/paper_tables"))
    c.add_argument("--prompts", type=int, default=16)
    c.add_argument("--new-tokens", type=int, default=256)
    c.add_argument("--ngram-tokens", type=int, default=5_000_000)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--extra-draft", action="append", default=[], metavar="NAME=FOLDER",
                   help="another drafter for the shipped target, as a row (scripts/code_small_vs_distilled.py "
                        "writes the pre-trained-only and re-distilled ones); repeatable")
    c.set_defaults(run=code)
    i = sub.add_parser("images", help="Table 3 analog on the shipped digit-image pair, CPU")
    i.add_argument("--out", type=Path, default=Path("docs/paper_tables"))
    i.add_argument("--samples-per-class", type=int, default=20)
    i.add_argument("--threads", type=int, default=1)
    i.set_defaults(run=images)
    e = sub.add_parser("ende", help="train the EnDe pair and measure Tables 2/3/4 (one GPU, ~10 minutes)")
    e.add_argument("--data", type=Path, required=True, help="folder from `specdec train prepare --corpus ende`")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--preset", default="ende-tables", help="ende-tables (GPU) or ende-tables-tiny (CPU smoke run)")
    e.add_argument("--pair", type=Path, default=None, help="an already trained pair folder: skip training")
    e.add_argument("--budget-scale", type=float, default=1.0)
    defaults = EndeTablesConfig()
    e.add_argument("--speed-sentences", type=int, default=defaults.speed_sentences)
    e.add_argument("--alpha-sentences", type=int, default=defaults.alpha_sentences)
    e.add_argument("--quality-sentences", type=int, default=2000,
                   help="in-domain test pairs translated for BLEU/chrF (a random sample; 0 = all)")
    e.add_argument("--gammas", default=",".join(map(str, defaults.gammas)))
    e.add_argument("--device", default="auto")
    e.add_argument("--fast-path", default="auto", choices=("auto", "never", "always"),
                   help="Table 2 on the fast encoder-decoder path: auto = on CUDA when it covers the models")
    e.set_defaults(run=ende)
    m = sub.add_parser("ende-merge", help="merge an `ende` run's results into docs/PAPER_TABLES.md")
    m.add_argument("--from", dest="source", type=Path, required=True)
    m.set_defaults(run=ende_merge)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.run(args)


if __name__ == "__main__":
    main()
