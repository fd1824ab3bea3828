"""`specdec policies`: compare draft-length policies (fixed γ, heuristic, optimal, threshold, guarded) against
plain decoding on workloads with different acceptance profiles; tokens/s, speedup, τ, α, mean γ and c.

    specdec policies                      # the shipped demo pair, code / text / repetitive, < 10 min on one CPU core
    specdec policies --quick --json       # < 1 minute smoke run
    specdec policies --target DIR --draft DIR --workloads code,text --policies 2,4,heuristic,guarded

Writes OUT/policies.json (everything, per-run numbers included) and OUT/policies.md (the table and the
command that reproduces it); prints the Markdown table, and with --json one JSON object on the last line.
Progress goes to stderr. See specdec/bench/policy_bench.py for the timing protocol.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.bench.demo_pair import DEMO_PAIR
from specdec.cli import CLIError
from specdec.cli.common import (add_checkpoint_options, add_model_options, apply_model_options, check_float, check_int,
                                dumps, loader_kwargs, log, model_options, print_json)

QUICK = {"prompts": 1, "max_new_tokens": 32, "repeats": 1, "warmup_tokens": 4}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("policies", help="benchmark draft-length policies (tokens/s, τ, α) on several workloads",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None,
                   help=f"target checkpoint: folder, .gguf file or cached hub id (default: {DEMO_PAIR}/target)")
    p.add_argument("--draft", default=None, help="draft checkpoint (default: the demo pair's draft)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, .gguf or hub id (default: the target's)")
    p.add_argument("--workloads", default="code,text,repetitive", help="comma list of code, text, repetitive")
    p.add_argument("--policies", default="1,2,4,6,8,heuristic,optimal,threshold,guarded",
                   help="comma list: integers (fixed γ) and policy names; plain decoding always runs")
    p.add_argument("--drafters", default="model",
                   help="comma list: model (the draft checkpoint), lookup (prompt lookup); each runs every policy")
    p.add_argument("--prompts", type=int, default=3, help="prompts per workload (default: 3)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default: 128)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default: 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats, interleaved (default: 3; median reported)")
    p.add_argument("--temperature", default="0", help="comma list of temperatures (default: 0; e.g. 0,1)")
    p.add_argument("--keep-eos", action="store_true", help="stop at EOS (default: always generate max-new-tokens)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 prompt per workload, 32 new tokens, 1 repeat (< 1 minute on the demo pair)")
    p.add_argument("--out", type=Path, default=Path("runs/policies"), help="output folder (default: runs/policies)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    add_model_options(p, device="cpu", seed=0, seed_help="sampling seed (temperature > 0)")
    add_checkpoint_options(p)
    p.set_defaults(run=run)
    return p


_ARGS: argparse.Namespace | None = None  # for --quiet in _log


def _log(msg: str) -> None:
    log(_ARGS or argparse.Namespace(quiet=False), msg, prefix="policies")


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _default_draft(pair: Path) -> Path:
    for name in ("draft", "draft0"):
        if (pair / name).is_dir():
            return pair / name
    return pair / "draft"


def run(args: argparse.Namespace) -> int:
    from specdec.drafters import PromptLookupDrafter
    from specdec.loading import load_model, load_tokenizer, source_options
    from specdec.bench.policy_bench import BenchSettings, run_policy_bench
    from specdec.bench.workloads import build_workloads

    if args.quick:
        for name, value in QUICK.items():
            if name != "warmup_tokens":
                setattr(args, name, value)
    global _ARGS
    _ARGS = args
    from specdec.policy import resolve_policy
    from specdec.request import MAX_NEW_TOKENS

    for flag, value, top in (("--prompts", args.prompts, 1000), ("--prompt-tokens", args.prompt_tokens, 1 << 16),
                             ("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS), ("--repeats", args.repeats, 1000)):
        check_int(flag, value, 1, top)
    try:
        temperatures = tuple(float(t) for t in _split(args.temperature))
    except ValueError as err:
        raise CLIError(f"--temperature: not a comma list of numbers: {args.temperature!r}") from err
    if not temperatures:
        raise CLIError("--temperature: give at least one temperature")
    for t in temperatures:
        check_float("--temperature", t, 0.0)
    policies = tuple(int(p) if p.isdigit() else p.lower() for p in _split(args.policies))
    if not policies:
        raise CLIError("--policies: give at least one policy")
    for policy in policies:
        try:
            resolve_policy(policy)
        except ValueError as err:
            raise CLIError(f"--policies: {err}") from None
    drafter_names = _split(args.drafters)
    for name in drafter_names:
        if name not in ("model", "lookup"):
            raise CLIError(f"--drafters: unknown drafter {name!r} (use model, lookup)")
    if len(set(drafter_names)) != len(drafter_names) or not drafter_names:
        raise CLIError(f"--drafters: give each of model, lookup at most once, got {args.drafters!r}")
    settings = BenchSettings(policies=policies, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             temperatures=temperatures, seed=args.seed, ignore_eos=not args.keep_eos,
                             warmup_tokens=QUICK["warmup_tokens"] if args.quick else 16)

    target_dir = args.target or DEMO_PAIR / "target"
    draft_dir = args.draft or _default_draft(DEMO_PAIR)
    if args.target is None and not target_dir.is_dir():
        raise CLIError(f"the demo pair is not installed at {DEMO_PAIR}: give --target and --draft")
    apply_model_options(args)
    tokenizer = load_tokenizer(args.tokenizer or target_dir,
                               model_kwargs=None if args.tokenizer else source_options(model_options(args)))
    target = load_model(target_dir, device=args.device, dtype=args.dtype, what="target", **loader_kwargs(args))
    drafters = {}
    if "model" in drafter_names:
        drafters["model"] = load_model(draft_dir, device=args.device, dtype=args.dtype, what="draft",
                                       **loader_kwargs(args, "draft"))
    if "lookup" in drafter_names:
        drafters["lookup"] = PromptLookupDrafter()
    workloads = build_workloads(tokenizer, _split(args.workloads), args.prompts, args.prompt_tokens)
    for w in workloads:
        _log(f"workload {w.name}: {len(w.prompts)} prompts ({w.description})")

    result = run_policy_bench(target, drafters, workloads, settings, eos_token_id=tokenizer.eos_token_id,
                              on_progress=_log)
    command = reproduce_command(args, target_dir, draft_dir)
    data = result.to_dict()
    data["command"] = command
    data["target"], data["draft"] = str(target_dir), str(draft_dir) if "model" in drafters else None
    report = result.to_markdown()
    report_md = (f"Command: `{command}`\n\nTarget `{target_dir}`, draft `{draft_dir}`; {len(workloads)} workloads × "
                 f"{args.prompts} prompts of {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens each, batch 1, "
                 f"{args.repeats} interleaved repeats (median tok/s), {args.threads} CPU thread(s); "
                 f"{result.wall_time_s:.0f} s in all.\n\n{report}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "policies.json", args.out / "policies.md"
    json_path.write_text(dumps(data, indent=1))
    md_path.write_text(report_md)
    print(report_md)
    _log(f"wrote {json_path} and {md_path} ({result.wall_time_s:.0f} s)")
    if args.json:
        summary = {"command": command, "winners": data["winners"], "json": str(json_path), "markdown": str(md_path),
                   "wall_time_s": result.wall_time_s,
                   "rows": [{k: v for k, v in row.items() if k != "stats"} for row in data["rows"]]}
        print_json(summary)
    return 0


def reproduce_command(args: argparse.Namespace, target_dir: Path, draft_dir: Path) -> str:
    parts = ["specdec", "policies"]
    if args.target is not None:
        parts += ["--target", str(target_dir)]
    if args.draft is not None:
        parts += ["--draft", str(draft_dir)]
    if args.tokenizer is not None:
        parts += ["--tokenizer", str(args.tokenizer)]
    parts += ["--workloads", args.workloads, "--policies", args.policies]
    if args.drafters != "model":
        parts += ["--drafters", args.drafters]
    if args.quick:
        parts.append("--quick")
    else:
        parts += ["--prompts", str(args.prompts), "--prompt-tokens", str(args.prompt_tokens),
                  "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats)]
    parts += ["--temperature", args.temperature, "--threads", str(args.threads)]
    if args.temperature != "0":
        parts += ["--seed", str(args.seed)]
    if args.keep_eos:
        parts.append("--keep-eos")
    return " ".join(parts)
