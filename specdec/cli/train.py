"""`specdec train`: prepare local corpora and train target/draft pairs (see specdec.zoo).

    specdec train prepare --corpus code --out data/code      # Python sources of this interpreter
    specdec train prepare --corpus ende --out data/ende      # gettext de catalogs
    specdec train presets                                    # list presets
    specdec train pair --preset demo --data data/code --out runs/demo
    specdec train distill --target runs/demo/target --draft runs/demo/draft0 --data data/code --out runs/d
    specdec train image --preset digits --out runs/digits    # 8×8 digit images (needs scikit-learn)
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

from specdec.cli import CLIError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="prepare corpora and train target/draft model pairs",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="train_command", metavar="STEP")

    prep = sub.add_parser("prepare", help="read a local corpus, train the tokenizer, write a data folder")
    prep.add_argument("--corpus", choices=("code", "ende"), required=True)
    prep.add_argument("--out", required=True, help="output folder (e.g. data/code)")
    prep.add_argument("--vocab-size", type=int, default=8192)
    prep.add_argument("--val-fraction", type=float, default=None, help="default: 0.01 code, 0.05 ende")
    prep.add_argument("--max-train-tokens", type=int, default=40_000_000, help="code: cap on training tokens")
    prep.add_argument("--roots", nargs="+", default=None, help="code: folders to read instead of stdlib+site-packages")
    prep.add_argument("--mo-files", nargs="+", default=None, help="ende: .mo catalogs instead of the de locale dirs")
    prep.add_argument("--no-progress", action="store_true")
    prep.set_defaults(run=run)

    lst = sub.add_parser("presets", help="list the presets")
    lst.set_defaults(run=run)

    pair = sub.add_parser("pair", help="train a preset's target and drafters (then distill the drafters)")
    pair.add_argument("--preset", required=True, help="tiny, tiny-ende, demo, gpu, gpu-ende")
    pair.add_argument("--data", required=True, help="folder written by `specdec train prepare`")
    pair.add_argument("--out", required=True)
    pair.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    pair.add_argument("--budget-scale", type=float, default=1.0, help="multiply every phase's time budget")
    pair.add_argument("--no-progress", action="store_true")
    pair.set_defaults(run=run)

    dist = sub.add_parser("distill", help="distill an existing drafter on an existing target")
    dist.add_argument("--target", required=True)
    dist.add_argument("--draft", required=True)
    dist.add_argument("--data", required=True)
    dist.add_argument("--out", required=True, help="folder for the distilled drafter + logs")
    dist.add_argument("--preset", default="demo", help="whose distillation settings to use")
    dist.add_argument("--seconds", type=float, default=None, help="time budget (default: the preset's)")
    dist.add_argument("--steps", type=int, default=None)
    dist.add_argument("--lr", type=float, default=None)
    dist.add_argument("--batch-size", type=int, default=None)
    dist.add_argument("--seq-len", type=int, default=None)
    dist.add_argument("--loss", choices=("kl", "ce"), default="kl",
                      help="kl: KL(p‖q) with the target's logits; ce: cross-entropy on the text (hard labels on "
                           "generated text, no teacher pass)")
    dist.add_argument("--generate", type=int, default=0, metavar="N",
                      help="first generate N greedy target continuations of corpus prompts to train on")
    dist.add_argument("--generated-fraction", type=float, default=None,
                      help="share of each batch from the generated text (default 1.0 with --generate, else 0)")
    dist.add_argument("--prompt-len", type=int, default=32)
    dist.add_argument("--new-tokens", type=int, default=192)
    dist.add_argument("--document-starts", type=float, default=0.5,
                      help="share of prompts that begin a file (the rest start anywhere)")
    dist.add_argument("--val-generate", type=int, default=32, help="held-out prompts for α on generated text")
    dist.add_argument("--gen-batch-size", type=int, default=64)
    dist.add_argument("--seed", type=int, default=0)
    dist.add_argument("--device", default="auto")
    dist.add_argument("--no-progress", action="store_true")
    dist.set_defaults(run=run)

    image = sub.add_parser("image", help="train an image pair on scikit-learn's 8×8 digits (pixel tokens)")
    image.add_argument("--preset", default="digits", help="digits, digits-tiny")
    image.add_argument("--out", required=True)
    image.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, ...")
    image.add_argument("--no-augment", action="store_true", help="train on the images only, without shifts")
    image.add_argument("--no-progress", action="store_true")
    image.set_defaults(run=run)
    parser.set_defaults(run=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.train_command == "presets":
        from specdec.zoo.presets import PRESETS

        for name, preset in PRESETS.items():
            print(f"{name:10s} {preset.description}")
        return 0
    if args.train_command == "prepare":
        return _prepare(args)
    if args.train_command == "pair":
        return _pair(args)
    if args.train_command == "distill":
        return _distill(args)
    if args.train_command == "image":
        return _image(args)
    raise CLIError(f"unknown step {args.train_command!r}")


def _prepare(args) -> int:
    from specdec.zoo.data import prepare_code_data, prepare_ende_data

    if args.corpus == "code":
        meta = prepare_code_data(args.out, roots=args.roots, vocab_size=args.vocab_size,
                                 val_fraction=0.01 if args.val_fraction is None else args.val_fraction,
                                 max_train_tokens=args.max_train_tokens, progress=not args.no_progress)
    else:
        meta = prepare_ende_data(args.out, mo_files=args.mo_files, vocab_size=args.vocab_size,
                                 val_fraction=0.05 if args.val_fraction is None else args.val_fraction)
    shown = {k: v for k, v in meta.items() if not isinstance(v, list)}
    print(json.dumps(shown, indent=1))
    return 0


def _pair(args) -> int:
    from specdec.zoo.pipeline import train_pair
    from specdec.zoo.presets import get_preset, scale_budget

    preset = get_preset(args.preset)
    if args.budget_scale <= 0:
        raise CLIError(f"--budget-scale must be positive, got {args.budget_scale}")
    if args.budget_scale != 1.0:
        preset = scale_budget(preset, args.budget_scale)
    summary = train_pair(preset, args.data, args.out, device=args.device, progress=not args.no_progress)
    print(json.dumps(_brief(summary), indent=1))
    return 0


def _brief(summary: dict) -> dict:
    """The numbers a person looks at first."""
    out = {"preset": summary["preset"], "device": summary["device_name"], "total_seconds": summary.get("total_seconds"),
           "target": {k: summary["target"][k] for k in ("params", "steps", "tokens", "seconds", "val_loss",
                                                        "tokens_per_s", "mfu", "skipped_steps")}}
    out["drafts"] = []
    for d in summary.get("drafts", []):
        row = {k: d.get(k) for k in ("params", "params_ratio", "init", "steps", "seconds", "val_loss")}
        if "distill" in d:
            for key in ("alpha_before", "alpha_after", "alpha_generated_before", "alpha_generated_after"):
                row[key] = d["distill"][key]
            row["distill_val_loss"] = d["distill"]["train"]["val_loss"]
        out["drafts"].append(row)
    return out


def _distill(args) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from specdec.zoo.data import load_data
    from specdec.zoo.distill import distill_draft
    from specdec.zoo.presets import get_preset
    from specdec.zoo.train import resolve_device, save_model

    preset = get_preset(args.preset)
    recipe = next((r for r in preset.drafts if r.distill is not None), None)
    if recipe is None:
        raise CLIError(f"preset {args.preset!r} has no distillation settings")
    fraction = args.generated_fraction if args.generated_fraction is not None else (1.0 if args.generate else 0.0)
    if fraction and not args.generate:
        raise CLIError("--generated-fraction needs --generate N")
    distill_cfg = replace(recipe.distill, generated_fraction=fraction, loss=args.loss)
    tc = distill_cfg.train
    tc = replace(tc, max_seconds=args.seconds if args.seconds is not None else tc.max_seconds,
                 steps=args.steps if args.steps is not None else tc.steps, lr=args.lr if args.lr is not None else tc.lr,
                 batch_size=args.batch_size or tc.batch_size, seq_len=args.seq_len or tc.seq_len, seed=args.seed)
    for path in (args.target, args.draft):
        if not (Path(path) / "config.json").is_file():
            raise CLIError(f"{path} is not a model folder (no config.json)")
    encdec = AutoConfig.from_pretrained(args.target).is_encoder_decoder
    auto = AutoModelForSeq2SeqLM if encdec else AutoModelForCausalLM
    target = auto.from_pretrained(args.target, dtype=torch.float32)
    draft = auto.from_pretrained(args.draft, dtype=torch.float32)
    data = load_data(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = val_pool = None
    if args.generate or args.val_generate:
        if encdec:
            raise CLIError("--generate/--val-generate need a decoder-only pair")
        from specdec.zoo.distill import generate_greedy, prompts_from_stream

        device = resolve_device(args.device)
        if args.generate:
            prompts = prompts_from_stream(data.train, args.generate, args.prompt_len, seed=args.seed + 1,
                                          document_starts=args.document_starts)
            pool = generate_greedy(target, prompts, args.new_tokens, batch_size=args.gen_batch_size, device=device)
        if args.val_generate:
            prompts = prompts_from_stream(data.val, args.val_generate, args.prompt_len, seed=args.seed + 2,
                                          document_starts=args.document_starts)
            val_pool = generate_greedy(target, prompts, args.new_tokens, batch_size=args.gen_batch_size, device=device)
    result = distill_draft(target, draft, data, replace(distill_cfg, train=tc), log_path=out / "distill.csv",
                           device=args.device, progress=not args.no_progress, pool=pool, val_pool=val_pool,
                           prompt_len=args.prompt_len)
    save_model(draft, out / "draft", data.tokenizer_dir, dtype=preset.export_dtype,
               max_shard_size=preset.max_shard_size)
    (out / "distill.json").write_text(json.dumps(result.to_dict(), indent=1))
    brief = result.to_dict()
    brief["train"] = {k: brief["train"][k] for k in ("steps", "seconds", "val_loss", "final_loss")}
    print(json.dumps(brief, indent=1))
    return 0


def _image(args) -> int:
    from specdec.zoo.images import get_image_preset, train_image_pair

    summary = train_image_pair(get_image_preset(args.preset), args.out, device=args.device,
                               progress=not args.no_progress, augment=not args.no_augment)
    print(json.dumps(_brief({**summary, "device_name": summary["device"]}), indent=1))
    return 0
