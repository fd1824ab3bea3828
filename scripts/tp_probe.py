"""Tensor-parallel decoding speed on random weights of real shapes (run under torchrun on a multi-GPU host).

    torchrun --nproc-per-node 4 scripts/tp_probe.py --shape 70b --batch 1 64 --spec-alpha 0.8 --gamma 4 6 \\
        --draft-shape draft-small 1b --all-reduce group one_shot --comm-bench --out $OUT/tp.jsonl   # 70B at TP 4
    torchrun --nproc-per-node 2 scripts/tp_probe.py --shape 8b --batch 1 64 --new 128
    python scripts/tp_probe.py --shape 8b --batch 1 64                        # TP = 1, the same rows
    torchrun --nproc-per-node 2 scripts/tp_probe.py --shape tiny --device cpu --spec-alpha 0.8   # CPU smoke (gloo)

Weights are random, made on each rank's device (no checkpoint: 140 GB of 70B weights would not fit the time):
the sharded matrices with a per-rank seed, the replicated ones (embedding, norms) with one seed for all ranks.
Every run is greedy on the request-level engine (CUDA graphs capture the all-reduces), timed on its second
identical run (capture excluded), and from the step where every request has its first token (prefill excluded).

Rows (JSON lines; rank 0 prints them and appends them to --out):
  "plain"     tok/s and steps/s per batch; the bandwidth bound from the bytes each rank reads per step (its
              weight shard, the embedding excluded, + its KV cache at the mean context) over the GPU's peak
              (H100 3.35 TB/s, H200 4.8 TB/s, vendor datasheets) and the fraction reached (MBU)
  "spec"      a drafter replicated on every rank at TP 1 (no communication), each draft accepted with probability
              α (EngineConfig.synthetic_acceptance: BENCHMARK ONLY; the uniforms are a function of the request
              seed and the position, the same on every rank); tok/s vs Thm 3.8 (analysis.walltime_improvement)
              at the c measured in this run, and vs the cost-aware prediction E/(γc + r)
  "comm"      (--comm-bench) µs per all-reduce of [rows, dim] inside a CUDA graph (50 calls per replay), per kind
  "teardown"  seconds to release the engines and destroy the process group, and whether it was clean
Every "plain"/"spec" row says whether all ranks produced the same tokens ("ranks_agree").
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch

# NVLink multicast stays off on shared hosts (see the device notes): set before anything touches NCCL / symm mem
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

SHAPES = {  # layers, dim, ffn, heads, kv heads, head_dim, vocab, tied
    "70b": (80, 8192, 28672, 64, 8, 128, 128256, False),   # Llama-3-70B
    "8b": (32, 4096, 14336, 32, 8, 128, 128256, False),    # Llama-3-8B
    "3b": (16, 4096, 14336, 32, 8, 128, 32000, False),
    "1b": (16, 2048, 8192, 32, 8, 64, 128256, True),       # Llama-3.2-1B (the usual 70B drafter)
    "draft-small": (2, 1024, 2816, 8, 8, 128, 128256, False),
    "tiny": (2, 64, 128, 4, 4, 16, 256, False),             # CPU smoke runs
    "tiny-draft": (1, 32, 64, 4, 4, 8, 256, False),
}
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}  # vendor datasheet figures


def llama_shape(name: str):
    from specdec.fast.model import LlamaShape

    layers, dim, ffn, heads, kv, hd, vocab, tied = SHAPES[name]
    return LlamaShape(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv, head_dim=hd,
                      intermediate_size=ffn, rope_theta=500000.0, tie_word_embeddings=tied, max_positions=8192)


SHARDED = ("wqkv", "wo", "w_gate_up", "w_down", "bqkv")


def random_model(shape, world: int, device, dtype, all_reduce: str = "group"):
    """TP 1: `FastLlama.random`. TP > 1: this rank's `ShardedFastLlama`, filled on its device (module doc)."""
    from specdec.distributed import ShardedFastLlama
    from specdec.fast.model import FastLlama

    if world == 1:
        return FastLlama.random(shape, device=device, dtype=dtype)
    model = ShardedFastLlama(shape, device=device, dtype=dtype, all_reduce=all_reduce)
    shared = torch.Generator(device=device).manual_seed(0)
    own = torch.Generator(device=device).manual_seed(1 + model.rank)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.split(".")[0] in SHARDED or name == "lm_head" and model.vocab_parallel:
                param.normal_(0.0, 0.02, generator=own)
            else:
                param.normal_(0.0, 0.02, generator=shared)
    return model.eval()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(engine, prompts, params, device) -> dict:
    """Run `prompts` to the end; time only the steps after every request has its first token (prefill)."""
    ids = [engine.add_request(p, params) for p in prompts]
    tokens = {rid: [] for rid in ids}
    sync(device)
    start = time.perf_counter()
    t0, n0, produced = None, 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            produced += len(out.new_token_ids)
        if t0 is None and all(tokens.values()):
            sync(device)
            t0, n0 = time.perf_counter(), produced
    sync(device)
    end = time.perf_counter()
    decoded = produced - n0
    return {"tokens": [tokens[r] for r in ids], "decode_s": end - t0, "decode_tokens": decoded,
            "total_s": end - start, "total_tokens": produced}


def ranks_agree(tokens) -> bool:
    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, tokens)
    return all(g == tokens for g in gathered)


def timed(engine, prompts, params, device) -> tuple[dict, object]:
    """The second of two identical runs (the first captures the graphs) and its engine stats."""
    decode(engine, prompts, params, device)
    engine.stats = type(engine.stats)()
    result = decode(engine, prompts, params, device)
    return result, engine.stats


def comm_bench(kinds, world: int, dim: int, device, dtype, rows_list=(1, 5, 64), calls: int = 50) -> list[dict]:
    """µs per all-reduce of [rows, dim] replayed from a CUDA graph holding `calls` of them."""
    from specdec.distributed.allreduce import make_all_reduce

    out = []
    for kind in kinds:
        try:
            reduce = make_all_reduce(kind, device=device, dtype=dtype)
        except Exception as exc:  # noqa: BLE001 - report and go on: the probe's other rows still count
            out.append({"row": "comm", "all_reduce": kind, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        for rows in rows_list:
            x = torch.zeros(rows, dim, device=device, dtype=dtype)
            try:
                for _ in range(3):
                    reduce(x)
                sync(device)
                if device.type == "cuda":
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for _ in range(calls):
                            reduce(x)
                    run = graph.replay
                else:
                    def run():
                        for _ in range(calls):
                            reduce(x)
                run()
                sync(device)
                start = time.perf_counter()
                for _ in range(10):
                    run()
                sync(device)
                us = (time.perf_counter() - start) / (10 * calls) * 1e6
                out.append({"row": "comm", "all_reduce": kind, "tp": world, "rows": rows, "bytes": x.numel() * x.element_size(),
                            "us_per_call": round(us, 2)})
            except Exception as exc:  # noqa: BLE001
                out.append({"row": "comm", "all_reduce": kind, "rows": rows, "error": f"{type(exc).__name__}: {exc}"[:300]})
        del reduce
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--all-reduce", nargs="+", choices=["group", "one_shot"], default=["group"],
                    help="all-reduce kinds to run in turn (TP > 1): group = NCCL/gloo, one_shot = symmetric memory")
    ap.add_argument("--spec-alpha", type=float, default=None, help="also run speculative with synthetic acceptance α")
    ap.add_argument("--gamma", type=int, nargs="+", default=[4], help="γ values of the speculative runs")
    ap.add_argument("--draft-shape", choices=sorted(SHAPES), nargs="+", default=["1b"],
                    help="drafter shapes (random weights, replicated on every rank at TP 1)")
    ap.add_argument("--spec-batch", type=int, nargs="+", default=[1])
    ap.add_argument("--comm-bench", action="store_true", help="µs per all-reduce in a CUDA graph, per kind")
    ap.add_argument("--comm-only", action="store_true", help="with --comm-bench: only the all-reduce rows")
    ap.add_argument("--out", default=None, help="append the JSON rows to this file (rank 0)")
    args = ap.parse_args(argv)
    for name in ("new", "prompt_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(not 1 <= g <= 16 for g in args.gamma):
        ap.error(f"--gamma values must be in [1, 16], got {args.gamma}")
    if args.spec_alpha is not None and not 0.0 <= args.spec_alpha <= 1.0:
        ap.error(f"--spec-alpha must be in [0, 1], got {args.spec_alpha}")
    if any(b < 1 or b > 256 for b in args.batch + args.spec_batch):
        ap.error("--batch / --spec-batch values must be in [1, 256]")

    from specdec.analysis import walltime_improvement
    from specdec.bench.engine_bench import cost_model
    from specdec.bench.report import append_json_line
    from specdec.distributed import init_tensor_parallel, is_main_rank, shutdown_tensor_parallel
    from specdec.engine import Engine, EngineConfig
    from specdec.fast.model import FastLlama
    from specdec.request import SamplingParams

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = init_tensor_parallel(world, args.device) if world > 1 else torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in HBM_BYTES_PER_S.items() if k in gpu), None)
    env = {k: os.environ[k] for k in ("NCCL_PROTO", "NCCL_ALGO") if k in os.environ}
    leader = is_main_rank()  # read once: after the teardown every process would look like rank 0
    base = {"shape": args.shape, "tp": world, "gpu": gpu, "new_tokens": args.new, "prompt_len": args.prompt_len, **env}

    def emit(row: dict) -> None:
        if leader:
            print(append_json_line({**base, **row}, args.out), flush=True)

    shape = llama_shape(args.shape)
    kinds = args.all_reduce if world > 1 else ["none"]
    started = time.perf_counter()
    if args.comm_only:  # no model: a shape with one layer gives the same `dim` for the messages
        import dataclasses

        shape = dataclasses.replace(shape, n_layers=1)
    model = random_model(shape, world, device, dtype, kinds[0] if world > 1 else "group")
    sync(device)
    emit({"row": "init", "seconds": round(time.perf_counter() - started, 2),
          "weight_gb_per_rank": round(model.weight_bytes / 1e9, 3)})
    drafters = {}
    if args.spec_alpha is not None:  # the same seed on every rank: the same drafter everywhere, at TP 1
        drafters = {name: FastLlama.random(llama_shape(name), device=device, dtype=dtype, seed=1)
                    for name in args.draft_shape}
    s = model.shape  # per rank
    max_gamma = max(args.gamma)
    max_len = args.prompt_len + args.new + max_gamma + 8
    for kind in kinds:
        if world > 1 and model.all_reduce != kind:
            try:
                model.set_all_reduce(kind)
            except Exception as exc:  # noqa: BLE001
                emit({"row": "plain", "all_reduce": kind, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
        if args.comm_bench and world > 1:  # per kind, just before its runs: a kind that fails costs only its rows
            for row in comm_bench([kind], world, shape.dim, device, dtype):
                emit(row)
        if args.comm_only:
            continue
        plain_stats = {}
        runs = [("plain", b, None, 0) for b in args.batch]
        runs += [("spec", b, name, g) for b in args.spec_batch for name in drafters for g in args.gamma]
        for row, batch, draft_name, gamma in runs:
            draft = drafters.get(draft_name)
            prompts = [[(7 * i + 3 * j) % min(1000, s.vocab_size - 5) + 5 for j in range(args.prompt_len)]
                       for i in range(batch)]
            config = EngineConfig(max_batch_size=batch, max_seq_len=max_len, num_draft_tokens=gamma,
                                  max_draft_tokens=max_gamma,
                                  synthetic_acceptance=args.spec_alpha if draft is not None else None)
            params = SamplingParams(temperature=0, max_new_tokens=args.new, seed=1234)  # one seed on every rank
            try:
                engine = Engine(model, draft, config)
                result, stats = timed(engine, prompts, params, device)
            except Exception as exc:  # noqa: BLE001
                emit({"row": row, "all_reduce": kind, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            finally:
                engine = None
                gc.collect()
            tok_s = result["decode_tokens"] / result["decode_s"]
            out = {"row": row, "all_reduce": kind, "batch": batch, "tok_per_s": round(tok_s, 1),
                   "tok_per_s_with_prefill": round(result["total_tokens"] / result["total_s"], 1),
                   "ranks_agree": ranks_agree(result["tokens"])}
            if row == "plain":
                plain_stats[batch] = (stats, tok_s)
                steps_per_s = tok_s / batch
                kv_bytes = (batch * s.n_layers * 2 * s.n_kv_heads * s.head_dim * (args.prompt_len + args.new / 2)
                            * torch.empty((), dtype=dtype).element_size())
                step_bytes = model.weight_bytes + kv_bytes
                out.update({"steps_per_s": round(steps_per_s, 1), "bytes_per_step_gb": round(step_bytes / 1e9, 3),
                            "bound_steps_per_s": round(peak / step_bytes, 1) if peak else None,
                            "mbu": round(steps_per_s * step_bytes / peak, 3) if peak else None})
            else:
                alpha, g = args.spec_alpha, gamma
                out.update({"alpha": alpha, "gamma": g, "draft_shape": draft_name,
                            "alpha_measured": stats.alpha, "tau": stats.mean_accepted_length})
                if batch in plain_stats:
                    plain, plain_tok_s = plain_stats[batch]
                    costs = cost_model(plain, stats)
                    c = costs.get("c")
                    out.update({k: round(v, 4) for k, v in costs.items()})
                    out["plain_tok_per_s"] = round(plain_tok_s, 1)
                    out["speedup"] = round(tok_s / plain_tok_s, 3)
                    if c is not None:
                        thm = walltime_improvement(alpha, g, c)
                        out.update({"thm38_speedup": round(thm, 3), "thm38_tok_per_s": round(plain_tok_s * thm, 1),
                                    "measured_vs_thm38": round(tok_s / plain_tok_s / thm, 3)})
            emit(out)
    start = time.perf_counter()
    clean = shutdown_tensor_parallel(model, *drafters.values())
    emit({"row": "teardown", "seconds": round(time.perf_counter() - start, 2), "clean": clean})


if __name__ == "__main__":
    main()
