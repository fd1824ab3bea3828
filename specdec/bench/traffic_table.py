"""The traffic table's rows: `ArmResult` (one arm of one cell), how an arm's timed runs become a row (`arm_row`: the
median run, the median of the per-round ratios to plain), the markdown table and the summary of the issue's targets.
Kept apart from `traffic.py`, which drives the engines."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

__all__ = ["ArmResult", "arm_row", "markdown_table", "summary", "never_drafted", "plot_table"]


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
    per_t = [{k: t.pop(k) for k in ("tpot_p50_greedy_s", "tpot_p50_sampled_s", "policy", "stalls", "mixed_steps",
                                       "ahead_steps")}
             for t in timed]
    ratios = [t["tok_s"] / p["tok_s"] if p["tok_s"] else None for t, p in zip(timed, plains)]
    middle = sorted(range(len(timed)), key=lambda j: timed[j]["tok_s"])[(len(timed) - 1) // 2]  # the median run
    mine, plain = per_t[middle], plains[middle]
    extra = {"rate_per_s": rate} if rate is not None else {}
    extra.update(mine)  # the policy's read-out, the stalls, the TPOT p50 of the greedy and of the sampled requests,
    # the steps that fed prompt chunks in their forward (`EngineConfig.mixed_step`; 0 without it), the steps run
    # ahead (`EngineConfig.async_scheduling`; 0 without it)
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


def never_drafted(row: ArmResult) -> bool:
    """A speculative arm that drafted nothing (mean γ 0: its policy stayed on plain decoding), so its ratio to
    plain is plain against plain — run-to-run noise, not a speedup."""
    return row.drafter != "plain" and row.mean_gamma == 0


def markdown_table(rows: list[ArmResult]) -> str:
    """The table; a row that never drafted says so instead of a ratio; the captures column only when some row
    built a step shape while timed (on a CPU nothing is captured)."""
    def ms(v):
        return "–" if v is None or v != v else f"{1e3 * v:.1f}"

    captures = any(r.captures for r in rows)
    lines = ["| slots | arrival | drafter | γ | tok/s | vs plain | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | TPOT p50 (ms) "
             "| α | mean γ |" + (" captures |" if captures else ""), "|---|---|---|---|---|---|---|---|---|---|---|"
             + ("---|" if captures else "")]
    for r in rows:
        ratio = "–" if r.vs_plain is None or r.drafter == "plain" else f"{r.vs_plain:.2f}x"
        spread = [x["vs_plain"] for x in r.extra.get("repeats", ()) if x["vs_plain"] is not None]
        if spread and r.drafter != "plain":  # (the median of the rounds' ratios, and their range)
            ratio += f" ({min(spread):.2f}–{max(spread):.2f})"
        if never_drafted(r):
            ratio = "never drafted (plain)"
        alpha = "–" if r.alpha is None else f"{r.alpha:.2f}"
        lines.append(f"| {r.slots} | {r.arrival} | {r.drafter} | {r.policy} | {r.tok_s:.0f} | {ratio} | "
                     f"{ms(r.ttft_p50_s)} / {ms(r.ttft_p99_s)} | {ms(r.itl_p50_s)} / {ms(r.itl_p99_s)} | "
                     f"{ms(r.tpot_p50_s)} | {alpha} | {r.mean_gamma:.2f} |" + (f" {r.captures} |" if captures else ""))
    return "\n".join(lines)


def summary(rows: list[ArmResult]) -> dict:
    """Per drafter and policy: the worst and the median ratio to plain over the cells that drafted (the issue's
    targets), and how many cells never drafted (their ratio is plain against plain: left out)."""
    out: dict = {}
    idle: dict = {}
    for r in rows:
        if never_drafted(r):
            idle[f"{r.drafter}/{r.policy}"] = idle.get(f"{r.drafter}/{r.policy}", 0) + 1
        elif r.drafter != "plain" and r.vs_plain is not None:
            out.setdefault(f"{r.drafter}/{r.policy}", []).append(r.vs_plain)
    result = {k: {"min_vs_plain": min(v), "median_vs_plain": statistics.median(v), "cells": len(v)}
              for k, v in out.items()}
    for k, n in idle.items():
        result.setdefault(k, {"min_vs_plain": None, "median_vs_plain": None, "cells": 0})["never_drafted"] = n
    return result


def plot_table(rows: list[ArmResult], path) -> bool:
    """A PNG of the table beside its Markdown: tokens/s ratio to plain per cell (slots × arrival), one bar per
    drafter/γ arm, an arm that never drafted marked "no drafts" at 0. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cells = list(dict.fromkeys((r.slots, r.arrival) for r in rows))
    arms = list(dict.fromkeys((r.drafter, r.policy) for r in rows if r.drafter != "plain"))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cells) * max(1, len(arms)) ** 0.5), 4.0))
    width = 0.8 / max(1, len(arms))
    for k, (drafter, policy) in enumerate(arms):
        xs, ys, idle = [], [], []
        for i, cell in enumerate(cells):
            row = next((r for r in rows if (r.slots, r.arrival) == cell and (r.drafter, r.policy) == (drafter, policy)),
                       None)
            if row is None:
                continue
            xs.append(i + (k - (len(arms) - 1) / 2) * width)
            ys.append(0.0 if never_drafted(row) or row.vs_plain is None else row.vs_plain)
            idle.append(never_drafted(row))
        ax.bar(xs, ys, width, label=f"{drafter} γ={policy}")
        for x, hatched in zip(xs, idle):
            if hatched:
                ax.text(x, 0.02, "no drafts", rotation=90, ha="center", va="bottom", fontsize=6)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(cells)), [f"{s} slots\n{a}" for s, a in cells], fontsize=8)
    ax.set_ylabel("tokens/s ÷ plain (same run)")
    ax.set_title("specdec bench: speculative vs plain decoding (same run; 'no drafts': the policy stayed plain)", fontsize=9)
    if arms:
        ax.legend(fontsize=7, ncol=min(4, len(arms)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
