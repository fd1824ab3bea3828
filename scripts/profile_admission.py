"""Where an admission step's time goes, in the engine alone (issue 21 items 3 and 5): the serving table's
admission steps took 75–500 ms on an H200 for both arms (decode steps 3–30 ms) — for a ~300M target prefilling a
few prompts. This runs the same traffic through one `Engine` per arm (plain, and the head drafter with "auto" γ;
max_batch 128 and the server's warm-up), closed loops of C clients, and times every step's phases with the
engine's `phase_timer` (admission, chunked prefill, catch-up: each between device synchronizations), so the
engine's own admission cost is seen apart from the server's (GIL, hand-off). Then, on the empty plain engine,
each prefill shape twice (`prefill_rows`, synchronized): a first call's extra cost is per-shape setup (kernel
selection, allocator growth), not work.

    python3 scripts/profile_admission.py --pair /tmp/pair --head /tmp/pair/head --data data/code --out "$OUT/admission"
    python3 scripts/profile_admission.py --quick --out /tmp/admission      # CPU smoke: the demo pair, short runs

→ OUT/admission.json (per arm and level: admission / decode step quantiles, the phases' seconds, µs per
prefilled token; the shape-by-shape first/second call times) and OUT/admission.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"n": len(v), "p50_ms": 1e3 * pick(0.5), "p99_ms": 1e3 * pick(0.99), "max_ms": 1e3 * v[-1]}


def run_level(engine, requests, clients: int, max_seconds: float) -> dict:
    """A closed loop of `clients` over `requests`; every step's wall time and phases (synchronized)."""
    from specdec.bench.stalls import GcWatch
    from specdec.engine.profile import phase_timer

    pending, steps = list(requests), []
    begun = time.perf_counter()
    with phase_timer(engine, synchronize=("admit", "prefill", "catch_up")) as timer, GcWatch() as collections:
        for _ in range(min(clients, len(pending))):
            r = pending.pop(0)
            engine.add_request(r.prompt, r.params)
        while engine.has_unfinished() and time.perf_counter() - begun < max_seconds:
            timer.clear()
            admissions, fed, shapes = engine.num_admissions, engine.prefill_tokens, engine.num_step_shapes
            start, pauses = time.perf_counter(), len(collections.pauses)
            outs = engine.step()
            wall = time.perf_counter() - start
            parts = {k: timer.seconds.get(k, 0.0) for k in ("admit", "prefill", "catch_up", "commit", "step_shape")}
            steps.append({"wall": wall, **parts, "caught_up": timer.truthy.get("catch_up", 0),
                          "admitted": engine.num_admissions - admissions,
                          "fed": engine.prefill_tokens - fed, "new_shapes": engine.num_step_shapes - shapes,
                          "rows": engine.num_running, "gc": sum(t for _, t in collections.pauses[pauses:])})
            for out in outs:
                if out.finished and pending:
                    r = pending.pop(0)
                    engine.add_request(r.prompt, r.params)
    admit = [s for s in steps if s["admitted"]]
    catch = [s for s in steps if s["caught_up"] and not s["admitted"]]
    plain = [s for s in steps if not s["admitted"] and not s["fed"] and not s["new_shapes"]]
    fed = sum(s["fed"] for s in admit)
    return {"clients": clients, "steps": len(steps), "seconds": time.perf_counter() - begun,
            "admission_steps": _quantiles([s["wall"] for s in admit]),
            "admission_phase": _quantiles([s["admit"] for s in admit]),
            "admission_us_per_token": 1e6 * sum(s["admit"] for s in admit) / fed if fed else None,
            "fed_per_admission_step": fed / len(admit) if admit else None,  # prompt tokens, target and drafter
            # mean ms per admission step: each phase, and the rest (the policy, the decode step itself)
            "admission_breakdown_ms": None if not admit else {
                k: 1e3 * sum(s[k] for s in admit) / len(admit) for k in ("wall", "admit", "prefill", "catch_up",
                                                                         "commit", "step_shape", "gc")},
            "gc_s": sum(s["gc"] for s in steps), "steps_s": sum(s["wall"] for s in steps),
            "catch_up_steps": _quantiles([s["wall"] for s in catch]),
            "catch_up_phase": _quantiles([s["catch_up"] for s in catch]),
            "decode_steps": _quantiles([s["wall"] for s in plain]),
            "new_shape_steps": _quantiles([s["wall"] for s in steps if s["new_shapes"]]),
            "worst": sorted(steps, key=lambda s: -s["wall"])[:5]}


def first_calls(engine, lengths=(100, 300, 700), rows=(1, 4)) -> list[dict]:
    """On an empty engine: each (rows, prompt length) prefill twice, synchronized → first and second call ms."""
    import torch

    from specdec.engine.slots import prefill_rows
    from specdec.request import SamplingParams

    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    out = []
    with torch.inference_mode():
        for n in rows:
            for length in lengths:
                prompts = [[(7 * i + 3 * j) % 200 + 5 for i in range(length)] for j in range(n)]
                engine.state.admit_rows(0, prompts, [SamplingParams()] * n, [0] * n)
                times = []
                for _ in range(2):
                    sync()
                    start = time.perf_counter()
                    prefill_rows(engine.model, engine.cache, engine.state, slice(0, n), [0] * n, [length - 1] * n,
                                 engine.config.prefill_chunk, features=engine.state.features, extent=0)
                    sync()
                    times.append(1e3 * (time.perf_counter() - start))
                for slot in range(n):
                    engine.state.clear(slot)
                out.append({"rows": n, "length": length, "first_ms": times[0], "second_ms": times[1]})
    return out


def _policy(text: str):
    """--policies: "auto" or a γ of 1..8 (a one-line argparse error otherwise)."""
    if text == "auto":
        return text
    if not text.isdigit() or not 1 <= int(text) <= 8:
        raise argparse.ArgumentTypeError(f"policy {text!r}: expected auto or a γ of 1..8")
    return int(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path)
    p.add_argument("--head", type=Path)
    p.add_argument("--data", type=Path)
    p.add_argument("--quick", action="store_true", help="CPU smoke run on the demo pair")
    p.add_argument("--clients", nargs="+", type=int, default=[8, 64])
    p.add_argument("--requests", type=int, default=96, help="requests per level")
    p.add_argument("--max-seconds", type=float, default=25.0, help="per level")
    p.add_argument("--prefill-budget", default=None, help="the engines' EngineConfig.prefill_budget (int or auto)")
    p.add_argument("--max-batch", type=int, default=128, help="slots (the serving table's server: 128; fewer warm "
                   "up faster)")
    p.add_argument("--drafter", choices=("head", "model"), default="head", help="the speculative arms' drafter")
    p.add_argument("--policies", nargs="+", type=_policy, default=["auto"],
                   help="the speculative arms' γ policies (auto, or a γ of 1..8)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not args.quick and (args.pair is None or args.data is None or args.head is None):
        p.error("--pair, --head and --data are required (or --quick)")
    budget = None if args.prefill_budget in (None, "0") else (
        "auto" if args.prefill_budget == "auto" else int(args.prefill_budget))

    import torch

    from specdec.bench.traffic import TrafficSpec, make_requests
    from specdec.bench.traffic_setup import GPU_SPEC, QUICK_SPEC, code_pool, demo_pool
    from specdec.engine import Engine, EngineConfig
    from specdec.text.warmup import warm_up

    if args.quick:
        from specdec.bench.demo_pair import DEMO_PAIR
        from specdec.loading import load_model

        target = load_model(str(DEMO_PAIR / "target"), device="cpu", dtype="float32")
        drafter, pool, base, max_batch = load_model(str(DEMO_PAIR / "draft"), device="cpu", dtype="float32"), \
            demo_pool(), QUICK_SPEC, 8
    else:
        from specdec.bench.presets import load_pair

        target, model = load_pair(args.pair, torch.device("cuda"), torch.bfloat16)
        drafter, base, max_batch = str(args.head) if args.drafter == "head" else model, GPU_SPEC, args.max_batch
        pool = code_pool(args.data, min(int(target.config.max_position_embeddings), 4096))
    max_total = min(int(target.config.max_position_embeddings), 4096)
    spec = TrafficSpec(slots=(max(args.clients),), prompt_tokens=base["prompt_tokens"], new_tokens=base["new_tokens"])
    eos = target.config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    requests = make_requests(pool, args.requests, spec, eos_ids, spec.seed, max_total=max_total)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"prefill_budget": budget, "arms": {}}
    arms = [("plain", None, 0)] + [(f"{args.drafter} {p}", drafter, p) for p in args.policies]
    for arm, draft, gamma in arms:
        config = EngineConfig(max_batch_size=max_batch, max_seq_len=max_total, num_draft_tokens=gamma,
                              prefill_budget=budget)
        engine = Engine(target, draft, config)
        warm = warm_up(engine, engine.max_batch) if engine.cuda_graphs else None
        levels = [run_level(engine, requests, c, args.max_seconds) for c in args.clients]
        result["arms"][arm] = {"warmup_s": None if warm is None else warm["seconds"], "levels": levels}
        if arm == "plain":
            result["first_calls"] = first_calls(engine)
        print(f"{arm}: " + "; ".join(f"{lv['clients']} clients: admission p50/max "
                                      f"{lv['admission_steps'].get('p50_ms', 0):.1f}/{lv['admission_steps'].get('max_ms', 0):.1f} ms "
                                      f"({lv['admission_us_per_token'] or 0:.1f} µs/token), decode p99 "
                                      f"{lv['decode_steps'].get('p99_ms', 0):.1f} ms" for lv in levels), flush=True)
        del engine
    (args.out / "admission.json").write_text(json.dumps(result, indent=1))
    rows = ["| arm | clients | admission steps p50 / p99 / max (ms) | admit phase p50 (ms) | µs / prompt token | "
            "tokens fed / admission step | catch-up steps p50 / max | decode p50 / p99 | new-shape steps max |",
            "|---|---|---|---|---|---|---|---|---|"]
    f = lambda q, k: "–" if not q.get("n") else f"{q[k]:.1f}"  # noqa: E731
    for arm, data in result["arms"].items():
        for lv in data["levels"]:
            print(f"{arm} {lv['clients']}: admission step breakdown (mean ms) {lv['admission_breakdown_ms']}")
            a, c, d = lv["admission_steps"], lv["catch_up_steps"], lv["decode_steps"]
            rows.append(f"| {arm} | {lv['clients']} | {f(a, 'p50_ms')} / {f(a, 'p99_ms')} / {f(a, 'max_ms')} | "
                        f"{f(lv['admission_phase'], 'p50_ms')} | {lv['admission_us_per_token'] or 0:.1f} | "
                        f"{lv['fed_per_admission_step'] or 0:.0f} | {f(c, 'p50_ms')} / {f(c, 'max_ms')} | "
                        f"{f(d, 'p50_ms')} / {f(d, 'p99_ms')} | {f(lv['new_shape_steps'], 'max_ms')} |")
    rows += ["", "| rows | prompt | first call (ms) | second call (ms) |", "|---|---|---|---|"]
    rows += [f"| {r['rows']} | {r['length']} | {r['first_ms']:.1f} | {r['second_ms']:.1f} |" for r in result["first_calls"]]
    (args.out / "admission.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
