"""Plain greedy decoding on the engine vs transformers' own generate, for the families the engine took over.

    python scripts/bench_families.py --out families.jsonl            # GPU: real shapes, random weights, bf16
    python scripts/bench_families.py --tiny --out tiny.jsonl         # CPU: the same logic on tiny configs

Per family: a transformers model built from a config of the real model's shape (random weights, made on the
device), a `--prompt`-token prompt, `--new` new tokens at batch 1 (and `--batch` rows): transformers'
`generate(do_sample=False)` (dynamic cache), then `specdec.generate(engine="fast")` (CUDA graphs, after one warm-up
call that captures them), tokens/s of each, and whether the greedy texts agree (bf16: they may part at a tie).
One JSON line per (family, batch) on stdout and in `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import transformers as T

import specdec
from specdec.analysis import timed

# The real models' shapes (random weights): what a user runs, at the sizes that fit one GPU quickly.
REAL = {
    "gemma2-2b": (T.Gemma2ForCausalLM, T.Gemma2Config, dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192)),
    "gemma3-1b": (T.Gemma3ForCausalLM, T.Gemma3TextConfig, dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        max_position_embeddings=32768)),
    "phi3-mini": (T.Phi3ForCausalLM, T.Phi3Config, dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, sliding_window=2047)),
    "pythia-1b": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig, dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=8,
        rotary_pct=0.25, max_position_embeddings=2048)),
    "gpt2": (T.GPT2LMHeadModel, T.GPT2Config, dict()),
}
TINY = {
    "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config, dict(head_dim=16, sliding_window=8)),
    "gemma3": (T.Gemma3ForCausalLM, T.Gemma3TextConfig, dict(head_dim=16, sliding_window=8)),
    "phi3": (T.Phi3ForCausalLM, T.Phi3Config, dict(sliding_window=8)),
    "gpt-neox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig, dict(rotary_pct=0.5)),
}
TINY_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512)


def build(name: str, tiny: bool, device: str, dtype: torch.dtype):
    model_cls, config_cls, kw = (TINY if tiny else REAL)[name]
    kw = {**(TINY_COMMON if tiny else {}), **kw, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if config_cls is T.GPT2Config:
        kw = {k: v for k, v in kw.items() if k not in TINY_COMMON}
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config_cls(**kw)).to(dtype).eval()
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny configs (CPU logic check)")
    parser.add_argument("--families", nargs="*", help="a subset of the families (default: all)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--new", type=int, default=128, help="new tokens per row")
    parser.add_argument("--batch", type=int, nargs="*", default=[1], help="rows per call")
    parser.add_argument("--out", help="append the JSON lines to this file")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    names = args.families or list(TINY if args.tiny else REAL)
    rows = []
    for name in names:
        model = build(name, args.tiny, device, dtype)
        vocab = model.config.vocab_size
        for batch in args.batch:
            gen = torch.Generator().manual_seed(batch)
            prompts = torch.randint(3, vocab, (batch, args.prompt), generator=gen)
            ids = prompts.to(device)
            hf_s, hf_out = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                        max_new_tokens=args.new, min_new_tokens=args.new,
                                                        pad_token_id=0), torch.device(device))
            kw = dict(max_new_tokens=args.new, temperature=0, eos_token_id=[], engine="fast")
            specdec.generate(model, prompts.tolist(), **kw)  # warm-up: builds the engine, captures the graphs
            ours_s, ours = timed(lambda: specdec.generate(model, prompts.tolist(), **kw), torch.device(device))
            ref = hf_out[:, args.prompt:].tolist()
            row = dict(family=name, device=torch.cuda.get_device_name() if cuda else "cpu", dtype=str(dtype),
                       batch=batch, prompt=args.prompt, new=args.new,
                       transformers_tok_s=round(batch * args.new / hf_s, 1),
                       engine_tok_s=round(batch * args.new / ours_s, 1), speedup=round(hf_s / ours_s, 2),
                       rows_identical=sum(a == b for a, b in zip(ours.sequences, ref)))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
