"""The GPU fast path: a compact decoder with a static per-row KV cache and CUDA-graph decode steps.

Terms:
  FastLlama    plain-PyTorch decoder (fused q|k|v and gate|up weights) loaded from a transformers model of
               `families.FAMILIES` (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, SmolLM3, Granite, GPT-NeoX,
               GPT-2, StarCoder2);
               what the families differ in is `LlamaShape.arch` (`fast/families.py`)
  KVCache      `[B, H_kv, S, D]` per layer; row b's token at position t lives in slot t (no holes), so
               rollback is a pointer move: `crop(lengths)` only sets `lengths`
  FastTarget   the target interface of `specdec.models.hf.HFCausalLM` (begin / forward / crop / select_rows)
  FastDrafter  the model drafter (`specdec.drafters.model.ModelDrafter`) over a FastLlama: its γ
               single-token steps and draws one captured graph (`fast.target.FastLoopState`)

Use them with the ordinary loop: `specdec.generate(FastTarget(m), prompts, drafter=FastDrafter(d))`.
Both set `drop_finished_rows = False`: shapes stay fixed for a whole request, so graphs stay valid.
Encoder-decoder (T5): `FastSeq2SeqTarget` / `FastSeq2SeqDrafter` (`fast/seq2seq.py`, model in `fast/t5.py`).
"""

from specdec.fast.model import FastLlama, KVCache, LlamaShape
from specdec.fast.target import FastDrafter, FastTarget, load_fast_llama

from specdec.fast.seq2seq import FastSeq2SeqDrafter, FastSeq2SeqTarget, covers_seq2seq

__all__ = ["FastLlama", "KVCache", "LlamaShape", "FastTarget", "FastDrafter", "load_fast_llama",
           "FastSeq2SeqTarget", "FastSeq2SeqDrafter", "covers_seq2seq"]
