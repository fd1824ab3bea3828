"""The traffic table's rows: `ArmResult` (one arm of one cell), how an arm's timed runs become a row (`arm_row`: the
median run, the median of the per-round ratios to plain), the markdown table and the summary of the issue's targets.
Kept apart from `traffic.py`, which drives the engines."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

__all__ = ["ArmResult", "arm_row", "markdown_table", "summary"]


@dataclass
class ArmResult:
    slots: int
    arrival: str
    drafter: str  # "plain" or the drafter's name
    policy: str  # "0" (plain), "auto" or a fixed γ
    requests: int
    tokens: int
    seconds: float
    tok_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    tpot_p50_s: float
    alpha: float | None
    mean_gamma: float
    captures: int  # step shapes built (CUDA: graphs captured) during the timed run
    vs_plain: float | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def arm_row(slots: int, arrival, rate: float | None, drafter: str, policy, timed: list[dict],
            plains: list[dict]) -> ArmResult:
    """An arm's row from its timed `drive` runs (one per round) and plain's runs of the same rounds, in the same
    order (see `traffic`'s module doc): the median run's numbers, the median of the per-round ratios to plain."""
    timed = [{k: v for k, v in t.items() if k != "completed_per_s"} for t in timed]  # (= requests / seconds)
    per_t = [{k: t.pop(k) for k in ("tpot_p50_greedy_s", "tpot_p50_sampled_s", "policy", "stalls")} for t in timed]
    ratios = [t["tok_s"] / p["tok_s"] if p["tok_s"] else None for t, p in zip(timed, plains)]
    middle = sorted(range(len(timed)), key=lambda j: timed[j]["tok_s"])[(len(timed) - 1) // 2]  # the median run
    mine, plain = per_t[middle], plains[middle]
    extra = {"rate_per_s": rate} if rate is not None else {}
    extra.update(mine)  # the policy's read-out, the stalls, the TPOT p50 of the greedy and of the sampled requests
    extra.update({f"speedup_{kind}": _ratio(plain[f"tpot_p50_{kind}_s"], mine[f"tpot_p50_{kind}_s"])
                  for kind in ("greedy", "sampled")})  # plain's TPOT p50 over this arm's, greedy and sampled requests
    if len(timed) > 1:
        extra["repeats"] = [{"tok_s": t["tok_s"], "vs_plain": r, "itl_p99_s": t["itl_p99_s"]}
                            for t, r in zip(timed, ratios)]
    known = [r for r in ratios if r is not None]
    return ArmResult(slots=slots, arrival=arrival.label, drafter=drafter, policy=str(policy),
                     vs_plain=statistics.median(known) if known else None, extra=extra, **timed[middle])


def _ratio(a, b) -> float | None:
    """a / b, or None when either is missing (no request of that kind) or b is 0."""
    return a / b if a is not None and b and a == a and b == b else None


def markdown_table(rows: list[ArmResult]) -> str:
    def ms(v):
        return "–" if v is None or v != v else f"{1e3 * v:.1f}"

    lines = ["| slots | arrival | drafter | γ | tok/s | vs plain | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | TPOT p50 (ms) "
             "| α | mean γ | captures |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "–" if r.vs_plain is None or r.drafter == "plain" else f"{r.vs_plain:.2f}x"
        spread = [x["vs_plain"] for x in r.extra.get("repeats", ()) if x["vs_plain"] is not None]
        if spread and r.drafter != "plain":  # (the median of the rounds' ratios, and their range)
            ratio += f" ({min(spread):.2f}–{max(spread):.2f})"
        alpha = "–" if r.alpha is None else f"{r.alpha:.2f}"
        lines.append(f"| {r.slots} | {r.arrival} | {r.drafter} | {r.policy} | {r.tok_s:.0f} | {ratio} | "
                     f"{ms(r.ttft_p50_s)} / {ms(r.ttft_p99_s)} | {ms(r.itl_p50_s)} / {ms(r.itl_p99_s)} | "
                     f"{ms(r.tpot_p50_s)} | {alpha} | {r.mean_gamma:.2f} | {r.captures} |")
    return "\n".join(lines)


def summary(rows: list[ArmResult]) -> dict:
    """Per drafter and policy: the worst and the median ratio to plain over the cells (the issue's targets)."""
    out: dict = {}
    for r in rows:
        if r.drafter != "plain" and r.vs_plain is not None:
            out.setdefault(f"{r.drafter}/{r.policy}", []).append(r.vs_plain)
    return {k: {"min_vs_plain": min(v), "median_vs_plain": statistics.median(v), "cells": len(v)} for k, v in out.items()}
