"""`specdec analyze`: the paper's §3 analysis for a model pair — predicted speedup and the best γ.

Two modes:
  specdec analyze --alpha 0.8 --cost-ratio 0.05            from known α and c (pure arithmetic)
  specdec analyze --target DIR --draft DIR --prompts FILE  measure α, c and ĉ on real checkpoints
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from specdec import analysis
from specdec.cli import CLIError

logger = logging.getLogger(__name__)


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
        help="ĉ = draft / target arithmetic per token (default 0 with --alpha; measured with --target)",
    )
    measured = parser.add_argument_group("measured on local checkpoints")
    measured.add_argument("--target", type=Path, help="target model directory (from_pretrained)")
    measured.add_argument("--draft", type=Path, help="draft model directory (same tokenizer as the target)")
    measured.add_argument("--prompts", type=Path, help="text file, one prompt per line")
    measured.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    measured.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    measured.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    measured.add_argument("--max-new-tokens", type=int, default=64, help="target tokens generated per prompt")
    measured.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    measured.add_argument("--context-length", type=int, default=128, help="KV-cache length when timing c")
    measured.add_argument("--seed", type=int, default=0, help="seed for sampled generation")
    parser.add_argument("--max-gamma", type=int, default=64, help="largest γ considered (default 64)")
    parser.add_argument("--plot", type=Path, help="write a PNG of predicted speedup vs γ")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.max_gamma < 1:
        raise CLIError(f"--max-gamma must be >= 1, got {args.max_gamma}")
    if args.target is not None or args.draft is not None or args.prompts is not None:
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
        print(json.dumps(report))
    else:
        print(format_report(report))
    return 0


def build_report(alpha: float, cost_ratio: float, op_cost_ratio: float, max_gamma: int) -> dict[str, Any]:
    """Everything the command prints, as plain data: one row per γ in 0..max_gamma plus the advice."""
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
            f"measured: alpha = {report['alpha']:.3f} over {report['num_positions']} positions "
            f"(temperature {report['temperature']:g}), c = {report['cost_ratio']:.4f}"
            f"{' (given)' if report.get('cost_ratio_given') else ''}, c_hat = {report['op_cost_ratio']:.4f}"
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
    raise CLIError("--plot is not implemented yet")


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    raise CLIError("--target mode is not implemented yet")
