"""Benchmark output: a Markdown table, a JSON file, and PNG plots (matplotlib, Agg, imported lazily); `compare_runs`:
the pooled plain-vs-speculative numbers the demos print."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.strict_json import dumps

COLUMNS = [
    ("method", "method", None),
    ("drafter", "drafter", None),
    ("temperature", "T", "g"),
    ("batch", "B", "d"),
    ("gamma", "γ", "d"),
    ("tokens_per_s", "tok/s", ".1f"),
    ("alpha", "α", ".3f"),
    ("tau", "τ", ".2f"),
    ("c", "c", ".3f"),
    ("predicted_speedup", "pred. (Thm 3.8)", ".2f"),
    ("measured_speedup", "measured", ".2f"),
    ("measured_over_predicted", "meas./pred.", ".2f"),
    ("mbu", "MBU", ".1%"),
    ("weights_mib", "weights MiB", ".0f"),
    ("peak_extra_mib", "peak extra MiB", ".0f"),
    ("note", "note", None),
]


def _cell(value, spec) -> str:
    if value is None or value == "":
        return "—"
    if spec is None:
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def _note(row: dict) -> str:
    parts = [row.get("note") or ""]
    if row.get("sweep"):
        parts.append("γ sweep")
    if row.get("auto_off"):
        kept = row.get("auto_off_kept_gamma")
        parts.append(f"auto_off → γ={kept}" if kept is not None else "auto_off")
    if row.get("synthetic_alpha") is not None:
        parts.append("SYNTHETIC acceptance (benchmark only)")
    return "; ".join(p for p in parts if p)


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, rule]
    for row in rows:
        row = dict(row, note=_note(row))
        lines.append("| " + " | ".join(_cell(row.get(key), spec) for key, _, spec in COLUMNS) + " |")
    return "\n".join(lines)


def markdown_report(result: dict) -> str:
    info = result.get("device_info", {})
    lines = [f"## specdec bench --preset {result['preset']}", ""]
    lines.append(f"device: {info.get('name', info.get('device'))}; " + ", ".join(
        f"{k}={v}" for k, v in info.items() if k not in ("name", "device")))
    lines.append(f"models: {result.get('models')}")
    lines.append(f"workload: {result.get('workload')}")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    lines += ["", markdown_table(result["rows"]), ""]
    if result.get("profile"):
        lines += ["profile:", "```", json.dumps(result["profile"], indent=1), "```"]
    return "\n".join(lines)


def append_json_line(row: dict, path: Path | None) -> str:
    """`row` as one JSON line, appended to `path` (its folder made; None: nowhere) → the line (the scripts print
    it: a run cut short keeps every row written so far)."""
    line = json.dumps(row)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return line


def write_json(result: dict, path: Path) -> None:
    """Strict JSON (NaN/Infinity written as null)."""
    path.write_text(dumps(result, indent=1))


def write_plots(rows: list[dict], out_dir: Path, prefix: str) -> list[str]:
    """speedup vs γ (measured and Thm 3.8) and predicted vs measured; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    written = []
    sweep = [r for r in rows if r.get("sweep") and r.get("measured_speedup")]
    if sweep:
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot(1, 1, 1)
        for temperature in sorted({r["temperature"] for r in sweep}):
            pts = sorted((r["gamma"], r["measured_speedup"], r.get("predicted_speedup")) for r in sweep
                         if r["temperature"] == temperature)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"measured, T={temperature:g}")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], "x--", label=f"Thm 3.8, T={temperature:g}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("γ (draft tokens per step)")
        ax.set_ylabel("speedup over our plain decoding")
        ax.set_title("model drafter, batch 1")
        ax.legend(fontsize=8)
        path = out_dir / f"{prefix}_speedup_vs_gamma.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(str(path))
    pairs = [r for r in rows if r.get("predicted_speedup") and r.get("measured_speedup") and r.get("gamma")]
    if pairs:
        fig = Figure(figsize=(5, 5))
        ax = fig.add_subplot(1, 1, 1)
        for method, marker in (("ours-engine", "o"), ("ours-loop", "s")):
            sel = [r for r in pairs if r["method"] == method]
            if sel:
                ax.scatter([r["predicted_speedup"] for r in sel], [r["measured_speedup"] for r in sel],
                           marker=marker, label=method)
        top = max(max(r["predicted_speedup"], r["measured_speedup"]) for r in pairs) * 1.1
        ax.plot([0, top], [0, top], color="grey", lw=0.8, label="measured = predicted")
        ax.plot([0, top], [0, 0.9 * top], color="grey", lw=0.8, ls="--", label="90% of predicted")
        ax.set_xlabel("predicted speedup (Thm 3.8, measured α, c, γ)")
        ax.set_ylabel("measured speedup")
        ax.legend(fontsize=8)
        path = out_dir / f"{prefix}_predicted_vs_measured.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(str(path))
    return written


def compare_runs(pairs) -> dict:
    """Pooled numbers over `(plain, speculative)` `GenerateResult` pairs of the same work: whether the tokens
    are identical, α and τ of the speculative runs, tokens/s of both, the speedup and the cost ratio c."""
    from specdec.metrics import SpecStats

    plain = SpecStats.pooled(base.stats for base, _ in pairs)
    spec = SpecStats.pooled(fast.stats for _, fast in pairs)
    plain_time, spec_time = plain.wall_time_s, spec.wall_time_s
    plain_tokens, spec_tokens = plain.num_generated_tokens, spec.num_generated_tokens
    return {
        "identical": all(base.sequences == fast.sequences for base, fast in pairs),
        "alpha": spec.alpha,
        "mean_accepted_length": spec.mean_accepted_length if spec.row_steps else None,
        "plain_tokens_per_second": plain_tokens / plain_time,
        "speculative_tokens_per_second": spec_tokens / spec_time,
        "speedup": (spec_tokens / spec_time) / (plain_tokens / plain_time),
        "cost_ratio": spec.cost_ratio,
        # what one verify pass of γ+1 tokens costs next to one plain decoding step (1 on a GPU, more on small CPUs)
        "verify_step_vs_plain_step": (spec.verify_time_s / spec.num_steps) / (plain_time / plain.num_steps)
        if spec.num_steps and plain.num_steps and plain_time else None,
        "plain_wall_time_s": plain_time,
        "speculative_wall_time_s": spec_time,
        "generated_tokens": spec_tokens,
    }
