"""The engine's transformers backend under continuous batching against the eager transformers loop, on the same
requests: N greedy requests (random prompts, prompt-lookup drafting), all submitted at once.

    python scripts/bench_hf_backend.py --shape opt-1.3b --device cuda --requests 32 --out hf_backend.json
    python scripts/bench_hf_backend.py --shape tiny --device cpu --requests 4 --new 8      # a smoke run

Shapes are random-weight models built on the device (`transformers.*Config`, no download): "opt-1.3b" (OPT-1.3B's
dimensions), "mixtral-small" (a 4-layer Mixtral, 8 experts, top-2), "opt-small" (a 6-layer, 512-wide OPT for CPU runs), "tiny" (a smoke run). Rows: the backend engine
(`EngineConfig(model_impl="transformers")`, eager steps), the loop (`specdec.generate(engine="hf")`), tokens per
second of each, the speed-up, and whether their texts are identical.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import transformers

import specdec
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

SHAPES = {
    "tiny": lambda: transformers.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                           num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=32),
    "opt-small": lambda: transformers.OPTConfig(vocab_size=8192, hidden_size=512, ffn_dim=2048, num_hidden_layers=6,
                                                num_attention_heads=8, max_position_embeddings=1024,
                                                word_embed_proj_dim=512),
    "opt-1.3b": lambda: transformers.OPTConfig(vocab_size=50272, hidden_size=2048, ffn_dim=8192, num_hidden_layers=24,
                                               num_attention_heads=32, max_position_embeddings=2048,
                                               word_embed_proj_dim=2048),
    "mixtral-small": lambda: transformers.MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3584,
                                                        num_hidden_layers=4, num_attention_heads=16,
                                                        num_key_value_heads=8, num_local_experts=8,
                                                        num_experts_per_tok=2, max_position_embeddings=4096),
}


def build(shape: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    config = SHAPES[shape]()
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_engine(model, prompts, new: int, gamma: int, device: str) -> tuple[list[list[int]], float, dict]:
    config = EngineConfig(max_batch_size=len(prompts), max_seq_len=max(map(len, prompts)) + new + 1,
                          num_draft_tokens=gamma, model_impl="transformers", cuda_graphs=False)
    engine = Engine(model, specdec.PromptLookupDrafter(), config)  # (built before the clock: the probe, the cache)
    outputs = {}
    sync(device)
    start = time.perf_counter()
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=new)): i for i, p in enumerate(prompts)}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    sync(device)
    stats = engine.stats
    return [outputs[i] for i in range(len(prompts))], time.perf_counter() - start, {
        "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens}


def run_loop(model, prompts, new: int, gamma: int, device: str) -> tuple[list[list[int]], float]:
    sync(device)
    start = time.perf_counter()
    res = specdec.generate(model, prompts, drafter=specdec.PromptLookupDrafter(), max_new_tokens=new, temperature=0,
                           num_draft_tokens=gamma, eos_token_id=[], engine="hf")
    sync(device)
    return [list(s) for s in res.sequences], time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="opt-1.3b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each arm, interleaved (median kept)")
    parser.add_argument("--out", default=None, help="write the row as JSON here")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda")
                                                           else torch.float32)
    model = build(args.shape, args.device, dtype)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(args.requests)]
    with torch.inference_mode():
        run_engine(model, prompts[:2], 4, args.gamma, args.device)  # warm-up (kernels, allocator)
        times = {"engine": [], "loop": []}
        for _ in range(args.repeats):
            engine_out, seconds, counts = run_engine(model, prompts, args.new, args.gamma, args.device)
            times["engine"].append(seconds)
            loop_out, seconds = run_loop(model, prompts, args.new, args.gamma, args.device)
            times["loop"].append(seconds)
    tokens = sum(len(o) for o in engine_out)
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    row = {"shape": args.shape, "device": args.device, "dtype": str(dtype), "requests": args.requests,
           "prompt_len": args.prompt_len, "new": args.new, "gamma": args.gamma, "tokens": tokens,
           "engine_tok_s": tokens / median["engine"], "loop_tok_s": tokens / median["loop"],
           "speedup": median["loop"] / median["engine"], "seconds": times, "identical": engine_out == loop_out,
           **counts}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
