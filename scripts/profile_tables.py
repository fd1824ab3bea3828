"""Markdown tables of scripts/profile_decode.py's JSON rows (what BENCHMARKS.md quotes).

    python scripts/profile_tables.py OUT/profile.jsonl

Tables: decode speed and MBU per shape and variant (prefill excluded and included, measured-copy and datasheet
peaks); the kernel groups of one step per shape and variant (µs, share of the step, GB/s); the GEMM timings per
shape (cuBLAS vs the Triton GEMM); c and kernels per drafted token on the pair; and scripts/profile_engine.py's
rows (the engine's step against the bare graph step per γ, the device events the engine adds, the argmax timings).
Rows with an "error" are listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GROUPS = ("qkv", "o", "gate_up", "down", "lm_head", "gemm (unattributed)", "attention", "norm", "rope_kv_write",
          "activation", "argmax", "embedding", "memcpy", "other")


def pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def num(value, fmt: str = ".1f") -> str:
    return "–" if value is None else format(value, fmt)


def decode_table(rows: list[dict]) -> list[str]:
    out = ["| shape | variant | tok/s | step µs | MBU (copy) | MBU (datasheet) | with prefill: tok/s | MBU (copy) | "
           "MBU (datasheet) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("row") in ("decode", "engine") and "error" not in r:
            variant = r["variant"] + (" (engine)" if r["row"] == "engine" else "")
            out.append(f"| {r['shape']} | {variant} | {num(r['tok_per_s'])} | {num(r.get('step_us'))} | "
                       f"{pct(r.get('mbu_copy'))} | {pct(r.get('mbu_datasheet'))} | {num(r['tok_per_s_with_prefill'])} | "
                       f"{pct(r.get('mbu_copy_with_prefill'))} | {pct(r.get('mbu_datasheet_with_prefill'))} |")
    return out


def profile_tables(rows: list[dict]) -> list[str]:
    """One table per shape: a column per variant, a line per group (µs / share / GB/s), then the totals."""
    out = []
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("row") == "profile":
            by_shape.setdefault(r["shape"], []).append(r)
    for shape, profs in by_shape.items():
        names = [p["variant"] for p in profs]
        out += [f"**{shape}**, one step (µs · share of the step's wall time · GB/s over the group's bytes):", "",
                "| group | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for group in GROUPS:
            cells = []
            for p in profs:
                g = p["groups"].get(group)
                cells.append("" if g is None else
                             f"{g['us']:.0f} · {pct(g.get('share'))} · {num(g.get('GBps'), '.0f')}"
                             + (f" ({g['kernels']})" if group not in GROUPS[:5] else ""))
            if any(cells):
                out.append(f"| {group} | " + " | ".join(cells) + " |")
        for key, label in (("kernels", "kernels per step"), ("kernel_us", "sum of kernel µs"),
                           ("wall_us", "step wall µs"), ("gap_us", "wall − kernels µs"),
                           ("inner_gap_us", "gaps inside the step µs")):
            out.append(f"| {label} | " + " | ".join(num(p.get(key), '.0f') for p in profs) + " |")
        out.append("")
    return out


def gemm_table(rows: list[dict]) -> list[str]:
    out = ["| model | N × K | rows | matrices | cuBLAS µs | GB/s | Triton µs | GB/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("row") == "gemm" and "error" not in r:
            model = r.get("shape") or f"{r.get('pair')} {r.get('role')}"
            out.append(f"| {model} | {r['n']} × {r['k']} | {r['rows']} | {r['weights']} | {r['cublas_us']} | "
                       f"{r['cublas_GBps']:.0f} | {r['triton_us']} | {r['triton_GBps']:.0f} |")
    return out


def draft_table(rows: list[dict]) -> list[str]:
    out = ["| pair | variant | γ | target step µs | kernels | draft step µs | kernels | kernels per draft token | c |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("row") == "draft" and "error" not in r:
            out.append(f"| {r['pair']} | {r['variant']} | {r['gamma']} | {num(r['target_us'])} | "
                       f"{r['target_kernel_count']} | {num(r['draft_us'])} | {r['draft_kernel_count']} | "
                       f"{r['kernels_per_draft_token']} | {r['c']:.3f} |")
    return out


def engine_profile_tables(rows: list[dict]) -> list[str]:
    """scripts/profile_engine.py's rows: per γ, the bare step, the engine (and its torch-tail A/B) and their
    difference, µs per step; then what the engine adds, event by event."""
    out = []
    profiled = [r for r in rows if r.get("row") == "engine_profile" and "error" not in r]
    for gamma in sorted({r["gamma"] for r in profiled}):
        mine = [r for r in profiled if r["gamma"] == gamma]
        out += [f"**γ = {gamma}** (µs per step; GPU timeline from torch.profiler's CUDA activity):", "",
                "| case | wall | busy | idle | idle between launches | kernel time | kernels | graph launches | "
                "outside graphs µs (events) | syncs (host µs) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            t = r.get("timeline") if r["case"] != "diff" else r
            if not t:
                out.append(f"| {r['case']} | {num(r['wall_us'])} | – | – | – | – | – | – | – | – |")
                continue
            syncs = t.get("syncs")
            sync = "–" if syncs is None else f"{sum(x['us'] for x in syncs):.0f} ({sum(x['count'] for x in syncs):g})"
            out.append(f"| {r['case']} | {num(r['wall_us'])} | {num(t.get('busy_us'))} | {num(t.get('idle_us'))} | "
                       f"{num(t.get('idle_between_launches_us'))} | {num(t.get('kernel_us'))} | "
                       f"{num(t.get('kernels'), '.1f')} | {num(t.get('graph_launches'), '.2f')} | "
                       f"{num(t.get('outside_graph_us'))} ({num(t.get('outside_graph_events'), '.2f')}) | {sync} |")
        for r in mine:
            if r["case"] == "diff" and r.get("added_device_events"):
                out += ["", "Device events the engine adds per step (count, µs):", ""]
                out += [f"- {e['count']:g} × `{e['name'][:90]}`: {e['us']:.1f} µs" for e in r["added_device_events"]]
            for key in ("request", "request_gc_frozen"):
                if key in r:
                    q = r[key]
                    out += ["", f"{r['case']} {key}: {q['tok_per_s']} tok/s, {q['us_per_step']} µs per step over "
                                f"{q['steps']} steps; garbage collections (gen 0/1/2) {q['gc_collections']}, "
                                f"{q['gc_ms']} ms"]
            if r["case"] == "engine" and r.get("phases_us"):
                phases = ", ".join(f"{k} {v:.0f}" for k, v in r["phases_us"].items())
                out += ["", f"Engine phases (µs, median of {r['phase_steps']} steps; model bodies between syncs): "
                            f"{phases}"]
        out.append("")
    timings = [r for r in rows if r.get("row") == "argmax" and "error" not in r]
    if timings:
        out += ["| logits | torch.argmax + invalid_scores µs | torch.argmax µs | greedy_tokens µs |", "|---|---|---|---|"]
        out += [f"| [1, {r['positions']}, {r['vocab']}] | {r['torch_argmax_and_invalid_scores_us']} | "
                f"{r['torch_argmax_us']} | {r['greedy_tokens_us']} |" for r in timings]
    return out


def render(rows: list[dict]) -> str:
    peaks = [r for r in rows if r.get("row") == "peak"]
    lines = [f"Device: {peaks[0]['device']}; copy {peaks[0]['copy_TBps']} TB/s measured, datasheet "
             f"{peaks[0]['datasheet_TBps']} TB/s" if peaks else "Device: (no peak row)", ""]
    lines += decode_table(rows) + [""]
    for r in rows:
        if r.get("row") == "engine" and "engine_step_us" in r:
            phases = ", ".join(f"{k} {v:.0f}" for k, v in r["engine_step_us"].items())
            lines += [f"Engine {r['shape']}: µs per decode step (median of {r['engine_steps_timed']}): {phases}; outside "
                      f"the model body {r.get('engine_outside_model_us', '–')} µs", ""]
    lines += profile_tables(rows) + gemm_table(rows) + [""] + draft_table(rows) + [""] + engine_profile_tables(rows)
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "Errors:"] + [f"- {r.get('row')} {r.get('shape') or r.get('pair')} {r.get('variant', '')}: "
                                   f"{r['error']}" for r in errors]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", type=Path, help="profile_decode.py's --out file (JSON lines)")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.rows.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
