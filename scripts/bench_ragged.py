"""One ragged forward (`fast.ragged.forward_ragged`: decode / verify rows and a prefill chunk in one pass over the
paged pool) against today's separate passes (the chunk's prefill forward, then the rows' decode forward, each on a
static cache), interleaved A/B in one run, random weights.

    PYTHONPATH=$PWD python scripts/bench_ragged.py                       # CPU, fp32, a SmolLM2-135M-shaped model
    python scripts/bench_ragged.py --device cuda --shape llama-8b --rows 64 --chunk 512 --context 1024 \\
        --out ragged.json                                                 # one GPU, bf16: the 8B shape

Arms: "ragged" (one forward_ragged, eager, the Triton varlen attention on CUDA); "separate" (prefill forward with
kernels="reference", as the engine prefills, then the decode forward with the model's kernels — on CUDA the fused
layer — both eager); "separate-paged" (the same two passes over the pool the ragged pass uses, through
`PagedKVCache` views: the eager layers, as kv_layout="paged" runs them); on CUDA also "separate+graph" (the decode forward replayed as a CUDA graph, as the engine's
step runs it; the prefill eager). Times are wall milliseconds per step (host launch included), median and range over
--repeats; the batch's host build (`RaggedBatch.from_rows`) is timed apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdec.fast import FastLlama, LlamaShape
from specdec.fast.cache import PagedKVCache
from specdec.fast.ragged import RaggedBatch, RaggedRow, forward_ragged

SHAPES = {
    "smol": dict(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                 intermediate_size=1536, rope_theta=100000.0, tie_word_embeddings=True),
    "llama-8b": dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     intermediate_size=14336, rope_theta=500000.0),
    "tiny": dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=128),
}
BLOCK = 16


def build(args):
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = FastLlama.random(LlamaShape(**SHAPES[args.shape]), device=device, dtype=dtype)
    s, k = model.shape, 1 + args.gamma
    gen = torch.Generator().manual_seed(0)
    decode = torch.randint(3, s.vocab_size, (args.rows, k), generator=gen)
    chunk = torch.randint(3, s.vocab_size, (1, args.chunk), generator=gen)
    # the ragged pass's pool: every row's blocks, in order (where they sit does not change the work)
    # (+1 position: a PagedKVCache's last slot is its junk slot, for the separate passes over the same pool)
    need = [-(-(args.context + k + 1) // BLOCK)] * args.rows + [-(-(args.prefill_start + args.chunk + 1) // BLOCK)]
    size = (sum(need) + 1, BLOCK, s.n_kv_heads, s.head_dim)
    pools = [[torch.zeros(size, device=device, dtype=dtype) for _ in range(s.n_layers)] for _ in range(2)]
    paged = PagedKVCache(*pools, torch.zeros(1, dtype=torch.long, device=device),
                         torch.zeros(1, 1, dtype=torch.int32, device=device))
    first, rows = 1, []
    for b, n in enumerate(need):
        blocks = list(range(first, first + n))
        first += n
        if b < args.rows:
            rows.append(RaggedRow(decode[b].tolist(), args.context, blocks, k))
        else:
            rows.append(RaggedRow(chunk[0].tolist(), args.prefill_start, blocks, 1))
    start = time.perf_counter()
    batch = RaggedBatch.from_rows(rows, block_size=BLOCK, device=device)
    build_ms = (time.perf_counter() - start) * 1e3
    table = batch.block_table
    lengths = torch.tensor([args.context] * args.rows + [args.prefill_start], device=device)
    paged_views = (PagedKVCache(*pools, lengths[:-1], table[:-1, : need[0]].contiguous()),
                   PagedKVCache(*pools, lengths[-1:], table[-1:, : need[-1]].contiguous()))
    decode_cache = model.new_cache(args.rows, args.context + k)
    prefill_cache = model.new_cache(1, args.prefill_start + args.chunk)
    decode_cache.lengths.fill_(args.context)
    prefill_cache.lengths.fill_(args.prefill_start)
    return model, batch, paged, decode.to(device), chunk.to(device), decode_cache, prefill_cache, paged_views, build_ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smol")
    parser.add_argument("--rows", type=int, default=8, help="decode / verify rows")
    parser.add_argument("--gamma", type=int, default=0, help="drafts per row: each row brings 1 + γ tokens")
    parser.add_argument("--chunk", type=int, default=64, help="the prefill chunk's tokens")
    parser.add_argument("--prefill-start", type=int, default=0, help="positions the prefilling row already has")
    parser.add_argument("--context", type=int, default=256, help="positions each decode row already has")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, batch, paged, decode, chunk, decode_cache, prefill_cache, paged_views, build_ms = build(args)
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def ragged():
        return forward_ragged(model, batch, paged)

    def prefill():
        return model(chunk, prefill_cache, last_only=True, advance=False, kernels="reference")

    def step():
        return model(decode, decode_cache, advance=False)

    def separate_paged():  # the same two passes over the pool the ragged pass reads (kv_layout="paged")
        model(chunk, paged_views[1], last_only=True, advance=False, kernels="reference")
        return model(decode, paged_views[0], advance=False)

    arms = {"ragged": ragged, "separate": lambda: (prefill(), step()), "separate-paged": separate_paged}
    if cuda:
        from specdec.fast.graphs import CapturedStep

        graph = CapturedStep(step)
        arms["separate+graph"] = lambda: (prefill(), graph.replay())
    times = {name: [] for name in arms}
    with torch.inference_mode():
        for fn in arms.values():  # warm-up: compiles, packed weights, RoPE tables
            fn(), fn()
        for _ in range(args.repeats):
            for name, fn in arms.items():  # interleaved: the arms share the machine's noise
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
    result = dict(args=vars(args), device=torch.cuda.get_device_name() if cuda else "cpu",
                  threads=torch.get_num_threads(), tokens=batch.num_tokens, batch_build_ms=round(build_ms, 3),
                  arms={name: dict(median_ms=round(statistics.median(t), 3), min_ms=round(min(t), 3),
                                   max_ms=round(max(t), 3)) for name, t in times.items()})
    base = result["arms"]["ragged"]["median_ms"]
    for name, arm in result["arms"].items():
        arm["vs_ragged"] = round(arm["median_ms"] / base, 3)
    print(f"{args.shape} on {result['device']}: {args.rows} rows × {1 + args.gamma} tokens at {args.context} + one "
          f"{args.chunk}-token chunk at {args.prefill_start} ({batch.num_tokens} tokens); batch build "
          f"{build_ms:.2f} ms")
    for name, arm in result["arms"].items():
        print(f"  {name:15s} {arm['median_ms']:9.2f} ms  [{arm['min_ms']:.2f}, {arm['max_ms']:.2f}]  "
              f"{arm['vs_ragged']:.3f}x ragged")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
