"""Time one-token forwards (KV cache, batch 1, ~200 tokens of context, fp32) of random-weight Llama shapes on CPU.

Used to choose the demo pair: the drafter's cost ratio c = t_draft / t_target decides the speedup on CPU,
where per-forward Python overhead is large.  Run: .venv/bin/python scripts/zoo_cpu_timing.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make(dim: int, layers: int, vocab: int, heads: int, kv_heads: int | None = None, ff_mult: float = 8 / 3):
    ff = int(ff_mult * dim / 64 + 0.999) * 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ff, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads or heads, tie_word_embeddings=True,
                      max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    return model


@torch.inference_mode()
def time_forward(model, context: int = 200, new: int = 1, reps: int = 40) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, context))
    out = model(ids, use_cache=True)
    cache = out.past_key_values
    step = torch.randint(0, model.config.vocab_size, (1, new))
    times = []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        model(step, past_key_values=cache, use_cache=True)
        dt = time.perf_counter() - t0
        cache.crop(-new)  # 5.24 takes "tokens to remove"
        if i >= 5:
            times.append(dt)
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    torch.manual_seed(0)
    shapes = [
        # name, dim, layers, heads, kv_heads, ff_mult
        ("t512x8", 512, 8, 8, None, 8 / 3),
        ("t512x6", 512, 6, 8, None, 8 / 3),
        ("t384x12", 384, 12, 6, None, 8 / 3),
        ("t384x10", 384, 10, 6, None, 8 / 3),
        ("t448x10", 448, 10, 7, None, 8 / 3),
        ("t320x12", 320, 12, 5, None, 8 / 3),
        ("t640x8", 640, 8, 10, None, 8 / 3),
        ("d256x2", 256, 2, 4, None, 8 / 3),
        ("d192x1", 192, 1, 3, None, 8 / 3),
        ("d128x1", 128, 1, 2, None, 8 / 3),
        ("d128x2", 128, 2, 2, None, 8 / 3),
    ]
    rows = []
    for name, dim, layers, heads, kv, ff in shapes:
        m = make(dim, layers, args.vocab, heads, kv, ff)
        n = sum(p.numel() for p in m.parameters())
        t1 = time_forward(m, new=1)
        t5 = time_forward(m, new=5)
        rows.append({"name": name, "params_M": round(n / 1e6, 2), "fp16_MiB": round(2 * n / 2**20, 1),
                     "t1_ms": round(1e3 * t1, 2), "t5_ms": round(1e3 * t5, 2)})
        print(json.dumps(rows[-1]), flush=True)
