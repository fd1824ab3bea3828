"""`specdec bench`: by default the serving-traffic table (every drafter and γ policy vs plain decoding on the same
requests arriving over time); the presets compare our decoding with Hugging Face generate side by side.

    specdec bench --pair runs/gpu --head runs/gpu/head --data data/code --out OUT   # CUDA: the traffic table
    specdec bench --quick --json                            # CPU, tiny random models: the same table's structure
    specdec bench --target SmolLM2-135M-Instruct.Q4_1.gguf --draft specdec/assets/smol_head --out OUT  # a real model
    specdec bench --preset chat --quick --json              # CPU: chat traffic, prefix caching × speculation
    specdec bench --preset smoke --json                     # CPU, tiny random models, < 1 minute
    specdec bench --preset gpu --data data/code --train     # train the zoo gpu pair, then benchmark it
    specdec bench --preset gpu --data data/code --pair runs/gpu
    specdec bench --preset system --profile                 # 8B-shaped Llama: MBU + engine vs Thm 3.8

traffic (specdec.bench.traffic) writes OUT/traffic.json, OUT/traffic.md and OUT/traffic.png (rows go to
OUT/traffic.partial.jsonl as they come, removed at the end); the presets write OUT/bench_<preset>.json, OUT/bench_<preset>.md and PNG plots. Prints the Markdown
table, and with --json one JSON object on the last line. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.bench_chat import CHAT_ONLY, add_chat_options, run_chat_preset
from specdec.cli.bench_traffic import MAX_BENCH_GAMMA, TRAFFIC_DRAFTERS, TRAFFIC_ONLY, check_traffic, given, run_traffic
from specdec.cli.aliases import GAMMA_FLAGS, Deprecated, add_model_arguments
from specdec.cli.engine_flags import parse_mixed_step as _mixed_step
from specdec.cli.common import add_model_options, apply_model_options, check_int, dumps, log, print_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark ours vs transformers generate (tokens/s, α, c, Thm 3.8)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("traffic", "chat", "smoke", "gpu", "system"), default="traffic",
                   help="(default: traffic: serving traffic through the engine; CUDA, or --quick on CPU; chat: "
                        "multi-turn chat traffic, prefix caching on/off × speculation on/off)")
    p.add_argument("--out", default=None, help="folder for the JSON, Markdown and PNG files (default: runs/bench)")
    p.add_argument("--json", action="store_true", help="print one JSON summary object on the last line")
    p.add_argument("--pair", default=None, help="gpu: folder of a trained zoo pair (target/, draft0/), or `random`")
    p.add_argument("--data", default=None, help="gpu: prepared code corpus (prompts, bigram fit, training)")
    p.add_argument("--train", action="store_true", help="gpu: train the zoo gpu pair first (into --pair or OUT/pair)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="gpu --train: scale the zoo's time budgets (default: 1)")
    p.add_argument("--zoo-preset", default="gpu", help="gpu --train: which zoo preset to train (default: gpu; tests use tiny)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default: the preset's)")
    p.add_argument(*GAMMA_FLAGS, dest="gamma", type=int, default=None,
                   help="γ of the main grid, 1..8 (default: the preset's)")
    p.add_argument("--gamma", dest="gamma", type=int, default=argparse.SUPPRESS, action=Deprecated,
                   replacement="--num-draft-tokens", help="deprecated: --num-draft-tokens")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per configuration, median reported (default: the preset's; the traffic table: 1, "
                        "up to 20, every arm of a cell once per round in a rotated order, ratios to plain per round)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers baselines")
    p.add_argument("--profile", action="store_true", help="CUDA: kernel-time profile of plain and speculative steps")
    t = p.add_argument_group("traffic (the default preset; specdec.bench.traffic)")
    t.add_argument("--quick", action="store_true", help="tiny random models on CPU: the table's structure, not speed")
    t.add_argument("--head", default=None, help="a feature head folder (`specdec train head`) for the head drafter")
    add_model_arguments(t, required=False, help="a real model instead of the zoo pair: a .gguf file or a "
                        "transformers folder (CUDA bf16, or --device cpu fp32); prompts: chat and code requests through "
                        "its chat template", draft_help="with a model: the drafter trained for it, a feature head "
                        "folder (the head arm) or a draft model folder (the model arm)")
    t.add_argument("--drafters", nargs="+", choices=TRAFFIC_DRAFTERS, default=None,
                   help=f"drafters to measure (default: all: {' '.join(TRAFFIC_DRAFTERS)})")
    t.add_argument("--slots", type=int, nargs="+", default=None, help="requests decoded at once, 1..256 (default: 64 32 8 1)")
    t.add_argument("--arrival", nargs="+", default=None, metavar="A",
                   help="poisson:RATE (requests/s), poisson:Fx (F × plain's closed-loop rate), closed, closed:CLIENTS "
                        "(default: closed poisson:0.8x)")
    t.add_argument("--policy", nargs="+", default=None, help="γ policies: auto and/or fixed γ's (default: auto 4)")
    t.add_argument("--requests-per-slot", type=float, default=None, help="requests per cell per slot (default: 3)")
    t.add_argument("--prompt-tokens", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                   help="prompt lengths, uniform (default: 30 2000, cut to the model's context)")
    t.add_argument("--new-tokens", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                   help="max_new_tokens per request, uniform (default: 16 256; EOS also ends a request)")
    t.add_argument("--sampled-share", type=float, default=None, help="share of requests sampled at T=1 (default: 0.5)")
    t.add_argument("--max-seconds", type=float, default=None, help="start no arm (level) after this many seconds")
    t.add_argument("--serve", action="store_true",
                   help="instead of the engine table: `specdec serve` (the pair with --head, else its draft0; --quick: "
                        "the demo pair on CPU) under streaming clients, plain vs speculative requests per level")
    t.add_argument("--mixed-step", nargs="?", const=True, type=_mixed_step, default=None, metavar="true|false|auto",
                   help="every arm's engine (plain's too) with the mixed prefill/decode step on or off "
                        "(EngineConfig.mixed_step, its 'auto' budget) on the paged pool, prefix caching off; bare: "
                        "true; --serve: the server's --mixed-step (default: the engine's, auto)")
    t.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="every arm's engine (plain's too) with the host ahead of the device or not "
                        "(EngineConfig.async_scheduling); --serve: the server's flag (default: the engine's, on with "
                        "CUDA)")
    t.add_argument("--clients", type=int, nargs="+", default=None,
                   help="--serve: closed-loop clients per level, 1..4096 (default: 8 32 64 128; --quick 1 2)")
    add_chat_options(p)
    add_model_options(p, seed_help="traffic: the seed of the requests (default: 0); the presets: unused", dtype="auto")
    p.set_defaults(run=run)


#: the fast target/drafter of the presets are built for at most this many draft tokens per step

_ARGS: argparse.Namespace | None = None  # for --quiet in _log


def _log(msg: str) -> None:
    log(_ARGS or argparse.Namespace(quiet=False), msg, prefix="bench")


def _check(args: argparse.Namespace) -> None:
    """Every number range-checked before anything is built or loaded."""
    from specdec.request import MAX_NEW_TOKENS

    check_int("--num-draft-tokens (--gamma)", args.gamma, 1, MAX_BENCH_GAMMA)
    check_int("--repeats", args.repeats, 1, 1000)
    check_int("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS)
    if not (math.isfinite(args.budget_scale) and args.budget_scale > 0):
        raise CLIError(f"--budget-scale must be a finite number > 0, got {args.budget_scale}")
    if args.dtype not in ("auto", "bfloat16", "bf16"):
        raise CLIError(f"--dtype: the bench presets run in bfloat16 on CUDA and float32 on CPU (use auto), got {args.dtype!r}")
    if args.preset == "gpu" and args.pair not in (None, "random") and not Path(args.pair).is_dir():
        raise CLIError(f"--pair: no such folder: {args.pair} (a trained zoo pair with target/ and draft0/, or `random`)")
    if args.data is not None and not Path(args.data).is_dir():
        raise CLIError(f"--data: no such folder: {args.data} (prepare one with `specdec train prepare`)")


def run(args: argparse.Namespace) -> int:
    global _ARGS
    _ARGS = args
    if args.preset == "chat":
        apply_model_options(args)
        return run_chat_preset(args, _log)
    for name in CHAT_ONLY:
        if given(args, name):
            raise CLIError(f"--{name.replace('_', '-')} belongs to --preset chat")
    if args.preset == "traffic":
        spec, drafters = check_traffic(args)
        apply_model_options(args)
        return run_traffic(args, spec, drafters, _log)
    for name in TRAFFIC_ONLY:
        if given(args, name):
            raise CLIError(f"--{name.replace('_', '-')} belongs to the traffic table (the default preset), not "
                           f"--preset {args.preset}")
    _check(args)
    apply_model_options(args)
    from specdec.bench import presets
    from specdec.bench.device import device_info, documented_peak_bandwidth, mbu
    from specdec.bench.profile import profile_setup
    from specdec.bench.report import markdown_report, write_json, write_plots
    from specdec.bench.runner import headline, run_grid
    from specdec.loading import resolve_device

    device = resolve_device(args.device)
    out = Path(args.out or "runs/bench")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = device_info(device)
    _log(f"device: {info}")
    notes: list[str] = []
    kw = {k: v for k, v in (("max_new_tokens", args.max_new_tokens),) if v is not None}
    if args.preset == "smoke":
        setup = presets.smoke(device, **kw)
    elif args.preset == "gpu":
        data = Path(args.data) if args.data else None
        pair = Path(args.pair) if args.pair else None
        if args.train:
            if data is None:
                raise CLIError("--train needs --data (a prepared code corpus: `specdec train prepare --corpus code`)")
            pair = pair or out / "pair"
            _log(f"training the zoo {args.zoo_preset} pair (budget scale {args.budget_scale}) into {pair}")
            summary = presets.train_gpu_pair(data, pair, args.budget_scale, device, preset=args.zoo_preset)
            target_info = summary.get("target", {})
            drafts = summary.get("drafts") or [{}]
            distill = drafts[0].get("distill", {})
            notes.append(f"pair trained in this run by specdec.zoo (preset {args.zoo_preset}, budget scale {args.budget_scale}, "
                         f"{summary.get('total_seconds')} s): target {target_info.get('params')} params, "
                         f"{target_info.get('steps')} steps, val loss {target_info.get('val_loss')}; drafter "
                         f"{drafts[0].get('params')} params; teacher-forced α before/after distillation "
                         f"{distill.get('alpha_before')} / {distill.get('alpha_after')}")
            (out / "zoo_summary.json").write_text(dumps(summary, indent=1))
        extra = {k: v for k, v in (("gamma", args.gamma), ("repeats", args.repeats)) if v is not None}
        setup = presets.gpu(device, pair_dir=pair, data_dir=data, allow_pickle=args.allow_pickle, **kw, **extra)
    else:
        extra = {k: v for k, v in (("repeats", args.repeats),) if v is not None}
        setup = presets.system(device, **kw, **extra)
    limit = getattr(setup.target, "max_draft_tokens", MAX_BENCH_GAMMA)
    if args.gamma is not None and args.gamma > limit:
        raise CLIError(f"--num-draft-tokens (--gamma) must be <= {limit} for the {args.preset} preset (its models are built for it), "
                       f"got {args.gamma}")
    if args.gamma is not None and args.preset != "gpu":
        setup.gamma = args.gamma
    if args.repeats is not None:
        setup.repeats = args.repeats
    if args.no_hf:
        setup.hf_target = setup.hf_draft = None
    setup.notes.extend(notes)
    documented = documented_peak_bandwidth(info.get("name", "")) if device.type == "cuda" else None
    measured = info.get("measured_copy_bandwidth_tbs")
    setup.peak_bandwidth = documented or (measured * 1e12 if measured else None)
    _log(f"preset {setup.name}: {len(setup.prompts)} prompts of {len(setup.prompts[0])} tokens, "
         f"max_new_tokens={setup.max_new_tokens}, γ={setup.gamma}")

    partial = out / f"bench_{setup.name}.partial.jsonl"  # rows as they come (survives a killed run)
    partial.write_text("")

    def log_row(msg: str) -> None:
        _log(msg)

    def on_row(row: dict) -> None:
        with partial.open("a") as fh:
            fh.write(dumps(row) + "\n")

    rows = run_grid(setup, log=log_row, on_row=on_row)
    for row in rows:
        if row.get("target_forwards_per_s") and measured:
            row["mbu_vs_copy"] = mbu(setup.weight_bytes.get("target", 0), row["target_forwards_per_s"], measured * 1e12)

    result = {
        "preset": setup.name,
        "device_info": info,
        "models": {k: f"{v / 2**20:.1f} MiB" for k, v in setup.weight_bytes.items()},
        "workload": {"prompts": len(setup.prompts), "prompt_tokens": len(setup.prompts[0]),
                     "max_new_tokens": setup.max_new_tokens, "gamma": setup.gamma, "repeats": setup.repeats,
                     "peak_bandwidth_tbs": setup.peak_bandwidth / 1e12 if setup.peak_bandwidth else None,
                     "peak_bandwidth_source": "datasheet" if documented else ("measured copy" if measured else None)},
        "notes": setup.notes,
        "rows": rows,
        "headline": headline(rows),
    }
    if args.profile and device.type == "cuda":
        result["profile"] = profile_setup(setup, log=_log)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    prefix = f"bench_{setup.name}"
    write_json(result, out / f"{prefix}.json")
    report = markdown_report(result)
    (out / f"{prefix}.md").write_text(report + "\n")
    partial.unlink(missing_ok=True)  # every row is in the JSON now
    try:
        result["plots"] = write_plots(rows, out, prefix)
    except ImportError:
        result["plots"] = []
        _log("matplotlib is not installed: no plots")
    print(report)
    if args.json:
        print_json(_summary(result, out / f"{prefix}.json"))
    return 0


def _summary(result: dict, json_path: Path) -> dict:
    head = result["headline"]
    t0 = head.get("t0", {})
    return {
        "preset": result["preset"],
        "device": result["device_info"].get("name"),
        "alpha": t0.get("alpha"),
        "tau": t0.get("tau"),
        "c": t0.get("c"),
        "gamma": t0.get("gamma"),
        "predicted_speedup": t0.get("predicted_speedup"),
        "measured_speedup": t0.get("measured_speedup"),
        "tokens_per_s": t0.get("tokens_per_s"),
        "t1": head.get("t1"),
        "hf_assisted": head.get("hf_assisted"),
        "hf_plain": head.get("hf_plain"),
        "json": str(json_path),
        "seconds": result["seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m specdec.cli.bench ...`: the bench alone, without loading the other subcommands."""
    from specdec.cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
