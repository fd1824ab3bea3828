"""Tensor-parallel decoding speed on random weights of a real shape (run under torchrun on a GPU host).

    torchrun --nproc-per-node 2 scripts/tp_probe.py --shape 8b --batch 1 64 --new 128
    python scripts/tp_probe.py --shape 8b --batch 1 64                     # TP = 1, the same numbers

Prints one JSON line per batch from rank 0: plain greedy tok/s (second of two identical runs, so CUDA-graph
capture is excluded), the bandwidth bound of the GPUs used (weight bytes per rank / HBM bandwidth), and how long
the process-group teardown took. Weights are random (no checkpoint on disk): `FastLlama.random` on one GPU, a
`ShardedFastLlama` filled the same way on each rank.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

SHAPES = {  # (layers, dim, ffn, heads, kv heads, vocab)
    "8b": (32, 4096, 14336, 32, 8, 128256),
    "3b": (16, 4096, 14336, 32, 8, 32000),
    "70b": (80, 8192, 28672, 64, 8, 128256),
}
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}  # vendor datasheet figures


def _model(shape, world: int, device):
    from specdec.distributed import ShardedFastLlama
    from specdec.fast.model import FastLlama

    if world == 1:
        return FastLlama.random(shape, device=device, dtype=torch.bfloat16)
    model = ShardedFastLlama(shape, device=device, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(1 + model.rank)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()

    import specdec
    from specdec.distributed import init_tensor_parallel, is_main_rank, shutdown_tensor_parallel
    from specdec.fast.model import LlamaShape

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = init_tensor_parallel(world, "cuda") if world > 1 else torch.device("cuda")
    layers, dim, ffn, heads, kv, vocab = SHAPES[args.shape]
    shape = LlamaShape(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                       head_dim=dim // heads, intermediate_size=ffn, rope_theta=500000.0)
    model = _model(shape, world, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    name = torch.cuda.get_device_name(device)
    bandwidth = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    for batch in args.batch:
        prompts = [[(7 * i + 3 * j) % 1000 + 5 for j in range(args.prompt_len)] for i in range(batch)]
        seconds = []
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = specdec.generate(model, prompts, None, max_new_tokens=args.new, temperature=0.0, engine="fast",
                                   eos_token_id=[], seed=0)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        tokens = sum(len(s) for s in out.sequences)
        steps_per_s = args.new / seconds[-1]
        if is_main_rank():
            print(json.dumps({
                "shape": args.shape, "tp": world, "gpu": name, "batch": batch, "new_tokens": args.new,
                "tok_per_s": round(tokens / seconds[-1], 1), "steps_per_s": round(steps_per_s, 1),
                "first_run_s": round(seconds[0], 2), "weight_gb_per_rank": round(weight_bytes / 1e9, 2),
                "bandwidth_bound_steps_per_s": round(bandwidth / weight_bytes, 1) if bandwidth else None,
                "fraction_of_bound": round(steps_per_s * weight_bytes / bandwidth, 3) if bandwidth else None,
            }), flush=True)
    start = time.perf_counter()
    clean = shutdown_tensor_parallel(model)
    if is_main_rank():
        print(json.dumps({"teardown_s": round(time.perf_counter() - start, 2), "clean": clean}), flush=True)


if __name__ == "__main__":
    main()
