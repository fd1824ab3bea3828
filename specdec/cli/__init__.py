"""The `specdec` command line: one module per subcommand, each with `add_parser(subparsers)` and `run(args)`.

Errors a user can cause (bad paths, bad numbers) raise `CLIError` (or ValueError): `main` prints one line
and exits non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
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


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue  # subcommand not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except (CLIError, ValueError, FileNotFoundError, OSError) as err:
        print(f"specdec {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
