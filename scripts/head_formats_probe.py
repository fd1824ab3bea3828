"""Engine throughput with each published head kind on random weights of a real shape, at a chosen acceptance.

Random heads accept nothing, so drafts are accepted with probability --alpha (`EngineConfig.synthetic_acceptance`,
BENCHMARK ONLY: the output is then not the target's law). What this measures is each head's cost inside the
engine's step (CUDA graphs): plain decoding, specdec's feature head, EAGLE-1, EAGLE-3 (three kept target layers,
a 32K draft vocabulary mapped into the target's) and Medusa (4 heads), all on the same target.

    python scripts/head_formats_probe.py --shape 8b --batch 1 32 --gamma 3 --alpha 0.7 > $OUT/heads.jsonl
    python scripts/head_formats_probe.py --shape tiny --device cpu --new 8       # a smoke run on the CPU
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {"8b": (32, 4096, 14336, 32, 8, 128256, 32000), "tiny": (8, 64, 128, 4, 2, 512, 200)}


def _randomize(module: torch.nn.Module, seed: int) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            gen = torch.Generator(device=p.device).manual_seed(seed)
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def heads(shape, layers: int, draft_vocab: int, device, dtype) -> dict:
    from specdec.fast.eagle import EagleConfig, EagleHead
    from specdec.fast.head import FeatureHead, HeadConfig
    from specdec.fast.medusa import MedusaConfig, MedusaHeads

    common = dict(vocab_size=shape.vocab_size, dim=shape.dim, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads,
                  head_dim=shape.head_dim, intermediate_size=shape.intermediate_size, rope_theta=shape.rope_theta)
    out = {"feature-head": FeatureHead(HeadConfig.for_target(shape), device=device, dtype=dtype),
           "eagle": EagleHead(EagleConfig(version=1, fc_bias=True, **common), device=device, dtype=dtype),
           "eagle3": EagleHead(EagleConfig(version=3, draft_vocab_size=draft_vocab,
                                           feature_layers=(2, layers // 2, layers - 3), **common),
                               device=device, dtype=dtype),
           "medusa": MedusaHeads(MedusaConfig(num_heads=4, num_layers=1, dim=shape.dim, vocab_size=shape.vocab_size),
                                 device=device, dtype=dtype)}
    for i, head in enumerate(out.values()):
        _randomize(head, i)
    ids = torch.randperm(shape.vocab_size, generator=torch.Generator().manual_seed(0))[:draft_vocab].sort().values
    out["eagle3"].set_vocab_map(ids)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.7)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()

    from specdec.engine import Engine, EngineConfig
    from specdec.fast.model import FastLlama, LlamaShape
    from specdec.request import SamplingParams

    layers, dim, ffn, nh, kv, vocab, draft_vocab = SHAPES[args.shape]
    shape = LlamaShape(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=nh, n_kv_heads=kv, head_dim=dim // nh,
                       intermediate_size=ffn, rope_theta=500000.0)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = FastLlama.random(shape, device=device, dtype=dtype)
    drafters = {"plain": None, **heads(shape, layers, draft_vocab, device, dtype)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for batch in args.batch:
        prompts = [[(7 * i + 3 * j) % 1000 + 5 for j in range(args.prompt_len)] for i in range(batch)]
        for kind, head in drafters.items():
            config = EngineConfig(max_batch_size=batch, max_seq_len=args.prompt_len + args.new + 8,
                                  num_draft_tokens=args.gamma if head is not None else 0,
                                  max_draft_tokens=max(args.gamma, 1),
                                  synthetic_acceptance=args.alpha if head is not None else None)
            engine = Engine(target, head, config)
            seconds = []
            for _ in range(2):  # the first run captures the step shapes
                for prompt in prompts:
                    engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=args.new))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start, tokens = time.perf_counter(), 0
                while engine.has_unfinished():
                    tokens += sum(len(out.new_token_ids) for out in engine.step())
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            stats = engine.stats
            print(json.dumps({"shape": args.shape, "gpu": name, "batch": batch, "drafter": kind, "gamma": args.gamma,
                              "synthetic_alpha": args.alpha if head is not None else None, "tokens": tokens,
                              "tok_per_s": round(tokens / seconds[-1], 1), "first_run_s": round(seconds[0], 2),
                              "tokens_per_step": round(stats.mean_accepted_length or 1.0, 3)}), flush=True)
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
