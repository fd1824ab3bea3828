"""Time the fast model's kernels against their eager references on one GPU (issue 12).

    python scripts/kernel_bench.py --part attention --out $OUT/attn.json     # H200: < 60 s
    python scripts/kernel_bench.py --part attention --dry-run --out /tmp/a.json  # CPU, Triton interpreter, tiny

Parts (`--part`, repeatable; default all):
  attention  `slot_attention` (one layer's call) for kernel="reference" (SDPA + additive mask) and "triton"
             (split-K), k = 1..9 new tokens per row, over views of a SlotCache-like `[max_batch, H_kv, S_max, D]`
             cache with S in {512, 2048, 4096} slots and live lengths ≈ S/2; shapes: the zoo `gpu` target
             (H = H_kv = 16, D = 64) and an 8B Llama (H = 32, H_kv = 8, D = 128), batch 1 and 64; then, at
             batch 1 and the largest S, a sweep of live lengths (S/32, S/4, full): the kernel's time should
             follow them, the reference's should not.

Timing: CUDA-graph replay of `--calls` back-to-back calls, median over `--reps` replays (CUDA events), per call.
On CPU (`--dry-run`) wall-clock medians of eager calls: that checks the script's logic, not speed.
Every row also records the kernel's relative error against the reference on the same inputs and the launch
plan (tiles, splits, warps). Settings left when --budget-s runs out are listed as skipped, not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec.bench.device import time_call  # noqa: E402  (after the path insert)


# ---------------------------------------------------------------------------------------------- attention
ATTENTION_SHAPES = {  # name: (H, H_kv, D)
    "gpu": (16, 16, 64),  # the zoo `gpu` target (24 layers; one layer's call is timed)
    "8B": (32, 8, 128),  # Llama-3-8B attention
}


@dataclass(frozen=True)
class AttentionCase:
    """One timed setting: a model shape, batch, cache view of num_slots slots, live length per row."""

    shape: str
    heads: int
    kv_heads: int
    dim: int
    batch: int
    num_slots: int
    ks: tuple[int, ...]
    live: int | None = None  # None: S/2 ± S/8 per row; else every row holds `live` slots before its k new ones


def attention_cases(args) -> list[AttentionCase]:
    """Batch 1 first (the verify-cost target), then larger batches; then a live-length sweep at S = max slots."""
    if args.dry_run:
        shapes, batches, slots, ks = {"gpu": (2, 2, 16), "8B": (4, 1, 16)}, (1, 2), (64, 300), (1, 3)
    else:
        shapes, batches, slots, ks = ATTENTION_SHAPES, args.batches, args.slots, tuple(range(1, args.max_k + 1))
    cases = [AttentionCase(n, *hkd, b, s, ks) for b in batches for n, hkd in shapes.items() for s in slots]
    if args.live_sweep:  # the cost should follow the live length, not S
        s = max(slots)
        sweep_ks = (ks[0], ks[-1])
        cases += [AttentionCase(n, *hkd, 1, s, sweep_ks, live) for n, hkd in shapes.items()
                  for live in (s // 32, s // 4, s - 2 - ks[-1])]
    return cases


def bench_attention(args) -> list[dict]:
    import torch

    from specdec.fast.kernels import attention as attn

    try:
        from specdec.fast.kernels.triton_attention import plan, sm_count
    except ImportError:
        plan = None
    device = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    cuda = device == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    cases = attention_cases(args)
    s_max = max(c.num_slots for c in cases) + 16
    max_batch = max(c.batch for c in cases)
    rows, caches = [], {}
    t0 = time.perf_counter()
    for case in cases:
        where = dict(part="attention", shape=case.shape, batch=case.batch, num_slots=case.num_slots, live=case.live)
        if time.perf_counter() - t0 > args.budget_s:  # keep a device command inside its limit; say what was left
            rows.append(dict(where, skipped="budget"))
            continue
        kv_shape = (case.kv_heads, case.dim)
        if kv_shape not in caches:  # one SlotCache-like layer per KV shape: [max_batch, H_kv, S_max, D]
            caches.clear()
            if cuda:
                torch.cuda.empty_cache()
            caches[kv_shape] = tuple(torch.randn(max_batch, *kv_shape[:1], s_max, kv_shape[1], generator=gen,
                                                 device=device, dtype=dtype) for _ in range(2))
        keys, values = (c[: case.batch, :, : case.num_slots] for c in caches[kv_shape])  # what the model passes
        if case.live is None:
            spread = case.num_slots // 8
            starts = case.num_slots // 2 + torch.randint(-spread, spread + 1, (case.batch,), generator=gen,
                                                         device=device)
        else:
            starts = torch.full((case.batch,), case.live, device=device)
        for k in case.ks:
            q = torch.randn(case.batch, k, case.heads, case.dim, generator=gen, device=device, dtype=dtype)
            positions = starts[:, None] + torch.arange(k, device=device)[None, :]
            row = dict(where, heads=case.heads, kv_heads=case.kv_heads, head_dim=case.dim, k=k,
                       dtype=str(dtype).removeprefix("torch."), live_mean=float(starts.float().mean()) + k)
            if plan is not None:
                row["plan"] = vars(plan(case.batch, k, case.heads, case.kv_heads, case.dim, case.num_slots,
                                        sm_count(q.device), fp32=dtype == torch.float32))
            ref = attn.slot_attention_reference(q, keys, values, positions)
            for kernel in ("reference", "triton"):
                def fn(kernel=kernel):
                    return attn.slot_attention(q, keys, values, positions, kernel=kernel)
                try:
                    row[f"{kernel}_ms"] = time_call(fn, cuda=cuda, calls=args.calls, reps=args.reps)
                    if kernel == "triton":
                        out = fn().float()
                        row["rel_err"] = ((out - ref.float()).norm() / ref.float().norm()).item()
                except Exception as exc:  # a failing kernel is a result to report, not a reason to stop the table
                    row[f"{kernel}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            if cuda and "triton_ms" in row:  # K/V bytes the live slots hold over the time: the bandwidth reached
                live_bytes = 2 * case.batch * case.kv_heads * row["live_mean"] * case.dim * keys.element_size()
                row["triton_GBps"] = live_bytes / row["triton_ms"] / 1e6
            rows.append(row)
            print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    print_attention_table(rows)
    return rows


def print_attention_table(rows: list[dict]) -> None:
    """One line per (shape, B, S, live, kernel): ms per k, max_k t(k)/t(1), and for triton the median speedup over
    the reference, the best bandwidth over the live K/V bytes and the worst relative error."""
    nan = float("nan")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "k" in r:  # rows skipped for the time budget have none
            groups.setdefault((r["shape"], r["batch"], r["num_slots"], r["live"]), []).append(r)
    ks = sorted({r["k"] for rs in groups.values() for r in rs})
    print("slot_attention, ms per call (one layer); live: slots per row before the k new ones (- = S/2 ± S/8);")
    print("k/1 = max over k of t(k) / t(1); x = median reference/triton; GB/s over the live K/V bytes")
    print(f"{'shape':<5} {'B':>3} {'S':>5} {'live':>5} {'kernel':<9} " + " ".join(f"{'k=' + str(k):>7}" for k in ks)
          + f" {'k/1':>6} {'x':>6} {'GB/s':>6} {'rel err':>8}")
    for (shape, batch, num_slots, live), rs in groups.items():
        by_k = {r["k"]: r for r in rs}
        for kernel in ("reference", "triton"):
            times = [by_k.get(k, {}).get(f"{kernel}_ms", nan) for k in ks]
            cells = " ".join(f"{t:7.4f}" if k in by_k else f"{'':>7}" for k, t in zip(ks, times))
            ratio = max(t / times[0] for k, t in zip(ks, times) if k in by_k)
            line = f"{shape:<5} {batch:>3} {num_slots:>5} {live or '-':>5} {kernel:<9} {cells} {ratio:6.3f}"
            if kernel == "triton":
                speedup = statistics.median(r.get("reference_ms", nan) / r.get("triton_ms", nan) for r in rs)
                gbps = max((r.get("triton_GBps", nan) for r in rs), default=nan)
                err = max((r.get("rel_err", nan) for r in rs), default=nan)
                line += f" {speedup:6.2f} {gbps:6.0f} {err:8.1e}"
            print(line)
    for r in rows:
        if "skipped" in r:
            print(f"skipped ({r['skipped']}): {r['shape']} B={r['batch']} S={r['num_slots']} live={r['live']}")
        for kernel in ("reference", "triton"):
            if f"{kernel}_error" in r:
                where = f"{r['shape']} B={r['batch']} S={r['num_slots']} k={r['k']}"
                print(f"error {kernel} {where}: {r[kernel + '_error']}")


PARTS = {"attention": bench_attention}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", action="append", choices=sorted(PARTS), help="part to run (repeatable; default all)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the rows")
    parser.add_argument("--calls", type=int, default=10, help="calls captured per CUDA graph")
    parser.add_argument("--reps", type=int, default=10, help="graph replays timed (median)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="attention: batch sizes")
    parser.add_argument("--slots", type=int, nargs="+", default=[512, 2048, 4096], help="attention: cache sizes S")
    parser.add_argument("--max-k", type=int, default=9, help="attention: k = 1..max_k new tokens per row")
    parser.add_argument("--no-live-sweep", dest="live_sweep", action="store_false",
                        help="attention: skip the batch-1 sweep of live lengths at the largest S")
    parser.add_argument("--budget-s", type=float, default=40.0, help="skip the configs left after this many seconds")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on CPU under the Triton interpreter (checks the script, not speed)")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels import it on first use)
        args.reps = min(args.reps, 2)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --dry-run)")
    env = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    t0 = time.perf_counter()
    results = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    for part in args.part or sorted(PARTS):
        results["rows"] += PARTS[part](args)
    results["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"{len(results['rows'])} rows in {results['seconds']:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
