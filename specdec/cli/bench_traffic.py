"""`specdec bench`'s traffic table (the default preset): its options checked into a `TrafficSpec` before anything
loads — the zoo pair (`--pair`, `--head`), a real model (`--target` GGUF or folder with `--draft`), or tiny random
models (`--quick`) — and run through `specdec.bench.traffic` (or `--serve`: through `specdec serve`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.common import check_int, print_json

MAX_BENCH_GAMMA = 8
#: specdec.bench.traffic_setup.DRAFTERS (not imported here: `specdec --help` stays free of torch)
TRAFFIC_DRAFTERS = ("model", "head", "lookup", "ngram")
TRAFFIC_ONLY = ("quick", "head", "target", "draft", "drafters", "slots", "arrival", "policy", "requests_per_slot", "prompt_tokens",
                 "new_tokens", "sampled_share", "max_seconds", "serve", "clients", "mixed_step",
                 "async_scheduling")
PRESET_ONLY = ("train", "gamma", "no_hf", "profile", "max_new_tokens")  # (--repeats: both, one meaning)


def given(args: argparse.Namespace, name: str) -> bool:
    value = getattr(args, name)
    return value is not None and value is not False


def traffic_spec(args: argparse.Namespace):
    """The traffic run's `TrafficSpec` from the options (the preset's defaults for those not given); every
    value checked here, each error naming its option."""
    from specdec.bench.traffic import TrafficSpec, parse_arrival, parse_policy
    from specdec.bench.traffic_setup import GPU_SPEC, QUICK_SPEC

    base = dict(QUICK_SPEC if args.quick else GPU_SPEC)
    if args.target is not None and on_cpu(args.device):  # a real model on the CPU: a few requests per cell
        base["min_requests"] = QUICK_SPEC["min_requests"]
    for flag, name, convert in (("--arrival", "arrival", parse_arrival), ("--policy", "policy", parse_policy)):
        values = getattr(args, name) or base[name + "s" if name == "arrival" else "policies"]
        try:
            base["arrivals" if name == "arrival" else "policies"] = tuple(convert(v) for v in values)
        except ValueError as err:
            raise CLIError(f"{flag}: {err}") from None
    for flag, name in (("--slots", "slots"), ("--requests-per-slot", "requests_per_slot"), ("--repeats", "repeats"),
                       ("--prompt-tokens", "prompt_tokens"), ("--new-tokens", "new_tokens"),
                       ("--sampled-share", "sampled_share")):
        value = getattr(args, name)
        if value is not None:
            base[name] = tuple(value) if isinstance(value, list) else value
        try:
            TrafficSpec(**{k: v for k, v in base.items() if k in ("arrivals", "policies", name)})
        except (ValueError, TypeError) as err:
            raise CLIError(f"{flag}: {err}") from None
    for policy in base["policies"]:
        if policy != "auto" and policy > MAX_BENCH_GAMMA:
            raise CLIError(f"--policy: the traffic table's engines are built for γ <= {MAX_BENCH_GAMMA}, got {policy}")
    base["seed"] = args.seed or 0
    return TrafficSpec(**base)


def on_cpu(device: str) -> bool:
    if device == "cpu":
        return True
    if device != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


def check_traffic(args: argparse.Namespace):
    for name in PRESET_ONLY:
        if given(args, name):
            flag = "--num-draft-tokens (--gamma)" if name == "gamma" else f"--{name.replace('_', '-')}"
            raise CLIError(f"{flag} belongs to the presets (--preset smoke/gpu/system), not the "
                           "traffic table (see --policy, --new-tokens)")
    spec = traffic_spec(args)
    if args.max_seconds is not None and not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        raise CLIError(f"--max-seconds must be a finite number > 0, got {args.max_seconds}")
    drafters = tuple(dict.fromkeys(args.drafters or TRAFFIC_DRAFTERS))
    if args.draft is not None and args.target is None:
        raise CLIError("--draft belongs to --target (the zoo pair's drafters: --pair, --head)")
    if args.target is not None:
        return spec, check_target(args, drafters)
    if args.serve:
        for name in ("drafters", "slots", "policy", "requests_per_slot", "repeats"):
            if given(args, name):
                raise CLIError(f"--{name.replace('_', '-')}: --serve runs levels of --clients (and --arrival poisson "
                               "rates) against one server (its drafter: --head, else the pair's draft0; γ auto)")
        for c in args.clients or ():
            check_int("--clients", c, 1, 4096)
        drafters = ("head",) if args.head else ("model",)
    elif args.clients is not None:
        raise CLIError("--clients belongs to --serve (the engine table takes --slots)")
    if args.dtype not in ("auto", "bfloat16", "bf16"):
        raise CLIError(f"--dtype: the traffic table runs in bfloat16 on CUDA and float32 on CPU (use auto), got {args.dtype!r}")
    if args.quick:
        if args.device not in ("auto", "cpu"):
            raise CLIError(f"--device: --quick runs on the CPU, got {args.device!r}")
        for name in ("pair", "data", "head"):
            if given(args, name):
                raise CLIError(f"--{name}: --quick runs tiny random models on CPU; leave --quick out for the GPU table")
        return spec, drafters
    import torch

    if not torch.cuda.is_available():
        raise CLIError("the traffic table needs a CUDA device: use --quick (tiny random models on CPU) or a --preset")
    if args.pair is None or args.pair == "random" or not Path(args.pair).is_dir():
        raise CLIError(f"--pair: a trained zoo pair folder with target/ and draft0/ is needed, got {args.pair}")
    if args.data is None:
        raise CLIError("--data: the prepared code corpus (tokenizer, bigram text) is needed: specdec train prepare")
    if "head" in drafters and (args.head is None or not (Path(args.head) / "feature_head.json").is_file()):
        raise CLIError(f"--head: a feature head folder (feature_head.json) is needed for the head drafter, got "
                       f"{args.head} (or leave head out of --drafters)")
    if "head" not in drafters and args.head is not None:
        raise CLIError("--head given but 'head' is not in --drafters")
    return spec, drafters


def check_target(args: argparse.Namespace, drafters: tuple) -> tuple:
    """--target/--draft: the files exist and fit the drafters, before anything loads → the drafters to run."""
    for name in ("quick", "pair", "data", "head", "serve"):
        if given(args, name):
            raise CLIError(f"--{name}: --target runs a real model with --draft (leave --{name} out)")
    target = Path(args.target)
    if not (target.is_file() and target.suffix == ".gguf") and not (target / "config.json").is_file():
        raise CLIError(f"--target {target}: neither a .gguf file nor a model folder (config.json)")
    kind = None
    if args.draft is not None:
        from specdec.bench.traffic_setup import draft_kind  # (checks files only)

        try:
            kind = draft_kind(Path(args.draft))
        except ValueError as err:
            raise CLIError(str(err)) from None
    if args.drafters is None:  # the drafter given, prompt lookup and the bigram
        drafters = tuple(d for d in TRAFFIC_DRAFTERS if d not in ("head", "model") or d == kind)
    for name in ("head", "model"):
        if name in drafters and kind != name:
            raise CLIError(f"--drafters {name}: needs --draft DIR, a "
                           f"{'feature head' if name == 'head' else 'draft model'} folder (got "
                           f"{'none' if kind is None else f'a {kind} folder'})")
    if kind is not None and kind not in drafters:
        raise CLIError(f"--draft is a {kind} folder but '{kind}' is not in --drafters")
    import torch

    device = args.device
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise CLIError(f"--device: --target runs on CUDA or the CPU, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device}: no CUDA device here (use --device cpu)")
    return drafters


def _variant(args: argparse.Namespace):
    from specdec.bench.traffic_setup import EngineVariant

    return EngineVariant(mixed_step=args.mixed_step, async_scheduling=args.async_scheduling)


def run_traffic(args: argparse.Namespace, spec, drafters, log) -> int:
    from specdec.bench.traffic_setup import pair_setup, quick_setup, run_and_write, serve_and_write

    out = Path(args.out or "runs/bench")
    if args.serve:
        clients = args.clients or ((1, 2) if args.quick else (8, 32, 64, 128))
        result = serve_and_write(spec, out, pair=args.pair, data=args.data, head=args.head, clients=clients,
                                 quick=args.quick, log=log, max_seconds=args.max_seconds, variant=_variant(args))
        print(result["markdown"])
        if args.json:
            print_json({"preset": "traffic", "serve": True, "levels": [
                {k: r[k] for k in ("mode", "concurrency", "throughput_tok_s", "itl_p99_s", "vs_plain", "itl_p99_vs_plain")}
                for r in result["levels"]], "json": str(out / "serve.json"), "seconds": result["seconds"]})
        return 0
    max_batch = max(spec.slots)
    if args.quick:
        setup = quick_setup(drafters, max_batch=max_batch, variant=_variant(args))
    elif args.target is not None:
        from specdec.bench.traffic_setup import target_setup
        from specdec.loading import resolve_device

        try:
            context = min(4096, spec.prompt_tokens[1] + spec.new_tokens[1] + 64)  # (the cache: no larger than asked)
            setup = target_setup(Path(args.target), Path(args.draft) if args.draft else None, drafters,
                                 max_batch=max_batch, device=resolve_device(args.device), max_context=context,
                                 variant=_variant(args))
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise CLIError(str(err)) from None
    else:
        from specdec.loading import resolve_device

        device = resolve_device(args.device)
        if device.type != "cuda":
            raise CLIError(f"--device: the traffic table runs on CUDA (or --quick on the CPU), got {args.device!r}")
        setup = pair_setup(Path(args.pair), Path(args.data), Path(args.head) if args.head else None, drafters,
                           max_batch=max_batch, device=device, variant=_variant(args))
    log(f"traffic: {setup.device}; slots {list(spec.slots)}; arrivals {[a.label for a in spec.arrivals]}; "
         f"drafters {list(setup.arms)}; policies {list(spec.policies)}")
    result = run_and_write(spec, setup, out, log=log, max_seconds=args.max_seconds)
    print(result["markdown"])
    if args.json:
        print_json({"preset": "traffic", "device": result["device"], "summary": result["summary"],
                    "rows": len(result["rows"]), "json": str(out / "traffic.json"), "seconds": result["seconds"]})
    return 0
