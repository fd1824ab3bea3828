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


def add_model_options(parser: argparse.ArgumentParser, *, device: str = "auto", dtype: str = "auto",
                      seed: int | None = None, seed_help: str = "seed for sampling (default: fresh randomness)",
                      threads: int = DEFAULT_THREADS) -> None:
    """--device, --dtype, --threads, --seed, --quiet, --allow-pickle, the same on every model-loading command.

    `parser` may be an argument group (the options join it) or a parser (they get a group of their own)."""
    group = parser if isinstance(parser, argparse._ArgumentGroup) else parser.add_argument_group("model options")
    group.add_argument("--device", default=device, help=f"auto (cuda if present), cpu, cuda, cuda:N (default {device})")
    group.add_argument("--dtype", default=dtype,
                       help=f"auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16 (default {dtype})")
    group.add_argument("--threads", type=int, default=threads,
                       help=f"torch CPU threads; 0 = torch's choice (default {threads}: measured fastest on small CPUs)")
    group.add_argument("--seed", type=int, default=seed,
                       help=f"{seed_help}" + (f" (default {seed})" if seed is not None else ""))
    group.add_argument("--quiet", action="store_true", help="no diagnostics on stderr (errors still are)")
    group.add_argument("--allow-pickle", action="store_true",
                       help="also load pickled .bin weights (unpickling can run code: only for checkpoints you trust)")


def apply_model_options(args: argparse.Namespace) -> None:
    """Range-check the shared options and apply --threads (before anything is loaded)."""
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
