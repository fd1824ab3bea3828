"""Few-row linear (decode / verify GEMMs): cuBLAS (F.linear) vs the Triton weight-streaming kernel's configs.

Run on a GPU, from the repo root (< 90 s on an H200):
    PYTHONPATH=. python scripts/bench_linear.py --out /tmp/bench_linear.json
Logic check without a GPU (Triton's interpreter, tiny shapes, CPU timings meaningless):
    PYTHONPATH=. python scripts/bench_linear.py --interpret --out /tmp/bench_linear_cpu.json

Shapes: the zoo target's projections (dim 1024, ff 2816, vocab 8192) and an 8B Llama's (dim 4096, ff 14336,
vocab 128256, 8 KV heads); M ∈ {1, 2, 5, 9, 16} rows. Timing: one CUDA graph of ≥ 20 back-to-back calls that
rotate over enough weight copies that each call reads its weights from HBM (the copies between two uses of one
copy exceed 2x the L2), replayed; the median replay divided by the calls. GB/s = weight bytes / time.
Each config's output is first checked against an fp32 reference (relative error ≤ 1e-2, else it is dropped).
Prints a table, the 8B layer's four matrices summed at M = 1, t(M)/t(1) per matrix, and a Python dict literal
of the best config per (M, N, K) to paste into `specdec.fast.kernels.linear.CONFIGS`; writes all of it as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # matrix → (N, K): out features, in features
    "zoo": {"qkv": (3072, 1024), "o": (1024, 1024), "gate_up": (5632, 1024), "down": (1024, 2816),
            "lm_head": (8192, 1024)},
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
           "lm_head": (128256, 4096)},
}
TINY_SHAPES = {"tiny": {"qkv": (96, 32), "o": (32, 32), "gate_up": (64, 32), "down": (32, 64), "lm_head": (80, 32)}}
LAYER = ("qkv", "o", "gate_up", "down")
ROWS = (1, 2, 5, 9, 16)
# (variant, block_n, block_k, num_warps, num_stages); split_k ∈ SPLITS is crossed with each where it makes sense.
BASES = [("dot", 16, 256, 4, 4), ("dot", 32, 128, 4, 4), ("dot", 32, 256, 4, 4), ("dot", 64, 128, 4, 4),
         ("dot", 64, 128, 4, 5), ("dot", 64, 256, 4, 3), ("dot", 128, 128, 8, 3), ("dot", 16, 512, 4, 3),
         ("fma", 16, 256, 4, 3), ("fma", 32, 128, 4, 3)]
TINY_BASES = [("dot", 16, 16, 4, 2), ("fma", 16, 16, 4, 2)]
SPLITS = (1, 2, 4, 8, 16)
FMA_MAX_ROWS = 2


def candidates(m: int, n: int, k: int, bases, num_sms: int):
    """LinearConfigs worth timing for (M, N, K): every base × split with ≥ 1 tile per slice, splitting only while
    the column blocks alone fill < 4 waves of SMs; the FMA variant only for M ≤ FMA_MAX_ROWS."""
    from specdec.fast.kernels.linear import LinearConfig
    out = []
    for variant, block_n, block_k, warps, stages in bases:
        if variant == "fma" and m > FMA_MAX_ROWS:
            continue
        blocks = -(-n // block_n)
        for split in SPLITS:
            if split > 1 and (k // split < block_k or blocks >= 4 * num_sms):
                continue
            out.append(LinearConfig(variant, block_n, block_k, split, warps, stages))
    return out


def _compile_some(jobs) -> list:
    """In a worker process: launch each (config tuple, M, K, split_reduce) once on small CUDA tensors, so that
    Triton compiles it into its on-disk cache with the same specialization as the real shapes (every N, K and
    stride a multiple of 16, M unspecialized); the benchmark process then only loads the binaries."""
    import torch

    from specdec.fast.kernels.linear import LinearConfig, linear
    failed = []
    for config, m, k, split_reduce in jobs:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1024, k, device="cuda", dtype=torch.bfloat16)  # N ≥ 1024: the reduce block as for real N
        try:
            linear(x, w, kernel="triton", config=LinearConfig(*config), split_reduce=split_reduce)
        except Exception as e:  # e.g. out of shared memory: the search drops that config later
            failed.append((config, m, k, split_reduce, repr(e)[:300]))
    torch.cuda.synchronize()
    return failed


def compile_jobs(bases, ks, num_sms: int) -> list[tuple]:
    """(config tuple, M, K, split_reduce) launches that together compile every kernel the search can use: each
    base config and the heuristic's configs, without split, with the fused and the two-kernel split reduce, for
    each K tail case (K % block_k == 0 or not) and, for the FMA variant, each row-block size (M = 1, 2)."""
    from specdec.fast.kernels.linear import pick_config
    heuristics = {cfg_tuple(pick_config(m, n, k, num_sms)) for m in ROWS for n, k in ks}
    configs = sorted({(v, bn, bk, 1, w, st) for v, bn, bk, w, st in bases} | heuristics)
    jobs, seen = [], set()
    for variant, block_n, block_k, _, warps, stages in configs:
        for m in ((1, 2) if variant == "fma" else (1,)):
            for k in sorted({k for _, k in ks}):
                for split, reduce in ((1, "fused"), (2, "fused"), (2, "kernel")):
                    config = (variant, block_n, block_k, split, warps, stages)
                    key = (config, m, k % block_k == 0, reduce)
                    if k >= 2 * block_k and key not in seen:
                        seen.add(key)
                        jobs.append((config, m, k, reduce))
    return jobs


def precompile(jobs, workers: int) -> tuple[float, list]:
    """Run `_compile_some` over the jobs in parallel worker processes → (seconds it took, failed jobs)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    t0 = time.perf_counter()
    chunks = [jobs[i::workers] for i in range(workers)]
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            failed = [f for fails in pool.map(_compile_some, [c for c in chunks if c]) for f in fails]
    except Exception as e:  # noqa: BLE001 (a broken pool only costs time: the search compiles what is missing)
        print(f"parallel compile failed ({e!r}); compiling on first use instead", flush=True)
        failed = []
    return time.perf_counter() - t0, failed


class Timer:
    """Median seconds per call of fn(weight) over `calls` back-to-back calls rotating over `weights`: one CUDA
    graph of them replayed (`specdec.bench.device.time_call`); in interpreter mode the plain wall clock."""

    def __init__(self, cuda: bool, reps: int):
        self.cuda, self.reps = cuda, reps

    def __call__(self, fn, weights, calls: int) -> float:
        from specdec.bench.device import time_call

        rotation = itertools.cycle(weights)
        return time_call(lambda: fn(next(rotation)), cuda=self.cuda, calls=calls, reps=self.reps) / 1e3


def copy_bandwidth(torch, nbytes: int) -> float:
    """Device-to-device copy GB/s (read + write counted) of nbytes: the practical ceiling to compare with."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) / 1e3) / 1e9


def cfg_tuple(c) -> tuple:
    return (c.variant, c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--interpret", action="store_true", help="CPU + Triton interpreter, tiny shapes (logic check)")
    ap.add_argument("--budget-s", type=float, default=45.0,
                    help="seconds for the config search after compiling, shared evenly by the (matrix, M) pairs "
                         "(cuBLAS and the heuristic always run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing (median)")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                    help="processes that compile the kernels in parallel before timing")
    ap.add_argument("--models", default=None, help="comma list of shape sets (default: zoo,8b)")
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch
    import torch.nn.functional as F

    from specdec.fast.kernels.linear import LinearConfig, linear, pick_config

    t_start = time.perf_counter()
    cuda = not args.interpret
    if cuda and not torch.cuda.is_available():
        sys.exit("needs CUDA (or --interpret)")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = TINY_SHAPES if args.interpret else SHAPES
    if args.models:
        shapes = {name: shapes[name] for name in args.models.split(",")}
    bases = TINY_BASES if args.interpret else BASES
    rows = (1, 2, 5) if args.interpret else ROWS
    if cuda:
        props = torch.cuda.get_device_properties(0)
        num_sms, l2_bytes = props.multi_processor_count, getattr(props, "L2_cache_size", 60 * 2 ** 20)
    else:
        num_sms, l2_bytes = 4, 4096
    jobs = compile_jobs(bases, [nk for mats in shapes.values() for nk in mats.values()], num_sms)
    compile_s, compile_failed = precompile(jobs, args.workers) if cuda else (0.0, [])
    for failure in compile_failed:
        print("compile failed:", failure)
    timer = Timer(cuda, args.reps)
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)", "torch": torch.__version__,
              "triton": __import__("triton").__version__, "num_sms": num_sms, "l2_bytes": l2_bytes,
              "copy_gbs": copy_bandwidth(torch, 2 ** 30) if cuda else None, "compile_s": compile_s,
              "compiled_launches": len(jobs),
              "compile_failed": compile_failed,
              "rows": [], "dropped": []}
    t_search = time.perf_counter()
    best_table: dict[tuple[int, int, int], tuple] = {}
    out_of_budget = False
    # The config search shares --budget-s evenly over the (matrix, M) pairs; time a pair leaves unused carries over.
    num_pairs = sum(len(matrices) for matrices in shapes.values()) * len(rows)
    pair_index = 0
    for model, matrices in shapes.items():
        for matrix, (n, k) in matrices.items():
            weight_bytes = n * k * torch.finfo(dtype).bits // 8
            copies = max(2, 1 + math.ceil(2 * l2_bytes / weight_bytes))
            calls = max(20, copies) if cuda else 2
            weights = [torch.randn(n, k, device=device, dtype=dtype) / math.sqrt(k) for _ in range(copies)]
            for m in rows:
                x = torch.randn(m, k, device=device, dtype=dtype)
                want = F.linear(x.float(), weights[0].float())

                def timed(config, split_reduce="fused"):
                    """(seconds per call, relative error) of the Triton kernel with this config; (None, why) if it
                    fails or is wrong."""
                    try:
                        got = linear(x, weights[0], kernel="triton", config=config, split_reduce=split_reduce)
                    except Exception as e:  # noqa: BLE001 (a config the compiler or the device refuses)
                        return None, repr(e)[:300]
                    err = ((got.float() - want).norm() / want.norm()).item()
                    if not err <= 1e-2:
                        return None, err
                    return timer(lambda w: linear(x, w, kernel="triton", config=config, split_reduce=split_reduce),
                                 weights, calls), err

                t_cublas = timer(lambda w: F.linear(x, w), weights, calls)
                heuristic = pick_config(m, n, k, num_sms)
                t_heur, err_heur = timed(heuristic)
                tried = [{"config": cfg_tuple(heuristic), "us": t_heur and t_heur * 1e6, "rel_err": err_heur}]
                pair_index += 1
                pair_deadline = t_search + args.budget_s * pair_index / num_pairs
                for config in candidates(m, n, k, bases, num_sms):
                    if config == heuristic:
                        continue
                    if time.perf_counter() > pair_deadline:
                        out_of_budget = True
                        break
                    t, err = timed(config)
                    tried.append({"config": cfg_tuple(config), "us": t and t * 1e6, "rel_err": err})
                for entry in tried:
                    if entry["us"] is None:
                        report["dropped"].append({"model": model, "matrix": matrix, "m": m, **entry})
                ok = [e for e in tried if e["us"] is not None]
                best = min(ok, key=lambda e: e["us"]) if ok else None
                if best is not None:
                    best_table[(m, n, k)] = best["config"]
                row = {"model": model, "matrix": matrix, "n": n, "k": k, "m": m, "weight_bytes": weight_bytes,
                       "copies": copies, "calls": calls, "cublas_us": t_cublas * 1e6,
                       "cublas_gbs": weight_bytes / t_cublas / 1e9, "heuristic": tried[0], "best": best,
                       "tried": tried}
                if best is not None:
                    best["gbs"] = weight_bytes / (best["us"] / 1e6) / 1e9
                    best["cublas_over_triton"] = t_cublas * 1e6 / best["us"]
                    if best["config"][3] > 1:  # what the fused split-K reduction saves over a second kernel
                        t_two, _ = timed(LinearConfig(*best["config"]), split_reduce="kernel")
                        best["two_kernel_reduce_us"] = t_two and t_two * 1e6
                report["rows"].append(row)
                nan = float("nan")
                b = best or {"us": nan, "gbs": nan, "config": None, "cublas_over_triton": nan}
                two = b.get("two_kernel_reduce_us")
                print(f"{model:4} {matrix:8} N={n:6} K={k:5} M={m:2}  cuBLAS {t_cublas * 1e6:8.1f} us "
                      f"{weight_bytes / t_cublas / 1e9:7.0f} GB/s | triton best {b['us']:8.1f} us {b['gbs']:7.0f} GB/s "
                      f"x{b['cublas_over_triton']:.2f} {b['config']}"
                      + (f" (2-kernel reduce {two:.1f} us)" if two else "")
                      + f" | heuristic {(tried[0]['us'] or float('nan')):8.1f} us  ({len(tried)} configs)", flush=True)
            del weights
            if cuda:
                torch.cuda.empty_cache()

    def row_of(model, matrix, m):
        return next((r for r in report["rows"] if (r["model"], r["matrix"], r["m"]) == (model, matrix, m)), None)

    # One 8B layer's four matrices (the lm_head is once per token, not per layer), per M.
    layer_model = "8b" if "8b" in shapes else next(iter(shapes))
    report["layer"] = {}
    for m in rows:
        parts = [row_of(layer_model, mat, m) for mat in LAYER]
        if any(p is None or p["best"] is None for p in parts):
            continue
        nbytes = sum(p["weight_bytes"] for p in parts)
        cub, tri = sum(p["cublas_us"] for p in parts), sum(p["best"]["us"] for p in parts)
        heur = sum(p["heuristic"]["us"] or float("nan") for p in parts)
        report["layer"][m] = {"weight_bytes": nbytes, "cublas_us": cub, "triton_us": tri, "heuristic_us": heur,
                              "cublas_gbs": nbytes / cub / 1e3, "triton_gbs": nbytes / tri / 1e3,
                              "cublas_over_triton": cub / tri}
        print(f"{layer_model} layer (qkv+o+gate_up+down) M={m:2}: cuBLAS {cub:8.1f} us {nbytes / cub / 1e3:6.0f} GB/s"
              f" | triton {tri:8.1f} us {nbytes / tri / 1e3:6.0f} GB/s (x{cub / tri:.2f}) | heuristic {heur:8.1f} us")
    # Verify cost flatness: t(M) / t(1) for each matrix, cuBLAS and the best Triton config.
    report["flatness"] = {}
    for model, matrices in shapes.items():
        for matrix in matrices:
            one = row_of(model, matrix, 1)
            if one is None or one["best"] is None:
                continue
            flat = {m: {"cublas": r["cublas_us"] / one["cublas_us"], "triton": r["best"]["us"] / one["best"]["us"]}
                    for m in rows if (r := row_of(model, matrix, m)) is not None and r["best"] is not None}
            report["flatness"][f"{model}.{matrix}"] = flat
            print(f"t(M)/t(1) {model}.{matrix:8}: " + "  ".join(
                f"M={m}: cuBLAS {v['cublas']:.2f} triton {v['triton']:.2f}" for m, v in flat.items()))
    literal = "{\n" + "".join(f"    {key!r}: {value!r},\n" for key, value in sorted(best_table.items())) + "}"
    report["configs_literal"] = literal
    # One config per matrix for every M (the same kernel for a 1-token pass and a γ+1 verify): among the configs
    # timed at every M, the one with the least summed time.
    uniform_table, report["uniform"] = {}, {}
    for model, matrices in shapes.items():
        for matrix, (n, k) in matrices.items():
            per_m = {m: {tuple(e["config"]): e["us"] for e in r["tried"] if e["us"] is not None}
                     for m in rows if (r := row_of(model, matrix, m)) is not None}
            common = set.intersection(*(set(t) for t in per_m.values())) if per_m else set()
            if not common:
                continue
            config = min(common, key=lambda c: sum(t[c] for t in per_m.values()))
            times = {m: t[config] for m, t in per_m.items()}
            report["uniform"][f"{model}.{matrix}"] = {"config": config, "us": times}
            uniform_table.update({(m, n, k): config for m in per_m})
            print(f"one config for every M {model}.{matrix:8}: {config} "
                  + "  ".join(f"M={m}: {t:.1f} us" for m, t in times.items())
                  + f"  (vs best per M: {sum(times.values()) / sum(min(t.values()) for t in per_m.values()):.3f}x)")
    uniform_literal = "{\n" + "".join(f"    {key!r}: {value!r},\n" for key, value in sorted(uniform_table.items()))
    uniform_literal += "}"
    report["uniform_configs_literal"] = uniform_literal
    report["out_of_budget"] = out_of_budget
    report["elapsed_s"] = time.perf_counter() - t_start
    if report["copy_gbs"]:
        print(f"device-to-device copy: {report['copy_gbs']:.0f} GB/s (read + write)")
    print("# best config per (M, N, K) → paste into specdec.fast.kernels.linear.CONFIGS")
    print(f"CONFIGS = {literal}")
    print("# or: one config per (N, K) for every M (equal kernels for decode and verify)")
    print(f"CONFIGS = {uniform_literal}")
    if out_of_budget:
        print(f"(some (matrix, M) pairs ran out of their share of --budget-s {args.budget_s}: "
              "not every config was tried)")
    print(f"elapsed {report['elapsed_s']:.1f} s (parallel compile {compile_s:.1f} s)")
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
