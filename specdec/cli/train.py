"""`specdec train`: prepare local corpora and train target/draft pairs (see specdec.zoo).

    specdec train prepare --corpus code --out data/code      # Python sources of this interpreter
    specdec train prepare --corpus ende --out data/ende      # gettext de catalogs
    specdec train presets                                    # list presets
    specdec train pair --preset demo --data data/code --out runs/demo
    specdec train distill --target runs/demo/target --draft runs/demo/draft0 --data data/code --out runs/d
    specdec train image --preset digits --out runs/digits    # 8×8 digit images (needs scikit-learn)
    specdec train head --target runs/demo/target --data data/code --out runs/head --max-seconds 90
                                                             # a feature-level draft head (EAGLE-style)
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.common import DEFAULT_THREADS, add_checkpoint_options, check_float, check_int, dumps
from specdec.cli.train_checkpoints import run_distill, run_head


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="prepare corpora and train target/draft model pairs",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="train_command", metavar="STEP")

    prep = sub.add_parser("prepare", help="read a local corpus, train the tokenizer, write a data folder")
    prep.add_argument("--corpus", choices=("code", "ende"), required=True)
    prep.add_argument("--out", required=True, help="output folder (e.g. data/code)")
    prep.add_argument("--vocab-size", type=int, default=8192)
    prep.add_argument("--val-fraction", type=float, default=None, help="default: 0.01 code, 0.025 ende (in-domain test set)")
    prep.add_argument("--max-train-tokens", type=int, default=40_000_000, help="code: cap on training tokens")
    prep.add_argument("--roots", nargs="+", default=None, help="code: folders to read instead of stdlib+site-packages")
    prep.add_argument("--tokenizer", default=None, metavar="DIR",
                      help="code: encode with this folder's tokenizer.json (e.g. a trained pair's target, to train "
                           "more drafters for it) instead of training a new tokenizer")
    prep.add_argument("--mo-files", nargs="+", default=None,
                      help="ende: .mo/.po catalogs instead of those found below the locale dirs")
    prep.add_argument("--locale-dirs", nargs="+", default=None,
                      help="ende: folders to search for German catalogs (default: the system's locale folders "
                           "and the one scripts/device_run.sh ende-packages fills)")
    prep.add_argument("--no-progress", action="store_true")
    prep.set_defaults(run=run)

    lst = sub.add_parser("presets", help="list the presets")
    lst.set_defaults(run=run)

    pair = sub.add_parser("pair", help="train a preset's target and drafters (then distill the drafters)")
    pair.add_argument("--preset", required=True, help="tiny, tiny-ende, demo, gpu, gpu-ende")
    pair.add_argument("--data", required=True, help="folder written by `specdec train prepare`")
    pair.add_argument("--out", required=True)
    pair.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    pair.add_argument("--budget-scale", type=float, default=1.0, help="multiply every phase's time budget (default: 1)")
    pair.add_argument("--head-seconds", type=float, default=0.0,
                      help="also train a feature-level draft head on the target for this long (out/head; default 0 = no)")
    pair.add_argument("--no-progress", action="store_true")
    _add_run_options(pair)
    pair.set_defaults(run=run)

    dist = sub.add_parser("distill", help="distill an existing drafter on an existing target")
    dist.add_argument("--target", required=True, help="a folder, a .gguf file or a cached hub id")
    dist.add_argument("--draft", required=True, help="a folder, a .gguf file or a cached hub id")
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
    _add_training_options(dist, generated_default="1.0")
    dist.add_argument("--document-starts", type=float, default=0.5,
                      help="share of prompts that begin a file (the rest start anywhere)")
    dist.add_argument("--val-generate", type=int, default=32, help="held-out prompts for α on generated text")
    _add_run_options(dist)
    add_checkpoint_options(dist)
    dist.set_defaults(run=run)

    head = sub.add_parser("head", help="train a feature-level draft head (reads the target's hidden state)")
    head.add_argument("--target", required=True, help="a Llama-family target: a folder, a .gguf file or a cached hub id")
    head.add_argument("--data", required=True, help="folder written by `specdec train prepare --corpus code`")
    head.add_argument("--out", required=True, help="the head folder (feature_head.json, model.safetensors, logs)")
    head.add_argument("--max-seconds", type=float, default=90.0, help="training time budget (default: 90)")
    head.add_argument("--steps", type=int, default=100_000, help="upper bound on steps (default: 100000)")
    head.add_argument("--batch-size", type=int, default=32)
    head.add_argument("--seq-len", type=int, default=512)
    head.add_argument("--lr", type=float, default=1e-3)
    head.add_argument("--kl-weight", type=float, default=0.5, help="weight of KL(p‖q) next to the feature loss")
    head.add_argument("--feature-noise", type=float, default=0.1, help="U(−a, a) added to input features")
    head.add_argument("--init", choices=("last-layer", "random"), default="last-layer")
    head.add_argument("--batch-reuse", type=int, default=1, help="head steps per target pass (default: 1)")
    head.add_argument("--depth", type=int, default=3,
                      help="draft steps unrolled in training (1 = teacher forcing only; default 3)")
    head.add_argument("--feature-cache-tokens", type=int, default=0, metavar="N",
                      help="run the target once over N positions (generated rows + corpus windows), keep its "
                           "features on the device (2·dim bytes each in bf16) and train from them; 0 = a target "
                           "pass per batch (default: 0; see docs/FEATURE_HEAD.md)")
    head.add_argument("--kl-kernel", choices=("auto", "triton", "reference"), default="auto",
                      help="the KL loss: auto = the fused Triton pass on CUDA; reference = eager autograd")
    head.add_argument("--feature-cache-refresh", type=int, default=0, metavar="K",
                      help="with the cache: every K head steps one target pass replaces batch-size corpus rows "
                           "with fresh windows (default: 0 = never)")
    _add_training_options(head, generated_default="0.5")
    _add_run_options(head)
    add_checkpoint_options(head, draft=False)
    head.set_defaults(run=run)

    image = sub.add_parser("image", help="train an image pair on scikit-learn's 8×8 digits (pixel tokens)")
    image.add_argument("--preset", default="digits", help="digits, digits-tiny")
    image.add_argument("--out", required=True)
    image.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, ...")
    image.add_argument("--no-augment", action="store_true", help="train on the images only, without shifts")
    image.add_argument("--no-progress", action="store_true")
    image.set_defaults(run=run)
    parser.set_defaults(run=lambda args: _usage(parser))


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"torch CPU threads; 0 = torch's choice (default: {DEFAULT_THREADS})")
    parser.add_argument("--quiet", action="store_true", help="no progress or log lines on stderr")


def _usage(parser: argparse.ArgumentParser) -> int:
    raise CLIError("give a step (prepare, presets, pair, distill, head, image); see specdec train --help")


def _add_training_options(parser: argparse.ArgumentParser, generated_default: str) -> None:
    """The options `distill` and `head` share: the target-generated text to train on, the seed, the device."""
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="first generate N greedy target continuations of corpus prompts to train on")
    parser.add_argument("--generated-fraction", type=float, default=None,
                        help=f"share of each batch from the generated text (default: {generated_default} with "
                             "--generate, else 0)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=192)
    parser.add_argument("--gen-batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="(default: 0)")
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N (default: auto)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="also load pickled .bin weights (unpickling can run code: only for checkpoints you trust)")


def _check_training_options(args: argparse.Namespace) -> None:
    """Ranges of the numbers `distill` and `head` share (and of their --steps/--batch-size/--seq-len)."""
    for flag, value, low, high in (("--steps", args.steps, 1, None), ("--batch-size", args.batch_size, 1, 1 << 16),
                                   ("--seq-len", args.seq_len, 2, 1 << 16), ("--generate", args.generate, 0, 1 << 20),
                                   ("--prompt-len", args.prompt_len, 1, 1 << 16),
                                   ("--new-tokens", args.new_tokens, 1, 1 << 16),
                                   ("--gen-batch-size", args.gen_batch_size, 1, 1 << 16),
                                   ("--seed", args.seed, 0, (1 << 63) - 1)):
        check_int(flag, value, low, high)
    if args.generated_fraction is not None:
        check_float("--generated-fraction", args.generated_fraction, 0.0, 1.0)


def _check_numbers(args: argparse.Namespace) -> None:
    """Every number range-checked before a corpus is read or a model is built."""
    if args.train_command == "prepare":
        check_int("--vocab-size", args.vocab_size, 260, 1 << 20)  # byte-level BPE needs the 256 bytes + specials
        if args.val_fraction is not None:
            check_float("--val-fraction", args.val_fraction, 0.0, 0.5, open_low=True)
        check_int("--max-train-tokens", args.max_train_tokens, 1)
    if args.train_command == "head":
        check_float("--max-seconds", args.max_seconds, 0.0, open_low=True)
        check_float("--lr", args.lr, 0.0, 1.0, open_low=True)
        check_float("--kl-weight", args.kl_weight, 0.0)
        check_float("--feature-noise", args.feature_noise, 0.0)
        check_int("--batch-reuse", args.batch_reuse, 1, 1024)
        check_int("--depth", args.depth, 1, 16)
        check_int("--feature-cache-tokens", args.feature_cache_tokens, 0, 1 << 40)
        check_int("--feature-cache-refresh", args.feature_cache_refresh, 0, 1 << 30)
        if args.feature_cache_refresh and not args.feature_cache_tokens:
            raise CLIError("--feature-cache-refresh needs --feature-cache-tokens N")
        if args.feature_cache_tokens and args.batch_reuse > 1:
            raise CLIError("--batch-reuse applies without the feature cache only (--feature-cache-tokens 0)")
        _check_training_options(args)
    if args.train_command in ("pair", "distill", "head"):
        if args.train_command == "pair":
            check_float("--budget-scale", args.budget_scale, 0.0, open_low=True)
            check_float("--head-seconds", args.head_seconds, 0.0)
        elif args.train_command == "distill":
            check_float("--seconds", args.seconds, 0.0, open_low=True)
            check_float("--lr", args.lr, 0.0, 1.0, open_low=True)
            check_int("--val-generate", args.val_generate, 0, 1 << 20)
            _check_training_options(args)
            check_float("--document-starts", args.document_starts, 0.0, 1.0)
        from specdec.loading import resolve_device

        resolve_device(args.device)
        check_int("--threads", args.threads, 0, 1024)
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)


def run(args: argparse.Namespace) -> int:
    quiet = getattr(args, "quiet", False)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if quiet:
        args.no_progress = True
    _check_numbers(args)
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
        return run_distill(args)
    if args.train_command == "image":
        return _image(args)
    if args.train_command == "head":
        return run_head(args)
    raise CLIError(f"unknown step {args.train_command!r}")


def _prepare(args) -> int:
    from specdec.zoo.data import prepare_code_data, prepare_ende_data

    if args.corpus == "code":
        tokenizer = None
        if args.tokenizer is not None:
            tokenizer = Path(args.tokenizer)
            if not (tokenizer / "tokenizer.json").is_file():
                raise CLIError(f"--tokenizer: {tokenizer} has no tokenizer.json (give a model or tokenizer folder)")
        meta = prepare_code_data(args.out, roots=args.roots, vocab_size=args.vocab_size,
                                 val_fraction=0.01 if args.val_fraction is None else args.val_fraction,
                                 max_train_tokens=args.max_train_tokens, progress=not args.no_progress,
                                 tokenizer_dir=tokenizer)
    else:
        if args.tokenizer is not None:
            raise CLIError("--tokenizer: only for --corpus code (ende trains its own shared tokenizer)")
        meta = prepare_ende_data(args.out, mo_files=args.mo_files, locale_roots=args.locale_dirs,
                                 vocab_size=args.vocab_size,
                                 val_fraction=0.025 if args.val_fraction is None else args.val_fraction)
    shown = {k: v for k, v in meta.items() if not isinstance(v, list)}
    print(dumps(shown, indent=1))
    return 0


def _pair(args) -> int:
    from specdec.zoo.pipeline import train_pair
    from specdec.zoo.presets import get_preset, scale_budget

    preset = get_preset(args.preset)
    if args.budget_scale != 1.0:
        preset = scale_budget(preset, args.budget_scale)
    head = None
    if args.head_seconds > 0:
        from specdec.zoo.feature_head import DEFAULT_HEAD

        base = DEFAULT_HEAD.train
        head = replace(DEFAULT_HEAD, train=replace(base, max_seconds=args.head_seconds,
                                                   batch_size=min(base.batch_size, preset.target_train.batch_size),
                                                   seq_len=min(base.seq_len, preset.target_train.seq_len)))
    summary = train_pair(preset, args.data, args.out, device=args.device, progress=not args.no_progress, head=head)
    print(dumps(_brief(summary), indent=1))
    return 0


def _brief(summary: dict) -> dict:
    """The numbers a person looks at first."""
    out = {"preset": summary["preset"], "device": summary["device_name"], "total_seconds": summary.get("total_seconds"),
           "target": {k: summary["target"][k] for k in ("params", "steps", "tokens", "seconds", "val_loss",
                                                        "tokens_per_s", "mfu", "skipped_steps")}}
    if "head" in summary:
        out["head"] = {k: summary["head"][k] for k in ("steps", "seconds", "final_loss", "alpha_before", "alpha_after")}
    out["drafts"] = []
    for d in summary.get("drafts", []):
        row = {k: d.get(k) for k in ("params", "params_ratio", "init", "steps", "seconds", "val_loss")}
        if "distill" in d:
            for key in ("alpha_before", "alpha_after", "alpha_generated_before", "alpha_generated_after"):
                row[key] = d["distill"][key]
            row["distill_val_loss"] = d["distill"]["train"]["val_loss"]
        out["drafts"].append(row)
    return out


def _image(args) -> int:
    from specdec.zoo.images import get_image_preset, train_image_pair

    summary = train_image_pair(get_image_preset(args.preset), args.out, device=args.device,
                               progress=not args.no_progress, augment=not args.no_augment)
    print(dumps(_brief({**summary, "device_name": summary["device"]}), indent=1))
    return 0
