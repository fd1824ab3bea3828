"""The code pair's "small vs distilled" drafters for Table 3: the shipped drafter's recipe re-run, saved before and
after its distillation, so `paper_tables.py code --extra-draft` can measure both on the shipped target.

    # here (CPU, ~25 s): the corpus encoded with the shipped pair's tokenizer
    specdec train prepare --corpus code --out data/code-demo --tokenizer specdec/assets/demo_pair/target \\
        --max-train-tokens 12000000
    # on a GPU (~2.5 minutes; carry data/code-demo):
    python scripts/code_small_vs_distilled.py --data data/code-demo --out $OUT/code_drafts
    # here again (CPU), with the two folders it wrote:
    python scripts/paper_tables.py code --extra-draft "small model (1 layer, pre-trained only)=DIR/pretrained" \\
        --extra-draft "small model (1 layer, re-distilled)=DIR/distilled"

The recipe is the `demo` preset's second draft (the shipped one: 1 layer × 128, 1.26M parameters): pre-training by
cross-entropy on the corpus (35 s), then KL(p‖q) distillation against the shipped target (45 s), half on the
target's own greedy text. The shipped drafter went through the same two phases on the run that trained its target.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.loading import load_model  # noqa: E402
from specdec.zoo.data import TokenData  # noqa: E402
from specdec.zoo.distill import distill_draft  # noqa: E402
from specdec.zoo.pipeline import make_pools  # noqa: E402
from specdec.zoo.presets import get_preset, scale_budget  # noqa: E402
from specdec.zoo.models import build_model, count_params, resolve_device, save_model  # noqa: E402
from specdec.zoo.train import run_training  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="code corpus encoded with the shipped tokenizer")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", type=Path, default=SHIPPED)
    ap.add_argument("--budget-scale", type=float, default=1.0)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    device = resolve_device(args.device)
    preset = get_preset("demo")
    if args.budget_scale != 1.0:
        preset = scale_budget(preset, args.budget_scale)
    recipe = preset.drafts[1]  # the shipped drafter's shape and recipe
    data = TokenData.load(args.data)
    target = load_model(args.pair / "target", device=str(device), dtype="float32", what="target")
    if data.meta["vocab_size"] != target.config.vocab_size:
        raise SystemExit(f"--data: {data.meta['vocab_size']} tokens, the target has {target.config.vocab_size}; "
                         "prepare it with --tokenizer on the pair's target folder")
    args.out.mkdir(parents=True, exist_ok=True)
    draft = build_model(recipe.shape, target.config.vocab_size, seed=2)
    pre = run_training(draft, data, recipe.pretrain, log_path=args.out / "pretrain.csv", device=device,
                       progress=False, desc="pretrain")
    save_model(draft, args.out / "pretrained", args.pair / "target", dtype=preset.export_dtype)
    pool, val_pool = make_pools(target, data, preset.pool, device)
    distilled = distill_draft(target, draft, data, recipe.distill, log_path=args.out / "distill.csv", device=device,
                              progress=False, desc="distill", pool=pool, val_pool=val_pool,
                              prompt_len=preset.pool.prompt_len)
    save_model(draft, args.out / "distilled", args.pair / "target", dtype=preset.export_dtype)
    summary = {"recipe": asdict(recipe), "params": count_params(draft), "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "pretrain": pre.to_dict(), "distill": distilled.to_dict()}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({"params": summary["params"], "pretrain_val_loss": pre.val_loss,
                      "alpha_before": distilled.alpha_before, "alpha_after": distilled.alpha_after,
                      "alpha_generated_before": distilled.alpha_generated_before,
                      "alpha_generated_after": distilled.alpha_generated_after}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
