"""Where plain decoding's bandwidth goes: one batch-1 decode step of a random Llama, profiled kernel by kernel.

    python scripts/profile_decode.py --shape 8b 70b-tp4 --variant auto triton --out $OUT/profile.jsonl   # GPU
    python scripts/profile_decode.py --shape tiny --pair tiny --device cpu --new 4                       # CPU smoke

For each shape and each kernel variant (`--variant`: the fast model's GEMM choice, see VARIANTS) it builds random
bf16 weights on the device (`FastLlama.random`; shapes from scripts/tp_probe.py, "70b-tp4" = one GPU's shard of the
70B shape at tensor-parallel 4: heads, KV heads, MLP and vocabulary / 4, no all-reduce), prefills one prompt
eagerly, captures one greedy decode step (forward of 1 token + argmax feeding the next step's input) in a CUDA
graph and replays it. Rows (JSON lines on stdout and appended to --out):

  "peak"     the device's copy bandwidth, MEASURED (a large `copy_`: read + write bytes / time) and the datasheet
             figure (H100 SXM 3.35 TB/s, H200 4.8 TB/s)
  "gemm"     (variants "measured*") µs per call and GB/s of cuBLAS and of the Triton GEMM for each weight shape at
             1 row, over every layer's matrix of that shape (`kernels.linear_choice`); "gemm_choice" the shapes
             the Triton GEMM won
  "decode"   tok/s from the graph loop, with prefill excluded and included; bytes per token (every weight read
             once, the embedding table excluded, + the KV cache read at the mean context); MBU of both against
             both peaks
  "profile"  one replayed step under torch.profiler: kernels grouped by role (each projection's GEMM, attention,
             norms, RoPE + KV write, activation, LM head, argmax, embedding, memcpy, other) with µs, share of the
             step, bytes and achieved GB/s per group; the sum of kernel times vs the step's wall time (the gap is
             launch gaps inside the graph); kernels per step; the "other" kernels' names
  (the same model through the request-level engine, itemised against this graph step: scripts/profile_engine.py)
  "draft"    (--pair) the zoo pair's shapes with random weights (`specdec.bench.presets.random_zoo_pair`): one
             target step and one draft step of γ chained 1-token drafter forwards (each argmax feeding the next),
             both replayed from CUDA graphs → c = (draft step / γ) / target step, and kernels per drafted token

GEMMs are attributed to projections by their order in the step (per layer: q|k|v, o, gate|up, down; then the LM
head); a split-K reduce kernel belongs to the GEMM before it. When the count of GEMMs does not match, they are
reported as "gemm (unattributed)". On CPU (no CUDA graphs, no kernel trace) the same table is made of the step's
top-level torch ops: it checks the script, not a speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_probe import HBM_BYTES_PER_S, SHAPES, llama_shape  # noqa: E402

from specdec.bench.report import append_json_line  # noqa: E402

# variant → the fast model's (kernels, linear_kernel, measured): "auto" = Triton layer kernels, the weight-streaming
# GEMM only where `kernels.linear.FASTER_THAN_CUBLAS` says, cuBLAS elsewhere; "triton" = the Triton GEMM for every
# weight; "measured" = "auto" with the Triton GEMM for the shapes where it measured faster than cuBLAS on this device
# at 1 row (`kernels.linear_choice`; "gemm" rows); "cublas" = cuBLAS for every GEMM; "reference" = the eager body.
# (The GEMM prologue variants, "triton-fused" and "measured-fused", lost on both shapes and went with the prologues:
# BENCHMARKS.md "Where plain decoding's bandwidth goes".)
VARIANTS = {"auto": ("auto", "auto", False), "triton": ("auto", "triton", False), "measured": ("auto", "auto", True),
            "cublas": ("auto", "reference", False), "reference": ("reference", "reference", False)}


def set_variant(model, variant: str, measured: frozenset | None = None) -> None:
    model.kernels, model.linear_kernel, use_measured = VARIANTS[variant]
    model.triton_linear_shapes = measured if use_measured else None


def measure_gemms(model, device, rows=(1,)) -> tuple[frozenset, list[dict]]:
    """The shapes where the Triton GEMM beat cuBLAS on this device (every layer's matrices of a shape per pass),
    and one "gemm" row per shape and row count. On CPU: nothing is measured (an empty set)."""
    if device.type != "cuda":
        return frozenset(), []
    from specdec.fast.kernels.linear_choice import faster_shapes, time_gemms

    groups = [list(model.wqkv), list(model.wo), list(model.w_gate_up), list(model.w_down), [model.lm_head]]
    timings = [time_gemms(group, rows=m) for group in groups for m in rows]
    rows_out = [{"row": "gemm", "n": t.n, "k": t.k, "rows": t.rows, "weights": t.weights,
                 "cublas_us": round(t.cublas_us, 2), "triton_us": round(t.triton_us, 2),
                 "cublas_GBps": round(t.cublas_GBps, 1), "triton_GBps": round(t.triton_GBps, 1)} for t in timings]
    return faster_shapes(timings), rows_out
TP4_SHARD = "70b-tp4"
PROJECTIONS = ("qkv", "o", "gate_up", "down")


def shape_for(name: str):
    """`LlamaShape` of a tp_probe shape, or of one GPU's shard of the 70B shape at TP 4."""
    if name != TP4_SHARD:
        return llama_shape(name)
    full = llama_shape("70b")
    return dataclasses.replace(full, n_heads=full.n_heads // 4, n_kv_heads=full.n_kv_heads // 4,
                               intermediate_size=full.intermediate_size // 4, vocab_size=full.vocab_size // 4)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def datasheet_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and ("PCIe" in name or "PCIE" in name):
        return 2.0e12
    return next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)


def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 10) -> float:
    """Bytes per second of `dst.copy_(src)` (read + write) on a `nbytes` buffer; the best of `reps`."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    del src, dst
    return 2 * nbytes / best


# ------------------------------------------------------------------------------------------- the graph loop
class GreedyStep:
    """One greedy step of `model` at batch 1: `tokens [1, 1]` → forward → argmax → written back into `tokens`.

    chain > 1: that many steps in a row (a draft step of γ tokens). On CUDA `run()` replays a captured graph."""

    def __init__(self, model, cache, tokens: torch.Tensor, chain: int = 1, graphs: bool = True):
        from specdec.fast.graphs import CapturedStep

        self.model, self.cache, self.tokens, self.chain = model, cache, tokens, chain

        def step():
            for _ in range(chain):
                logits = model(self.tokens, cache, last_only=True)
                self.tokens.copy_(logits[:, -1].argmax(-1, keepdim=True))
            return self.tokens

        self.step = step
        self.graph = CapturedStep(step, restore=[cache.lengths, tokens]) if graphs else None

    def run(self) -> torch.Tensor:
        return self.graph.replay() if self.graph is not None else self.step()


def prefill(model, prompt: list[int], num_slots: int, device):
    """(cache, next-token tensor [1, 1], seconds) after an eager forward of the prompt."""
    cache = model.new_cache(1, num_slots)
    ids = torch.tensor([prompt], device=device)
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(ids, cache, last_only=True)
        tokens = logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return cache, tokens, time.perf_counter() - start


def time_steps(step: GreedyStep, count: int, device) -> float:
    """Seconds for `count` steps in a row (host-timed around a device sync)."""
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(count):
            step.run()
    sync(device)
    return time.perf_counter() - start


def kv_bytes_per_token(shape, context: float, element: int) -> float:
    return shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim * context * element


# ------------------------------------------------------------------------------------------- the profile
def role_of(name: str) -> str:
    """A kernel's (or, on CPU, a top-level torch op's) role from its name."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")):
        return "memcpy"
    if "argmax" in low:
        return "argmax"
    if "splitkreduce" in low or "split_reduce" in low:
        return "gemm_reduce"
    if any(p in low for p in ("gemm", "gemv", "linear_kernel", "cutlass", "xmma", "nvjet", "aten::linear",
                              "aten::addmm", "aten::mm", "aten::matmul", "mkldnn::_linear")):
        return "gemm"
    if any(p in low for p in ("attention", "attn", "flash", "fmha", "sdpa", "combine")):
        return "attention"
    if "rms" in low or "norm" in low:
        return "norm"
    if "rope" in low or "aten::roll" in low or "scatter" in low or "index_put" in low:
        return "rope_kv_write"
    if "silu" in low or "gelu" in low:
        return "activation"
    if "embedding" in low or "index_select" in low or "indexselect" in low:
        return "embedding"
    return "other"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    us: float


def step_kernels(run, device) -> tuple[list[Kernel], str]:
    """The kernels of one call of `run` in time order, and what they are ("cuda kernels" or "cpu ops": on CPU
    the top-level torch ops, aten and oneDNN's (the CPU GEMMs may run as `mkldnn::_linear_pointwise`))."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with torch.no_grad(), profile(activities=activities) as prof:
        run()
        sync(device)
    out = []
    for e in prof.events():
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA")
        if cuda and not on_device:
            continue
        if not cuda and (on_device or e.cpu_parent is not None or not e.name.startswith(("aten::", "mkldnn::"))):
            continue
        out.append(Kernel(e.name, float(e.time_range.start), float(e.time_range.end - e.time_range.start)))
    out.sort(key=lambda k: k.start_us)
    return out, "cuda kernels" if cuda else "cpu ops"


def traced_step(step: "GreedyStep", device) -> tuple[list[Kernel], str]:
    """`step_kernels` of one replay; if the trace shows no kernel inside the graph, of one eager step instead."""
    kernels, what = step_kernels(step.run, device)
    if not kernels and step.graph is not None:
        kernels, what = step_kernels(step.step, device)
        what += " (eager step: the graph replay's kernels were not traced)"
    return kernels, what


def attribute(kernels: list[Kernel], n_layers: int, chain: int = 1) -> tuple[list[str], bool]:
    """Each kernel's group: GEMMs become their projection by order (per layer q|k|v, o, gate|up, down, then the LM
    head; `chain` forwards in a row), reduces join the GEMM before them. (groups, whether the GEMM count matched)."""
    roles = [role_of(k.name) for k in kernels]
    per_forward = 4 * n_layers + 1
    matched = sum(r == "gemm" for r in roles) == per_forward * chain
    groups, index, last_gemm = [], 0, "gemm (unattributed)"
    for role in roles:
        if role == "gemm":
            if matched:
                i = index % per_forward
                last_gemm = "lm_head" if i == 4 * n_layers else PROJECTIONS[i % 4]
            index += 1
            groups.append(last_gemm)
        elif role == "gemm_reduce":
            groups.append(last_gemm)
        else:
            groups.append(role)
    return groups, matched


def group_bytes(model, context: int, element: int) -> dict[str, float]:
    """Bytes each group must move per forward (weights for the GEMMs, K/V for attention, activations elsewhere)."""
    s = model.shape
    qkv_out = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim
    gate_up = model.w_gate_up[0].shape[0]
    return {
        "qkv": s.n_layers * qkv_out * s.dim * element,
        "o": s.n_layers * s.dim * s.n_heads * s.head_dim * element,
        "gate_up": s.n_layers * gate_up * s.dim * element,
        "down": s.n_layers * s.dim * s.intermediate_size * element,
        "lm_head": s.vocab_size * s.dim * element,
        "attention": kv_bytes_per_token(s, context, element),
        "norm": (2 * s.n_layers + 1) * 3 * s.dim * element,
        "rope_kv_write": s.n_layers * 2 * qkv_out * element,
        "activation": s.n_layers * 3 * s.intermediate_size * element,
        "argmax": s.vocab_size * 4,
        "embedding": s.dim * element,
    }


ORDER = ("qkv", "o", "gate_up", "down", "lm_head", "gemm (unattributed)", "attention", "norm", "rope_kv_write",
         "activation", "argmax", "embedding", "memcpy", "other")


def profile_table(kernels: list[Kernel], groups: list[str], nbytes: dict[str, float], wall_us: float,
                  chain: int = 1) -> dict:
    """Per group: kernels, µs, share of the step's wall time, bytes, GB/s; and the totals."""
    table = {}
    for kernel, group in zip(kernels, groups):
        row = table.setdefault(group, {"kernels": 0, "us": 0.0})
        row["kernels"] += 1
        row["us"] += kernel.us
    for group, row in table.items():
        row["share"] = round(row["us"] / wall_us, 4) if wall_us > 0 else None
        if group in nbytes:
            row["bytes"] = int(nbytes[group] * chain)
            row["GBps"] = round(row["bytes"] / (row["us"] * 1e3), 1) if row["us"] > 0 else None
        row["us"] = round(row["us"], 2)
    kernel_us = sum(k.us for k in kernels)
    span_us = (kernels[-1].start_us + kernels[-1].us - kernels[0].start_us) if kernels else 0.0
    others: dict[str, float] = {}
    by_name: dict[tuple[str, str], list[float]] = {}
    for kernel, group in zip(kernels, groups):
        if group == "other":
            others[kernel.name[:80]] = others.get(kernel.name[:80], 0.0) + kernel.us
        by_name.setdefault((group, kernel.name[:100]), []).append(kernel.us)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:16]
    return {"groups": {g: table[g] for g in sorted(table, key=lambda g: ORDER.index(g) if g in ORDER else 99)},
            "kernels": len(kernels), "kernel_us": round(kernel_us, 2), "span_us": round(span_us, 2),
            "wall_us": round(wall_us, 2), "gap_us": round(wall_us - kernel_us, 2),
            "inner_gap_us": round(span_us - kernel_us, 2),
            "top_kernels": [{"group": g, "name": n, "count": len(t), "us": round(sum(t), 2),
                             "us_each": round(sum(t) / len(t), 2)} for (g, n), t in top],
            "other_kernels": {k: round(v, 2) for k, v in sorted(others.items(), key=lambda kv: -kv[1])[:8]}}


def print_table(title: str, prof: dict) -> None:
    print(f"\n{title}: {prof['kernels']} {prof.get('what', 'kernels')}, kernel time {prof['kernel_us']:.1f} µs, "
          f"step wall {prof['wall_us']:.1f} µs, gap {prof['gap_us']:.1f} µs", file=sys.stderr)
    print(f"{'group':<22} {'n':>5} {'µs':>10} {'share':>7} {'MB':>10} {'GB/s':>8}", file=sys.stderr)
    for group, row in prof["groups"].items():
        mb = f"{row['bytes'] / 1e6:10.2f}" if "bytes" in row else f"{'':>10}"
        gbps = f"{row['GBps']:8.0f}" if row.get("GBps") is not None else f"{'':>8}"
        share = f"{row['share']:7.1%}" if row.get("share") is not None else f"{'':>7}"
        print(f"{group:<22} {row['kernels']:>5} {row['us']:10.1f} {share} {mb} {gbps}", file=sys.stderr)
    print(f"gaps: wall − kernels {prof['gap_us']:.1f} µs, inside the step's span {prof['inner_gap_us']:.1f} µs",
          file=sys.stderr)
    for row in prof["top_kernels"]:
        print(f"  {row['us']:9.1f} µs {row['count']:4d} × {row['us_each']:7.2f}  {row['group']:<14} {row['name'][:70]}",
              file=sys.stderr)
    for name, us in prof["other_kernels"].items():
        print(f"  other: {us:8.1f} µs  {name}", file=sys.stderr)


# ------------------------------------------------------------------------------------------- rows
def decode_rows(args, name: str, variant: str, model, device, peaks: dict, measured=None) -> list[dict]:
    s = model.shape
    set_variant(model, variant, measured)
    prompt = [(7 * j) % min(1000, s.vocab_size - 5) + 5 for j in range(args.prompt_len)]
    slots = args.prompt_len + args.new + 16
    prefill(model, prompt, slots, device)  # untimed: first-use costs (Triton compiles, cuBLAS plans) stay out
    cache, tokens, prefill_s = prefill(model, prompt, slots, device)
    step = GreedyStep(model, cache, tokens, graphs=device.type == "cuda")
    decode_s = time_steps(step, args.new, device)
    element = model.embed.element_size()
    context = args.prompt_len + args.new / 2
    step_bytes = model.weight_bytes + kv_bytes_per_token(s, context, element)
    tok_s = args.new / decode_s
    row = {"row": "decode", "shape": name, "variant": variant, "prompt_len": args.prompt_len, "new": args.new,
           "tok_per_s": round(tok_s, 2), "tok_per_s_with_prefill": round(args.new / (decode_s + prefill_s), 2),
           "step_us": round(decode_s / args.new * 1e6, 2), "prefill_ms": round(prefill_s * 1e3, 3),
           "weight_gb": round(model.weight_bytes / 1e9, 4), "bytes_per_token_gb": round(step_bytes / 1e9, 4)}
    for label, peak in peaks.items():
        if peak:
            row[f"mbu_{label}"] = round(step_bytes * tok_s / peak, 4)
            row[f"mbu_{label}_with_prefill"] = round(step_bytes * args.new / (decode_s + prefill_s) / peak, 4)
    rows = [row]
    # the profile: one more replay under the profiler, at the context where the timed loop ended
    wall_us = time_steps(step, 8, device) / 8 * 1e6
    kernels, what = traced_step(step, device)
    groups, matched = attribute(kernels, s.n_layers)
    prof = profile_table(kernels, groups, group_bytes(model, int(cache.lengths[0]), element), wall_us)
    rows.append({"row": "profile", "shape": name, "variant": variant, "what": what, "gemms_attributed": matched,
                 "context": int(cache.lengths[0]), **prof})
    print_table(f"{name} / {variant}", {**prof, "what": what})
    del step, cache
    return rows


def pair_models(kind: str, device, dtype):
    from specdec.fast.model import FastLlama

    if kind == "tiny":
        return (FastLlama.random(llama_shape("tiny"), device=device, dtype=dtype, seed=0),
                FastLlama.random(llama_shape("tiny-draft"), device=device, dtype=dtype, seed=1))
    from specdec.bench.presets import random_zoo_pair

    hf_target, hf_draft = random_zoo_pair(device, dtype)
    return FastLlama.from_hf(hf_target), FastLlama.from_hf(hf_draft)


def draft_rows(args, device, dtype) -> list[dict]:
    """c and kernels per drafted token: the pair's target step vs a draft step of γ chained drafter forwards."""
    target, draft = pair_models(args.pair, device, dtype)
    rows, measured = [], {}
    if any(VARIANTS[v][2] for v in args.variant):
        for role, model in (("target", target), ("draft", draft)):
            measured[role], gemm_rows = measure_gemms(model, device)
            rows += [{**row, "pair": args.pair, "role": role} for row in gemm_rows]
    for variant in args.variant:
        result = {"row": "draft", "pair": args.pair, "variant": variant, "gamma": args.gamma}
        steps = {}
        for role, model, chain in (("target", target, 1), ("draft", draft, args.gamma)):
            set_variant(model, variant, measured.get(role))
            s = model.shape
            prompt = [(5 * j) % min(1000, s.vocab_size - 5) + 5 for j in range(args.prompt_len)]
            cache, tokens, _ = prefill(model, prompt, args.prompt_len + 32 * args.gamma + 64, device)
            step = GreedyStep(model, cache, tokens, chain=chain, graphs=device.type == "cuda")
            time_steps(step, 2, device)
            reps = 20
            wall_us = time_steps(step, reps, device) / reps * 1e6
            kernels, what = traced_step(step, device)
            groups, matched = attribute(kernels, s.n_layers, chain)
            prof = profile_table(kernels, groups, group_bytes(model, int(cache.lengths[0]), model.embed.element_size()),
                                 wall_us, chain)
            steps[role] = wall_us
            result[f"{role}_us"] = round(wall_us, 2)
            result[f"{role}_kernel_count"] = prof["kernels"]
            result[f"{role}_kernel_us"] = prof["kernel_us"]
            result[f"{role}_weight_mb"] = round(model.weight_bytes / 1e6, 2)
            print_table(f"pair {args.pair} / {variant} / {role} (chain {chain})", {**prof, "what": what})
            if role == "draft":
                result["draft_groups"] = prof["groups"]
            del step, cache
        result["c"] = round(steps["draft"] / args.gamma / steps["target"], 4)
        result["kernels_per_draft_token"] = round(result["draft_kernel_count"] / args.gamma, 1)
        rows.append(result)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", choices=sorted(SHAPES) + [TP4_SHARD], default=["8b"])
    ap.add_argument("--variant", nargs="+", choices=sorted(VARIANTS), default=["auto"],
                    help="kernel variants to profile in turn (module doc)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--pair", choices=["zoo", "tiny"], default=None, help="also measure c on this pair's shapes")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per draft step (--pair)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--copy-mb", type=int, default=2048, help="buffer size of the copy-bandwidth measurement")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON rows to this file")
    args = ap.parse_args(argv)
    for opt in ("prompt_len", "new", "gamma", "copy_mb"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (use --device cpu for the smoke run)")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    base = {"device": gpu, "torch": torch.__version__}

    def emit(row: dict) -> None:
        print(append_json_line({**base, **row}, args.out), flush=True)

    copy_bps = copy_bandwidth(device, args.copy_mb << 20)
    peaks = {"copy": copy_bps, "datasheet": datasheet_peak(device)}
    emit({"row": "peak", "copy_TBps": round(copy_bps / 1e12, 3),
          "datasheet_TBps": peaks["datasheet"] / 1e12 if peaks["datasheet"] else None})
    if args.pair:  # first: small models, the c figure survives a time-out of the large shapes
        try:
            for row in draft_rows(args, device, dtype):
                emit(row)
        except Exception as exc:  # noqa: BLE001
            emit({"row": "draft", "pair": args.pair, "error": f"{type(exc).__name__}: {exc}"[:300]})
        gc.collect()
    from specdec.fast.model import FastLlama

    for name in args.shape:
        try:
            model = FastLlama.random(shape_for(name), device=device, dtype=dtype)
        except Exception as exc:  # noqa: BLE001 - a shape that does not fit is a row, the others still run
            emit({"row": "decode", "shape": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        measured = None
        if any(VARIANTS[v][2] for v in args.variant):
            try:
                measured, gemm_rows = measure_gemms(model, device)
                for row in gemm_rows:
                    emit({**row, "shape": name})
                emit({"row": "gemm_choice", "shape": name, "triton_shapes": sorted(measured)})
            except Exception as exc:  # noqa: BLE001
                emit({"row": "gemm", "shape": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        for variant in args.variant:
            if VARIANTS[variant][2] and measured is None:
                continue  # (the measurement failed: its row says why)
            try:
                for row in decode_rows(args, name, variant, model, device, peaks, measured):
                    emit(row)
            except Exception as exc:  # noqa: BLE001
                emit({"row": "decode", "shape": name, "variant": variant, "error": f"{type(exc).__name__}: {exc}"[:300]})
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
