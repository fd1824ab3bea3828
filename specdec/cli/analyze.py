"""`specdec analyze`: the paper's §3 analysis for a model pair — predicted speedup and the best γ.

Two modes:
  specdec analyze --alpha 0.8 --cost-ratio 0.05            from known α and c (pure arithmetic)
  specdec analyze --target DIR --draft DIR --prompts FILE  measure α, c and ĉ on real checkpoints
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from specdec.cli import CLIError
from specdec.cli.common import (add_checkpoint_options, add_model_options, apply_model_options, check_float, check_int,
                                loader_kwargs, model_options, print_json)

logger = logging.getLogger(__name__)

MAX_GAMMA = 1024  # the table has one row per γ: bounded so that a typo cannot make it run for minutes
MAX_CONTEXT = 1 << 16


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "analyze",
        help="predict the speedup of a draft/target pair and recommend γ (paper §3)",
        description=(
            "Predict the walltime speedup of speculative decoding (Thm 3.8) and the operations increase "
            "(Thm 3.11) for each number of draft tokens γ, and recommend the γ with the best speedup. "
            "Either give α and c directly, or give two local checkpoints and a prompt file to measure them."
        ),
    )
    known = parser.add_argument_group("from known numbers")
    known.add_argument("--alpha", type=float, help="acceptance rate α in [0, 1]")
    known.add_argument(
        "--cost-ratio", type=float,
        help="c = draft step time / target step time (required with --alpha; with --target it skips timing)",
    )
    known.add_argument(
        "--op-cost-ratio", type=float,
        help="ĉ = draft / target arithmetic per token (default: 0 with --alpha; measured with --target)",
    )
    measured = parser.add_argument_group("measured on local checkpoints")
    measured.add_argument("--target", help="target checkpoint: a folder, a .gguf file or a cached hub id")
    measured.add_argument("--draft", help="draft checkpoint (same tokenizer as the target)")
    measured.add_argument("--prompts", type=Path, help="text file, one prompt per line")
    measured.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    measured.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    measured.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    measured.add_argument("--max-new-tokens", type=int, default=64, help="target tokens generated per prompt (default: 64)")
    measured.add_argument("--context-length", type=int, default=128, help="KV-cache length when timing c (default: 128)")
    add_model_options(measured, seed=0, seed_help="seed for sampled generation")
    add_checkpoint_options(measured)
    parser.add_argument("--max-gamma", type=int, default=64, help=f"largest γ considered, 1..{MAX_GAMMA} (default: 64)")
    parser.add_argument("--plot", type=Path, help="write a PNG of predicted speedup vs γ")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    check_int("--max-gamma", args.max_gamma, 1, MAX_GAMMA)
    check_float("--alpha", args.alpha, 0.0, 1.0)
    check_float("--cost-ratio", args.cost_ratio, 0.0)
    check_float("--op-cost-ratio", args.op_cost_ratio, 0.0)
    if args.target is not None or args.draft is not None or args.prompts is not None:
        if args.alpha is not None:
            raise CLIError("--alpha cannot be combined with --target/--draft/--prompts (those measure alpha)")
        measured = _measure(args)
        alpha, cost_ratio, op_ratio = measured["alpha"], measured["cost_ratio"], measured["op_cost_ratio"]
    elif args.alpha is not None:
        if args.cost_ratio is None:
            raise CLIError("--cost-ratio is required with --alpha (c = draft step time / target step time)")
        alpha, cost_ratio = args.alpha, args.cost_ratio
        op_ratio = 0.0 if args.op_cost_ratio is None else args.op_cost_ratio
        measured = {}
    else:
        raise CLIError("give --alpha and --cost-ratio, or --target, --draft and --prompts")

    report = build_report(alpha, cost_ratio, op_ratio, args.max_gamma)
    report.update(measured)
    if args.plot is not None:
        report["plot"] = str(_plot(report, args.plot))
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0


def build_report(alpha: float, cost_ratio: float, op_cost_ratio: float, max_gamma: int) -> dict[str, Any]:
    """Everything the command prints, as plain data: one row per γ in 0..max_gamma plus the advice."""
    from specdec import analysis

    rows = [
        {
            "gamma": gamma,
            "expected_tokens": analysis.expected_tokens(alpha, gamma),
            "speedup": analysis.walltime_improvement(alpha, gamma, cost_ratio),
            "operations_increase": analysis.operations_increase(alpha, gamma, op_cost_ratio),
        }
        for gamma in range(max_gamma + 1)
    ]
    best = analysis.optimal_gamma(alpha, cost_ratio, max_gamma)
    pays = analysis.speculation_pays(alpha, cost_ratio)
    # When α ≤ c no γ beats plain decoding (Cor 3.9), so the honest advice is γ = 0.
    recommended = best if pays else 0
    return {
        "alpha": alpha,
        "cost_ratio": cost_ratio,
        "op_cost_ratio": op_cost_ratio,
        "max_gamma": max_gamma,
        "speculation_pays": pays,
        "best_gamma": best,
        "recommended_gamma": recommended,
        "predicted_speedup": rows[recommended]["speedup"],
        "expected_tokens": rows[recommended]["expected_tokens"],
        "operations_increase": rows[recommended]["operations_increase"],
        "speedup_ceiling": 1.0 / (1.0 - alpha) if alpha < 1 else None,  # c → 0, γ → ∞
        "table": rows,
    }


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table. Shows γ up to a few past the best one, not all max_gamma rows."""
    best = report["best_gamma"]
    last = min(report["max_gamma"], max(10, best + 4))
    lines = []
    if "num_positions" in report:
        lines.append(
            f"target {report['target']}, draft {report['draft']} on {report['device']}: alpha measured over "
            f"{report['num_positions']} generated positions from {report['num_prompts']} prompts "
            f"(temperature {report['temperature']:g}); c {'given' if report['cost_ratio_given'] else 'timed'}; "
            f"c_hat {'given' if report['op_cost_ratio_given'] else 'from parameter counts'}"
        )
    lines.append(
        f"alpha = {report['alpha']:.3f}   c = {report['cost_ratio']:.4f}   c_hat = {report['op_cost_ratio']:.4f}"
    )
    lines.append(f"{'gamma':>5}  {'E[tokens/step]':>14}  {'speedup':>8}  {'operations':>10}")
    for row in report["table"][: last + 1]:
        mark = "  <- best" if row["gamma"] == best else ""
        lines.append(
            f"{row['gamma']:>5}  {row['expected_tokens']:>14.2f}  {row['speedup']:>7.2f}X  "
            f"{row['operations_increase']:>9.2f}X{mark}"
        )
    if report["speculation_pays"]:
        lines.append(
            f"recommended gamma = {report['recommended_gamma']}: predicted speedup {report['predicted_speedup']:.2f}X "
            f"({report['expected_tokens']:.2f} tokens per target call, operations {report['operations_increase']:.2f}X)"
        )
    else:
        lines.append(
            f"speculation does not pay: alpha ({report['alpha']:.3f}) <= c ({report['cost_ratio']:.4f}), "
            "so no gamma beats plain decoding (Cor 3.9); recommended gamma = 0"
        )
    if "plot" in report:
        lines.append(f"plot written to {report['plot']}")
    return "\n".join(lines)


def _plot(report: dict[str, Any], path: Path) -> Path:
    """PNG of the predicted speedup (Thm 3.8) against γ, with the recommended γ marked."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend state to set or leak
    except ImportError as err:
        raise CLIError("--plot needs matplotlib (pip install 'specdec[plot]')") from err
    if not path.parent.is_dir():
        raise CLIError(f"--plot: directory {path.parent} does not exist")
    last = min(report["max_gamma"], max(16, 2 * report["best_gamma"]))
    rows = report["table"][: last + 1]
    gammas = [row["gamma"] for row in rows]
    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.add_subplot()
    ax.plot(gammas, [row["speedup"] for row in rows], marker="o", markersize=3, label="predicted speedup")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--", label="plain decoding")
    best = report["best_gamma"]
    ax.plot([best], [report["table"][best]["speedup"]], marker="*", markersize=14, color="C3", linestyle="none",
            label=f"best gamma = {best} ({report['table'][best]['speedup']:.2f}X)")
    ax.set_xlabel("gamma (draft tokens per step)")
    ax.set_ylabel("predicted walltime speedup (Thm 3.8)")
    ax.set_title(f"alpha = {report['alpha']:.3f}, c = {report['cost_ratio']:.4f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise CLIError(f"--prompts: no such file: {path}")
    prompts = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise CLIError(f"--prompts: {path} has no non-empty lines")
    return prompts


def _load(kind: str, path: str, args: argparse.Namespace) -> Any:
    from specdec.loading import load_model

    model = load_model(path, device=args.device, dtype=args.dtype, what=f"--{kind}", **loader_kwargs(args, kind))
    if getattr(model.config, "is_encoder_decoder", False):
        raise CLIError(f"--{kind}: {path} is an encoder-decoder model; analyze measures decoder-only pairs")
    return model


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Generate target text from the prompts, then measure α on it, c by timing, and ĉ by counting."""
    from specdec import analysis

    missing = [flag for flag, value in (("--target", args.target), ("--draft", args.draft), ("--prompts", args.prompts))
               if value is None]
    if missing:
        raise CLIError(f"measuring needs --target, --draft and --prompts (missing {', '.join(missing)})")
    from specdec.request import MAX_NEW_TOKENS

    check_int("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS)
    check_int("--context-length", args.context_length, 1, MAX_CONTEXT)
    from specdec.core import SamplingConfig

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)  # validates
    prompts = _read_prompts(args.prompts)
    from specdec.loading import resolve_model_source

    for which, path in (("target", args.target), ("draft", args.draft)):
        try:
            resolve_model_source(path, what=f"--{which}", model_kwargs=model_options(args, which))
        except FileNotFoundError:
            raise CLIError(f"--{which}: no such directory, .gguf file or cached hub id: {path} (give a local "
                           "checkpoint)") from None

    apply_model_options(args)
    import torch

    from specdec.loading import load_tokenizer, source_options
    from specdec.request import check_context, vocab_size

    tokenizer = load_tokenizer(args.target, what="--target tokenizer",
                               model_kwargs=source_options(model_options(args)))
    target = _load("target", args.target, args)
    draft = _load("draft", args.draft, args)
    device = str(target.device)
    if vocab_size(target) != vocab_size(draft):
        raise CLIError("--target and --draft have different vocabularies; they must share one tokenizer")
    for model in (target, draft):
        check_context(model, [[0]], args.context_length)

    # 1. target text: α is defined on what the target itself would generate (Cor 3.6)
    torch.manual_seed(args.seed)  # the CLI owns the process; HF generate samples from the global RNG
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    gen_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "pad_token_id": pad_id if pad_id is not None else 0}
    if sampling.greedy:
        gen_kwargs["do_sample"] = False
    else:
        gen_kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    sequences, prompt_lengths = [], []
    with torch.inference_mode():
        for line, prompt in enumerate(prompts, 1):
            encoded = tokenizer(prompt, return_tensors="pt")
            if encoded.input_ids.shape[1] == 0:
                raise CLIError(f"--prompts: line {line} encodes to no tokens")
            try:
                check_context(target, [encoded.input_ids[0].tolist()], args.max_new_tokens)
            except ValueError as err:
                raise CLIError(f"--prompts line {line}: {err}") from None
            output = target.generate(
                input_ids=encoded.input_ids.to(device), attention_mask=encoded.attention_mask.to(device), **gen_kwargs
            )
            sequences.append(output[0].tolist())
            prompt_lengths.append(encoded.input_ids.shape[1])
    generated = sum(len(s) - n for s, n in zip(sequences, prompt_lengths))
    logger.info("generated %d target tokens from %d prompts", generated, len(prompts))
    if generated == 0:
        raise CLIError("the target generated no tokens (EOS right away?): nothing to measure alpha on")

    # 2. α teacher-forced on that text, with p and q standardized identically
    measurement = analysis.measure_alpha(
        target, draft, sequences, prompt_lengths=prompt_lengths,
        temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
    )
    # 3. c by timing (unless given) and ĉ by counting parameters (unless given)
    if args.cost_ratio is not None:
        cost_ratio = args.cost_ratio
    else:
        cost_ratio = analysis.measure_cost_ratio(target, draft, context_length=args.context_length)
    op_ratio = args.op_cost_ratio if args.op_cost_ratio is not None else analysis.op_cost_ratio(target, draft)
    return {
        "alpha": measurement.alpha,
        "num_positions": measurement.num_positions,
        "num_prompts": len(prompts),
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "cost_ratio": cost_ratio,
        "cost_ratio_given": args.cost_ratio is not None,
        "op_cost_ratio": op_ratio,
        "op_cost_ratio_given": args.op_cost_ratio is not None,
        "target": str(args.target),
        "draft": str(args.draft),
        "device": device,
    }
