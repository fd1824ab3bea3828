"""Print engine_bench's batch-1 rows (engine.json) as the BENCHMARKS.md table: one line per drafter and γ.

    python scripts/engine_table.py OUT/engine.json
"""

from __future__ import annotations

import json
import sys


def _f(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def table(rows: dict, title: str) -> str:
    lines = [f"{title}", "", "| drafter | γ | tok/s | speedup | α | τ | c | verify(γ+1)/verify(1) | Thm 3.8 | cost-aware "
             "| measured / cost-aware |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        drafter, _, gamma = name.rpartition("_")
        drafter, gamma = (name, "–") if name == "plain" else (drafter, gamma.removeprefix("gamma"))
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else "1"
        lines.append(f"| {drafter} | {gamma} | {row['tok_s']:.0f} | {speedup} | {_f(row.get('alpha'), '.2f')} | "
                     f"{_f(row.get('tau'), '.2f') if name != 'plain' else ''} | {_f(row.get('c'), '.3f')} | "
                     f"{_f(row.get('verify_ratio'), '.2f')} | {_f(row.get('predicted_thm38'), '.2f')} | "
                     f"{_f(row.get('predicted_cost_aware'), '.2f')} | {_f(row.get('measured_vs_cost_aware'), '.2f')} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        results = json.load(f)
    for key, title in (("batch1_T0", "Batch 1, T=0"), ("batch1_T1", "Batch 1, T=1")):
        if key in results:
            print(table(results[key], title), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
