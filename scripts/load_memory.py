"""Resident memory of `specdec.load(target, draft=...)` on the CPU, phase by phase, against the weights' bytes.

    python scripts/load_memory.py --target SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/load_memory.py --target DEST/qwen2.5-coder-1.5b-instruct --draft DEST/qwen2.5-coder-0.5b-instruct

Prints one JSON line: RSS (anonymous and file-backed, from /proc/self/status) after the libraries are imported, after
the load, and after one request; the bytes of the weights (the distinct storages of both models' parameters and the
engines' FastLlamas, `fast.held_once.held_bytes`, plus a GGUF's quantized blocks, `quant_gb`, counted once), of the
CPU GEMMs' packed copies and of the KV caches; and `model_ratio` = (RSS after the request − RSS after the imports −
KV bytes) / weight bytes, the quantity issue 36 bounds by 1.2 (`model_ratio_anon`: the same of RssAnon, without the
libraries' code pages first read after the imports). `--cpu-linear` picks `fast.kernels.cpu_linear.MODE` (packed
copies or none).
"""

from __future__ import annotations

import argparse
import json
import time


def rss() -> dict:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in GB."""
    with open("/proc/self/status", encoding="utf-8") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return {k: round(int(fields[k].split()[0]) / 1e6, 3) for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}


def _tensor_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in tensors}.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--max-batch-size", type=int, default=1)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--cpu-linear", default=None, help="fast.kernels.cpu_linear.MODE (default: its own)")
    args = parser.parse_args(argv)

    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (the baseline holds the libraries)

    if importlib.util.find_spec("gguf") is not None:  # (what a GGUF load imports, also before the baseline; the
        import gguf  # noqa: F401  model class's own module still loads lazily: docs/QWEN_PAIR.md)
        import transformers.modeling_gguf_pytorch_utils  # noqa: F401

    import specdec
    from specdec.fast.held_once import held_bytes
    from specdec.fast.held_quantized import QuantizedLinear
    from specdec.fast.quant.weight import quantized_weights
    from specdec.fast.kernels import cpu_linear

    if args.cpu_linear is not None:
        cpu_linear.MODE = args.cpu_linear
    row = {"target": args.target, "draft": args.draft, "cpu_linear": cpu_linear.MODE, "imports": rss()}
    start = time.perf_counter()
    llm = specdec.load(args.target, draft=args.draft, device="cpu", dtype="float32", max_batch_size=args.max_batch_size,
                       max_seq_len=args.max_seq_len, num_draft_tokens=args.num_draft_tokens if args.draft else 4)
    row["load_s"] = round(time.perf_counter() - start, 1)
    row["loaded"] = rss()
    start = time.perf_counter()
    out = llm.generate(args.prompt, max_new_tokens=args.max_new_tokens, temperature=0.0)
    row["request_s"] = round(time.perf_counter() - start, 1)
    row["after_request"] = rss()
    row["text"] = out.text
    engine = llm.runner(llm.num_draft_tokens)
    models = [m for m in (llm.target, getattr(llm.drafter, "model", None), getattr(engine, "model", None),
                          getattr(getattr(engine, "drafter", None), "model", None)) if isinstance(m, torch.nn.Module)]
    quant = {id(q): q for m in models for q in quantized_weights(m)}  # a GGUF's blocks (the engine's FastLlama;
    quant.update({id(m.quant): m.quant for model in models for m in model.modules()  # the transformers model's
                  if isinstance(m, QuantizedLinear)})  # layers read the same ones once released)
    row["quant_gb"] = round(sum(q.nbytes for q in quant.values()) / 1e9, 3)
    row["weight_gb"] = round(held_bytes(*models) / 1e9 + row["quant_gb"], 3)
    row["packed_gb"] = round(cpu_linear.packed_bytes() / 1e9, 3) if hasattr(cpu_linear, "packed_bytes") else None
    caches = [c for c in (getattr(engine, "cache", None), getattr(getattr(engine, "drafter", None), "cache", None))
              if c is not None]
    kv = []
    for cache in caches:  # (a tensor per cache or a list per layer, whichever layout the pool has)
        for held in (getattr(cache, "keys", None), getattr(cache, "values", None)):
            kv += [held] if torch.is_tensor(held) else [t for t in held or () if torch.is_tensor(t)]
    row["kv_gb"] = round(_tensor_bytes(kv) / 1e9, 3)
    model_gb = row["after_request"]["VmRSS"] - row["imports"]["VmRSS"] - row["kv_gb"]
    row["model_ratio"] = round(model_gb / row["weight_gb"], 3)
    anon_gb = row["after_request"]["RssAnon"] - row["imports"]["RssAnon"] - row["kv_gb"]  # (without the libraries'
    row["model_ratio_anon"] = round(anon_gb / row["weight_gb"], 3)  # code pages read after the imports)
    llm.close()
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
