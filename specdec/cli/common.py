"""What every subcommand shares: the model options, bounded numbers, strict JSON, stderr diagnostics.

Imports nothing heavy at module level (`specdec --help` builds every subparser).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from specdec.cli import CLIError
from specdec.strict_json import dumps, finite_or_none  # noqa: F401  (re-exported for the subcommands)

#: Default torch CPU threads for subcommands that run models. Measured on the 2-core CPU machine with the
#: demo pair (docs/BENCHMARKS.md, "CPU threads"): one thread is faster than two for these small models,
#: and far steadier when other processes share the cores. 0 = torch's own choice (all cores).
DEFAULT_THREADS = 1
MAX_THREADS = 1024
#: = specdec.loading.options.MODEL_OPTION_KEYS (named here so `specdec --help` need not import torch; a test
#: checks that the two agree)
MODEL_OPTION_KEYS = ("revision", "gguf_file", "subfolder", "cache_dir", "torch_dtype", "dtype", "device_map",
                     "max_memory", "attn_implementation", "quantization_config", "low_cpu_mem_usage", "variant")


def add_model_options(parser: argparse.ArgumentParser, *, device: str = "auto", dtype: str = "auto",
                      seed: int | None = None, seed_help: str = "seed for sampling (default: fresh randomness)",
                      threads: int = DEFAULT_THREADS) -> None:
    """--device, --dtype, --threads, --seed, --quiet, --allow-pickle, the same on every model-loading command.

    `parser` may be an argument group (the options join it) or a parser (they get a group of their own)."""
    group = parser if isinstance(parser, argparse._ArgumentGroup) else parser.add_argument_group("model options")
    group.add_argument("--device", default=device, help=f"auto (cuda if present), cpu, cuda, cuda:N (default: {device})")
    group.add_argument("--dtype", default=dtype,
                       help=f"auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16 (default: {dtype})")
    group.add_argument("--threads", type=int, default=threads,
                       help=f"torch CPU threads; 0 = torch's choice (default: {threads}: measured fastest on small CPUs)")
    group.add_argument("--seed", type=int, default=seed,
                       help=f"{seed_help}" + (f" (default: {seed})" if seed is not None else ""))
    group.add_argument("--quiet", action="store_true", help="no diagnostics on stderr (errors still are)")
    group.add_argument("--allow-pickle", action="store_true",
                       help="also load pickled .bin weights (unpickling can run code: only for checkpoints you trust)")
    group.add_argument("--gguf-weights", choices=("auto", "quantized", "dequantized"), default="auto",
                       help="a .gguf model on the CPU: keep its quantized blocks (8-bit activation kernel) or "
                            "dequantize to float32; auto = quantized where the CPU kernels build (dequantized "
                            "under --bitwise)")


def add_checkpoint_options(parser, *, draft: bool = True) -> None:
    """--model-option KEY=VALUE (repeatable), --draft-model-option, --allow-weight-mismatch: for the commands whose
    --target / --draft name a checkpoint (a folder, a .gguf file, or a hub id in the local Hugging Face cache)."""
    group = parser if isinstance(parser, argparse._ArgumentGroup) else parser.add_argument_group("checkpoint options")
    group.add_argument("--model-option", action="append", default=None, metavar="KEY=VALUE",
                       help="a from_pretrained option for --target, repeatable; VALUE is JSON or a string. Keys: "
                            f"{', '.join(MODEL_OPTION_KEYS)} (e.g. revision=v1, gguf_file=model.Q4_1.gguf, "
                            "attn_implementation=sdpa, device_map=auto)")
    if draft:
        group.add_argument("--draft-model-option", action="append", default=None, metavar="KEY=VALUE",
                           help="the same for a --draft checkpoint")
    group.add_argument("--allow-weight-mismatch", action="store_true",
                       help="load a checkpoint whose weights do not fill the model (missing tensors would be randomly "
                            "initialised) or hold tensors its config does not use")


def model_options(args: argparse.Namespace, which: str = "target") -> dict | None:
    """--model-option (which="target") or --draft-model-option as a validated dict; None when none was given."""
    flag = "--model-option" if which == "target" else "--draft-model-option"
    items = getattr(args, flag[2:].replace("-", "_"), None)
    if not items:
        return None
    from specdec.loading.options import check_model_options, parse_model_option

    options: dict = {}
    for item in items:
        try:
            key, value = parse_model_option(item)
        except ValueError as err:
            raise CLIError(f"{flag}: {err}") from None
        if key in options:
            raise CLIError(f"{flag}: {key} given twice")
        options[key] = value
    try:
        check_model_options(options)
    except (ValueError, TypeError) as err:
        raise CLIError(f"{flag}: {err}") from None
    return options


def loader_kwargs(args: argparse.Namespace, which: str = "target") -> dict:
    """The safety and option keywords of `specdec.loading.load_model` from the parsed command line."""
    return {"allow_pickle": bool(getattr(args, "allow_pickle", False)), "model_kwargs": model_options(args, which),
            "allow_weight_mismatch": bool(getattr(args, "allow_weight_mismatch", False))}


def apply_model_options(args: argparse.Namespace) -> None:
    """Range-check the shared options and apply --threads (before anything is loaded)."""
    for which in ("target", "draft"):
        model_options(args, which)  # a bad --model-option fails before anything loads
    check_int("--threads", args.threads, 0, MAX_THREADS)
    if getattr(args, "seed", None) is not None:
        check_int("--seed", args.seed, 0, (1 << 63) - 1)
    from specdec.loading import resolve_device, resolve_dtype

    try:
        device = resolve_device(args.device)
    except (ValueError, TypeError) as err:
        raise CLIError(f"--device: {err}") from None
    try:
        resolve_dtype(args.dtype, device)
    except (ValueError, TypeError) as err:
        raise CLIError(f"--dtype: {err}") from None
    if getattr(args, "gguf_weights", "auto") != "auto":
        from specdec.fast.quant.attach import set_default

        set_default(args.gguf_weights)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # the CLI owns the process


def check_int(flag: str, value: int | None, minimum: int | None = None, maximum: int | None = None) -> int | None:
    if value is None:
        return None
    if minimum is not None and value < minimum:
        raise CLIError(f"{flag} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise CLIError(f"{flag} must be <= {maximum}, got {value}")
    return value


def check_float(flag: str, value: float | None, minimum: float | None = None, maximum: float | None = None, *,
                open_low: bool = False) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value):
        raise CLIError(f"{flag} must be a finite number, got {value}")
    if minimum is not None and (value < minimum or (open_low and value == minimum)):
        raise CLIError(f"{flag} must be {'>' if open_low else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise CLIError(f"{flag} must be <= {maximum}, got {value}")
    return value


def print_json(obj) -> None:
    print(dumps(obj), flush=True)


def log(args: argparse.Namespace, message: str, prefix: str = "") -> None:
    """A diagnostic line on stderr, unless --quiet."""
    if not getattr(args, "quiet", False):
        stamp = f"[{prefix} {time.strftime('%H:%M:%S')}] " if prefix else ""
        print(f"{stamp}{message}", file=sys.stderr, flush=True)


def encode_prompts(tokenizer, texts) -> list[list[int]]:
    """Each --prompt's token ids; a prompt with none is refused, naming it (1-based)."""
    prompts = [tokenizer.encode(text) for text in texts]
    for i, ids in enumerate(prompts):
        if not ids:
            raise CLIError(f"--prompt {i + 1} is empty after tokenization")
    return prompts


def load_drafter(args, tokenizer, vocab_size: int, prompts_ids, device, dtype):
    """The drafter `--draft` names: None, prompt lookup, an n-gram table (fit on --ngram-data or the prompts)
    or a checkpoint (loaded on `device` in `dtype`, unless --draft-model-option says otherwise): the library's
    `text.drafts` builders, with the command line's names and errors."""
    from specdec.text.drafts import NGRAM_ORDERS, draft_checkpoint, named_draft

    if args.draft is None:
        return None
    kind = args.draft.lower()
    if kind == "prompt-lookup" or kind in NGRAM_ORDERS:
        data = prompts_ids
        if kind != "prompt-lookup" and args.ngram_data is not None:
            if not args.ngram_data.is_file():
                raise FileNotFoundError(f"--ngram-data file not found: {args.ngram_data}")
            data = [tokenizer.encode(args.ngram_data.read_text(encoding="utf-8", errors="replace"))]
        return named_draft(kind, data, vocab_size)
    kwargs = loader_kwargs(args, "draft")
    return draft_checkpoint(args.draft, tokenizer, vocab_size, device=device, dtype=dtype,
                            option="--draft-model-option", **kwargs)
