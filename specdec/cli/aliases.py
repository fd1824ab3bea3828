"""The names users already type: vLLM's and llama.cpp's spellings of specdec's options, a positional model,
`--speculative-config`, `--config FILE`, and deprecated spellings that still work (with a warning).

    specdec serve MODEL --speculative-config '{"model": "DRAFT", "num_speculative_tokens": 4}' --max-model-len 4096
    specdec serve -m MODEL -md DRAFT --draft-max 4 -c 4096          # llama-server's names
    specdec serve --config serve.yaml                                # the same options as YAML or JSON

Every alias names the same argparse destination as specdec's own flag, so `--help` lists them side by side and
nothing downstream knows which spelling was used. Imports nothing heavy (`specdec --help` builds every parser).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec.cli import CLIError

#: specdec's flag first, then vLLM's / llama.cpp's spellings of the same option (the engine's: `cli/engine_flags.py`)
TARGET_FLAGS = ("--target", "--model", "-m")
DRAFT_FLAGS = ("--draft", "-md", "--model-draft")
GAMMA_FLAGS = ("--num-draft-tokens", "--draft-max")
#: the runner, one vocabulary on every command (`specdec.generate(engine=...)`'s)
ENGINES = ("auto", "fast", "hf")
#: --engine → `specdec.load(runner=...)`'s names for the same runners
RUNNER_OF_ENGINE = {"auto": "auto", "fast": "engine", "hf": "fallback"}
ENGINE_HELP = ("the runner: auto (the request-level engine on every device; hf only for a model or drafter it "
               "refuses), fast (the engine), hf (the eager transformers loop)")
#: `--speculative-config` keys (vLLM's) this CLI honours; any other key is refused by name
SPECULATIVE_KEYS = ("model", "num_speculative_tokens", "method")
#: vLLM's `method` → specdec's --draft (a checkpoint method needs "model")
SPECULATIVE_METHODS = {"ngram": "prompt-lookup", "draft_model": None, "eagle": None, "eagle3": None, "medusa": None,
                       "mlp_speculator": None}
MAX_CONFIG_BYTES = 1 << 20


def add_model_arguments(parser: argparse.ArgumentParser, *, required: bool = True,
                        help: str = "target checkpoint: a folder, a .gguf file, or a hub id (org/name) in the local "
                                    "HF cache", draft_help: str | None = None, target_type=None) -> None:
    """The model as a positional argument or --target / --model / -m; --draft / -md / --model-draft when
    `draft_help` is given; --speculative-config (vLLM's JSON) beside it. `finish` merges them after parsing."""
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL", help=f"{help} (or --model)")
    parser.add_argument(*TARGET_FLAGS, dest="target", default=None, type=target_type, metavar="MODEL",
                        help="the model, as an option (vLLM's --model, llama.cpp's -m)")
    if draft_help is not None:
        parser.add_argument(*DRAFT_FLAGS, dest="draft", default=None, metavar="DRAFT",
                            help=f"{draft_help} (llama.cpp's -md / --model-draft)")
        parser.add_argument("--speculative-config", default=None, metavar="JSON",
                            help="vLLM's spelling: '{\"model\": DRAFT, \"num_speculative_tokens\": N}' (method "
                                 "\"ngram\" = prompt-lookup); sets --draft and --num-draft-tokens")
    parser.set_defaults(_model_required=required, _target_type=target_type)


def add_engine_argument(parser, *, default: str = "auto", legacy_runner: bool = False) -> None:
    """--engine {auto,fast,hf}; with `legacy_runner`, the deprecated --runner {auto,engine,fallback} beside it."""
    parser.add_argument("--engine", choices=ENGINES, default=default, help=ENGINE_HELP)
    if legacy_runner:
        parser.add_argument("--runner", dest="engine", choices=("auto", "engine", "fallback"), default=argparse.SUPPRESS,
                            action=DeprecatedRunner, help="deprecated: --engine (engine = fast, fallback = hf)")


class Deprecated(argparse.Action):
    """A deprecated spelling of another option: stores as that option does, and says once on stderr which to use."""

    def __init__(self, option_strings, dest, replacement: str = "", **kwargs):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, self.convert(values))

    def convert(self, values):
        return values


class DeprecatedRunner(Deprecated):
    """--runner's old values, mapped onto --engine's."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, replacement="--engine", **kwargs)

    def convert(self, values):
        return {"engine": "fast", "fallback": "hf"}.get(values, values)


def finish(args: argparse.Namespace) -> argparse.Namespace:
    """After parsing: the positional model merged into --target (given once), --speculative-config applied,
    a required model checked — each failure one line naming the option."""
    positional = getattr(args, "model", None)
    if positional is not None:
        if getattr(args, "target", None) is not None and str(args.target) != positional:
            raise CLIError(f"the model is given twice: {positional!r} and --model {args.target}; give it once")
        convert = getattr(args, "_target_type", None)
        args.target = convert(positional) if convert is not None else positional
    if getattr(args, "speculative_config", None) is not None:
        _apply_speculative_config(args)
    if getattr(args, "_model_required", False) and getattr(args, "target", None) is None:
        raise CLIError(f"the model is required: specdec {args.command} MODEL (or --model MODEL)")
    return args


def _apply_speculative_config(args: argparse.Namespace) -> None:
    text = args.speculative_config
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise CLIError(f"--speculative-config must be a JSON object: {err}") from None
    if not isinstance(config, dict):
        raise CLIError(f"--speculative-config must be a JSON object, got {text!r:.80}")
    unknown = sorted(set(config) - set(SPECULATIVE_KEYS))
    if unknown:
        raise CLIError(f"--speculative-config: unsupported key {unknown[0]!r} (supported: {', '.join(SPECULATIVE_KEYS)})")
    method = config.get("method")
    if method is not None and method not in SPECULATIVE_METHODS:
        raise CLIError(f"--speculative-config: method must be one of {', '.join(SPECULATIVE_METHODS)}, got {method!r}")
    draft = config.get("model", SPECULATIVE_METHODS.get(method) if method else None)
    if draft is None:
        raise CLIError("--speculative-config needs \"model\" (a draft checkpoint or head folder) or "
                       "\"method\": \"ngram\"")
    if not isinstance(draft, str) or not draft:
        raise CLIError(f"--speculative-config: model must be a path or hub id, got {draft!r}")
    if getattr(args, "draft", None) is not None and args.draft != draft:
        raise CLIError(f"the draft is given twice: --draft {args.draft} and --speculative-config's {draft!r}")
    args.draft = draft
    if "num_speculative_tokens" in config:
        n = config["num_speculative_tokens"]
        if isinstance(n, bool) or not isinstance(n, int):
            raise CLIError(f"--speculative-config: num_speculative_tokens must be an integer, got {n!r}")
        dest = "num_draft_tokens" if hasattr(args, "num_draft_tokens") else "gamma"  # (bench's γ is `gamma`)
        current = getattr(args, dest, None)
        setattr(args, dest, str(n) if isinstance(current, str) else n)


# --- --config FILE ----------------------------------------------------------------------------------------------

def expand_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`specdec CMD --config FILE ...`: FILE's options (YAML or JSON, keys = long option names with - or _) as
    command-line arguments placed before the others, so an option given on the command line wins."""
    if "--config" not in argv and not any(a.startswith("--config=") for a in argv):
        return argv
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(argv):
                    raise CLIError("--config needs a file")
                path, rest = argv[i + 1], argv[:i] + argv[i + 2:]
            else:
                path, rest = arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
            break
    command = next((a for a in rest if not a.startswith("-")), None)
    sub = _subparser(parser, command)
    if sub is None:
        raise CLIError("--config goes after the command: specdec COMMAND --config FILE")
    options = read_config(Path(path))
    at = rest.index(command) + 1
    return rest[:at] + config_arguments(options, sub) + rest[at:]


def _subparser(parser, command):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def read_config(path: Path) -> dict:
    """A YAML or JSON mapping of options; refused in one line when it is not one."""
    if not path.is_file():
        raise CLIError(f"--config: {path}: no such file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CLIError(f"--config: {path}: larger than 1 MiB")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--config: {path}: {err}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise CLIError(f"--config: {path}: YAML needs pyyaml (pip install pyyaml), or give a .json file") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise CLIError(f"--config: {path}: {' '.join(str(err).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CLIError(f"--config: {path}: must be a mapping of option: value, got {type(data).__name__}")
    return data


def config_arguments(options: dict, parser: argparse.ArgumentParser) -> list[str]:
    """{option: value} → argv for `parser`: a flag for true, nothing for false, repeated for append options,
    space-separated values for multi-value options; an unknown option is refused by name."""
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    out: list[str] = []
    for key, value in options.items():
        if key == "model" and not isinstance(value, (dict, list)):
            out.append(str(value))  # the positional model (vLLM's config files spell it `model`)
            continue
        flag = "--" + str(key).replace("_", "-")
        action = by_flag.get(flag)
        if action is None or flag == "--config":
            raise CLIError(f"--config: unknown option {key!r} for this command")
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(value, bool):
                raise CLIError(f"--config: {key} must be true or false, got {value!r}")
            if value == isinstance(action, argparse._StoreTrueAction):
                out.append(flag)
            continue
        if isinstance(action, argparse._StoreConstAction) and isinstance(action.const, bool):  # a flag pair
            if not isinstance(value, bool):
                raise CLIError(f"--config: {key} must be true or false, got {value!r}")
            other = [a for a in parser._actions if a.dest == action.dest and a is not action]
            out.append(flag if value or not other else other[0].option_strings[0])
            continue
        values = value if isinstance(value, list) else [value]
        text = [json.dumps(v) if isinstance(v, dict) else str(v) for v in values]
        if isinstance(action, argparse._AppendAction):
            for v in text:
                out += [flag, v]
        else:
            out += [flag, *text]
    return out
