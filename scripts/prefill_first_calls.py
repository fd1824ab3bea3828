"""Why an admission's prefill sometimes takes 100–270 ms (issue 21, the ITL p99 and the 64-slot closed loop):
grouped eager prefills of random admissions (1–8 requests of 30–768 tokens, as the traffic bench admits them)
on a random-weight target of the zoo `gpu` shape, each synchronized and timed, split by whether its shape (rows,
chunk buckets, spans) was seen before in this process; the allocator's device allocations per call; and a
torch.profiler table of where the host time of the first-seen calls goes (cuBLAS, module loads, cudaMalloc).

    python3 scripts/prefill_first_calls.py --out "$OUT/first"                         # default CUDA module loading
    CUDA_MODULE_LOADING=EAGER python3 scripts/prefill_first_calls.py --out "$OUT/first_eager"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=160)
    p.add_argument("--max-rows", type=int, default=8)
    p.add_argument("--warm", action="store_true", help="run Engine's prefill warm-up first (when it has one)")
    p.add_argument("--before", action="store_true", help="the engine as it was before 2026-11-27: SDPA may take "
                   "cuDNN and the first chunk of fresh rows attends through the mask (a baseline in the same process "
                   "kind, on the same machine)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    import torch

    from specdec.engine import Engine, EngineConfig
    from specdec.engine.slots import chunk_shapes, prefill_rows
    from specdec.request import SamplingParams
    from specdec.zoo.models import build_model
    from specdec.zoo.presets import PRESETS

    if args.before:  # SDPA free to take cuDNN again, and the first chunk through the mask over the whole span
        from torch.nn.attention import SDPBackend

        import specdec.fast.layers as layers
        from specdec.fast.kernels import attention

        attention.SDPA_BACKENDS[:] = [SDPBackend.CUDNN_ATTENTION, *attention.SDPA_BACKENDS]

        def masked(q, keys, values, scale=None):  # the reference at positions 0..k-1 (padding's outputs unread)
            positions = torch.arange(q.shape[1], device=q.device).expand(q.shape[0], -1)
            return attention.slot_attention_reference(q, keys, values, positions, scale)

        layers.causal_prefix_attention = masked
    shape = PRESETS["gpu"].target
    model = build_model(shape, vocab_size=32000).to("cuda", torch.bfloat16).eval()
    engine = Engine(model, None, EngineConfig(max_batch_size=64, max_seq_len=1024))
    started = time.perf_counter()
    if args.warm and hasattr(engine, "warm_prefill"):
        engine.warm_prefill()
    warm_s = time.perf_counter() - started
    rng, seen, calls = random.Random(0), set(), []
    chunk = engine.config.prefill_chunk
    with torch.inference_mode():
        for i in range(args.calls):
            n = rng.randint(1, args.max_rows)
            lengths = [rng.randint(30, 768) for _ in range(n)]
            prompts = [[rng.randrange(5, 31000) for _ in range(m)] for m in lengths]
            engine.state.admit_rows(0, prompts, [SamplingParams()] * n, [0] * n)
            ends = [m - 1 for m in lengths]
            key = (n, tuple(chunk_shapes([0] * n, ends, chunk, 0, engine.state.tokens.shape[1],
                                         engine.cache.num_positions)))
            before = torch.cuda.memory_stats().get("num_device_alloc", 0)
            torch.cuda.synchronize()
            start = time.perf_counter()
            prefill_rows(engine.model, engine.cache, engine.state, slice(0, n), [0] * n, ends, chunk, extent=0)
            torch.cuda.synchronize()
            ms = 1e3 * (time.perf_counter() - start)
            calls.append({"i": i, "rows": n, "tokens": sum(ends), "ms": ms, "new": key not in seen,
                          "device_allocs": torch.cuda.memory_stats().get("num_device_alloc", 0) - before})
            seen.add(key)
            for slot in range(n):
                engine.state.clear(slot)
        # where the host time of new shapes goes: a profile of 12 calls of fresh row counts
        from torch.profiler import ProfilerActivity, profile

        fresh = [(n, rng.randint(30, 768)) for n in range(args.max_rows + 1, args.max_rows + 13)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for n, m in fresh:
                prompts = [[rng.randrange(5, 31000) for _ in range(m)] for _ in range(n)]
                engine.state.admit_rows(0, prompts, [SamplingParams()] * n, [0] * n)
                prefill_rows(engine.model, engine.cache, engine.state, slice(0, n), [0] * n, [m - 1] * n, chunk,
                             extent=0)
                torch.cuda.synchronize()
                for slot in range(n):
                    engine.state.clear(slot)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    new = [c["ms"] for c in calls if c["new"]]
    old = [c["ms"] for c in calls if not c["new"]]
    summary = {"module_loading": os.environ.get("CUDA_MODULE_LOADING", "(default)"), "warm_s": warm_s,
               "before": args.before,
               "new_shapes": {"n": len(new), "median_ms": statistics.median(new) if new else None,
                              "max_ms": max(new, default=None), "over_50ms": sum(v > 50 for v in new)},
               "seen_shapes": {"n": len(old), "median_ms": statistics.median(old) if old else None,
                               "max_ms": max(old, default=None), "over_50ms": sum(v > 50 for v in old)},
               "slowest": sorted(calls, key=lambda c: -c["ms"])[:8]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_calls.json").write_text(json.dumps({"summary": summary, "calls": calls}, indent=1))
    (args.out / "profile.txt").write_text(table)
    print(json.dumps(summary, indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
