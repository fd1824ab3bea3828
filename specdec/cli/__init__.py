"""The `specdec` command line: one module per subcommand, each with `add_parser(subparsers)` and `run(args)`.

The contract, for every subcommand: results on stdout, diagnostics (progress, stats lines, warnings) on
stderr; `--json` prints strict JSON (no NaN/Infinity: null); every failure is ONE line on stderr
(`specdec CMD: error: ...`) and exit code 2, never a traceback (set SPECDEC_TRACEBACK=1 to see one).
Subcommand modules import torch/transformers inside `run`, so `specdec --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand name -> module under specdec.cli (imported lazily so `specdec --help` stays fast)
SUBCOMMANDS = {
    "generate": "specdec.cli.generate",
    "analyze": "specdec.cli.analyze",
    "train": "specdec.cli.train",
    "demo": "specdec.cli.demo",
    "bench": "specdec.cli.bench",
    "policies": "specdec.cli.policies",
    "serve": "specdec.cli.serve",
    "beam": "specdec.cli.beam",
}

USAGE_ERROR = 2


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one line on stderr, exit 2 (no usage block)."""

    def error(self, message: str):  # noqa: D102 - argparse API
        first = message.strip().splitlines()[0] if message.strip() else "invalid arguments"
        self.exit(USAGE_ERROR, f"{self.prog}: error: {first} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from specdec import __version__

    parser = Parser(prog="specdec", description="Exact speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue  # subcommand not built yet
            raise
        module.add_parser(sub)
    return parser


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())  # newlines and runs of spaces → one line
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    if not isinstance(err, (CLIError, ValueError, FileNotFoundError, OSError)) or not text:
        text = f"{type(err).__name__}: {text or '(no message)'}"
    return text[:2000]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        print(f"specdec: error: give a command ({', '.join(SUBCOMMANDS)}); see specdec --help", file=sys.stderr)
        return USAGE_ERROR
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print(f"specdec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specdec ... | head`: the reader left; not an error of ours
        _silence_stdout()
        return 0
    except Exception as err:  # noqa: BLE001 - the contract: one line, exit 2, never a traceback
        if os.environ.get("SPECDEC_TRACEBACK"):
            raise
        print(f"specdec {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return USAGE_ERROR


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
