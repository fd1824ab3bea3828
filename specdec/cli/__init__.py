"""The `specdec` command line: one module per subcommand, each with `add_parser(subparsers)` and `run(args)`.

The contract, for every subcommand: results on stdout, diagnostics (progress, stats lines, warnings) on
stderr; `--json` prints strict JSON (no NaN/Infinity: null); every failure is ONE line on stderr
(`specdec CMD: error: ...`) and exit code 2, never a traceback (set SPECDEC_TRACEBACK=1 to see one).
Subcommand modules import torch/transformers inside `run`, so `specdec --help` stays fast.
"""

from __future__ import annotations

import argparse
import copy
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
    "check": "specdec.cli.check",
}

USAGE_ERROR = 2


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's help ends with its default, unless it already names one."""

    def _format_action(self, action):
        if action.help is None and action.option_strings and _shows_default(action.default):
            action = copy.copy(action)
            action.help = ""  # an option without help still shows its default
            action.help = self._get_help_string(action).strip()
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = action.help or ""
        if not _shows_default(action.default) or action.option_strings == [] or "default" in text:
            return text
        shown = " ".join(map(str, action.default)) if isinstance(action.default, (list, tuple)) else action.default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def _shows_default(default) -> bool:
    if default is None or default is False or default is argparse.SUPPRESS:
        return False
    return not (isinstance(default, (list, tuple)) and not default)


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one line on stderr, exit 2 (no usage block); every --help shows the
    options' defaults (`DefaultsHelpFormatter`); never abbreviations (`--model X` is not `--model-option`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        formatter = kwargs.get("formatter_class")
        if formatter in (None, argparse.HelpFormatter, argparse.RawDescriptionHelpFormatter):
            kwargs["formatter_class"] = DefaultsHelpFormatter
        super().__init__(*args, **kwargs)

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
    for command in sub.choices.values():  # read by `aliases.expand_config` before parsing; listed for --help
        command.add_argument("--config", default=None, metavar="FILE",
                             help="YAML or JSON file of this command's options (long names, - or _); the command "
                                  "line wins")
    return parser


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())  # newlines and runs of spaces → one line
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    if not isinstance(err, (CLIError, ValueError, FileNotFoundError, OSError)) or not text:
        text = f"{type(err).__name__}: {text or '(no message)'}"
    return text[:2000]


def main(argv: list[str] | None = None) -> int:
    from specdec.cli import aliases

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = aliases.expand_config(argv, parser)
    except CLIError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        print(f"specdec: error: give a command ({', '.join(SUBCOMMANDS)}); see specdec --help", file=sys.stderr)
        return USAGE_ERROR
    try:
        aliases.finish(args)
    except CLIError as err:
        print(f"specdec {args.command}: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    launcher = _launcher_misuse(args)
    if launcher is not None:
        if os.environ.get("RANK", "0") == "0":  # one line in all, not one per process
            print(f"specdec {args.command}: error: {launcher}", file=sys.stderr)
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


def _launcher_misuse(args: argparse.Namespace) -> str | None:
    """Under torchrun (WORLD_SIZE > 1) only a command given --tensor-parallel-size WORLD_SIZE (generate, serve) runs
    across the processes; anything else would run the same command WORLD_SIZE times, printing everything that many
    times."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not world.isdigit() or int(world) <= 1:
        return None
    if not hasattr(args, "tensor_parallel_size"):
        return (f"launched by torchrun with WORLD_SIZE={world}, but only generate and serve "
                "(with --tensor-parallel-size) run under torchrun")
    if args.tensor_parallel_size != 1:  # the tensor-parallel path checks it against the world size itself
        return None
    return (f"launched by torchrun with WORLD_SIZE={world} but without --tensor-parallel-size: pass "
            f"--tensor-parallel-size {world}, or run without torchrun")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
