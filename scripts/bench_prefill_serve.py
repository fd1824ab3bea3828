"""Chunked prefill through `specdec serve` (issue 21 items 3 and 5): the serving table of `specdec bench --serve`
(the zoo pair with its feature head, --num-draft-tokens auto; closed loops of C streaming clients; plain and
speculative requests on the same server, level after level) once per --prefill-budget, so the ITL p99 of each
arm with and without chunked prefill sits side by side. A budget may carry the server's GIL switch interval after
a colon ("1024:0.0005" = --prefill-budget 1024 --switch-interval 0.0005: the hand-offs between the driver thread
— an eager prefill chunk is hundreds of launches from Python — and the event loop streaming every client's tokens),
--prefill-steps after a slash ("256/4" = --prefill-budget 256 --prefill-steps 4), and "auto"'s --prefill-stall after
an @ ("auto@0.25/8" = --prefill-budget auto --prefill-stall 0.25 --prefill-steps 8), and the mixed prefill/decode
step after a + ("auto+mixed" = --prefill-budget auto --mixed-step: the chunks ride in the decode step's forward).

    python3 scripts/bench_prefill_serve.py --quick --budgets 0 32 --clients 1 2 --out /tmp/quick   # CPU smoke
    python3 scripts/bench_prefill_serve.py --pair /tmp/pair --head /tmp/pair/head --data data/code \\
        --budgets 0 1024 1024:0.0005 256 --clients 8 32 64 128 --out "$OUT/prefill" --max-seconds 300

→ OUT/prefill_serve.json (every level of every budget, with the server's step and admission metrics) and
OUT/prefill_serve.md (one row per budget × clients × mode). A budget's run starts only while --max-seconds leaves
room for it (the budgets' order is the order given)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

COLUMNS = ("concurrency", "mode", "throughput_tok_s", "vs_plain", "ttft_p50_s", "itl_p50_s", "itl_p99_s",
           "itl_p99_vs_plain", "step_p99_s", "admit_steps", "admit_step_max_s", "decode_step_p99_s",
           "prefill_budget_tokens")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path, default=None, help="the zoo pair (required unless --quick)")
    p.add_argument("--head", type=Path, default=None, help="the feature head (default: the pair's draft0)")
    p.add_argument("--data", type=Path, default=None, help="the prepared corpus (its tokenizer cuts the prompts)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: the shipped demo pair, short requests")
    p.add_argument("--budgets", nargs="+", default=["0", "1024"],
                   help="--prefill-budget values (0: off, auto, tokens), each optionally "
                        "BUDGET[+mixed][@STALL][/STEPS][:SWITCH_INTERVAL_SECONDS]")
    p.add_argument("--clients", nargs="+", type=int, default=[8, 32, 64, 128])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-seconds", type=float, default=300.0, help="no budget's run starts after this")
    args = p.parse_args(argv)
    if not args.quick and (args.pair is None or args.data is None):
        p.error("--pair and --data are required (or --quick)")
    variants = []
    for text in args.budgets:
        b, _, switch = text.partition(":")
        b, _, steps = b.partition("/")
        b, _, stall = b.partition("@")
        b, _, mode = b.partition("+")
        if mode not in ("", "mixed"):
            p.error(f"--budgets: {text!r}: +{mode} is not +mixed (the mixed step) after a budget")
        if not (b == "auto" or b.isdigit() and (int(b) == 0 or int(b) >= 16)):
            p.error(f"--budgets: {text!r}: {b!r} is not 0, auto or an integer >= 16")
        if steps and not (steps.isdigit() and b != "0" and 1 <= int(steps) <= 1024):
            p.error(f"--budgets: {text!r}: /{steps} is not a number of steps in [1, 1024] after a budget")
        try:
            fraction = float(stall) if stall else None
        except ValueError:
            fraction = -1.0
        if stall and not (b == "auto" and 0.01 <= fraction <= 100):
            p.error(f"--budgets: {text!r}: @{stall} is not a stall fraction in [0.01, 100] after auto")
        try:
            interval = float(switch) if switch else None
        except ValueError:
            p.error(f"--budgets: {text!r}: the switch interval {switch!r} is not a number of seconds")
        if interval is not None and not 0 < interval <= 1:
            p.error(f"--budgets: {text!r}: the switch interval must be in (0, 1] seconds")
        extra = ("--prefill-budget", b) + (("--prefill-steps", steps) if steps else ()) + \
            (("--prefill-stall", stall) if stall else ()) + \
            (("--switch-interval", switch) if switch else ()) + (("--mixed-step",) if mode else ())
        variants.append((text, extra))

    from specdec.bench.traffic import TrafficSpec
    from specdec.bench.traffic_serve import serve_traffic
    from specdec.bench.traffic_setup import GPU_SPEC, QUICK_SPEC, code_pool, demo_pool
    from specdec.strict_json import dumps

    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        from specdec.bench.demo_pair import DEMO_PAIR

        target, draft, pool, base, device, dtype = DEMO_PAIR / "target", DEMO_PAIR / "draft", demo_pool(), \
            QUICK_SPEC, "cpu", "float32"
    else:
        config = json.loads((args.pair / "target" / "config.json").read_text())
        pool = code_pool(args.data, min(int(config.get("max_position_embeddings") or 4096), 4096))
        target, draft, base, device, dtype = args.pair / "target", args.head or args.pair / "draft0", GPU_SPEC, \
            "cuda", "bfloat16"
    spec = TrafficSpec(slots=(max(args.clients),), arrivals=(TrafficSpec().arrivals[0],),  # closed loops only
                       prompt_tokens=base["prompt_tokens"], new_tokens=base["new_tokens"])
    begun, runs = time.perf_counter(), []
    for budget, extra in variants:
        spent = time.perf_counter() - begun
        if runs and spent + spent / len(runs) > args.max_seconds:
            print(f"budget {budget}: skipped (--max-seconds {args.max_seconds:.0f})", flush=True)
            break
        start = time.perf_counter()
        result = serve_traffic(target, draft, pool, spec, tuple(args.clients),
                               requests_per_client=args.requests_per_client, device=device, dtype=dtype,
                               log=lambda m: print(m, flush=True), server_args=extra)
        runs.append({"prefill_budget": budget, "seconds": round(time.perf_counter() - start, 1),
                     "levels": result["levels"], "server_log": result["server_log"][-20:]})
        (args.out / "prefill_serve.json").write_text(dumps({"target": str(target), "drafter": str(draft),
                                                            "runs": runs}, indent=1))
    rows = ["| budget | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for run in runs:
        for level in run["levels"]:
            rows.append(f"| {run['prefill_budget']} | " + " | ".join(_cell(c, level.get(c)) for c in COLUMNS) + " |")
    table = "\n".join(rows)
    (args.out / "prefill_serve.md").write_text(table + "\n")
    print(table)
    return 0


def _cell(column: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):  # per runner (γ): the chunked-prefill budget at the level's end
        return ", ".join(f"{k}: {v:.0f}" for k, v in sorted(value.items()))
    if column.endswith("_s") and not column.endswith("tok_s"):  # seconds
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
