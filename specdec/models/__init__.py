"""Targets: adapters giving one small interface over autoregressive models.

A target owns its KV cache and offers `begin(prompts, max_new_tokens) -> TokenBuffer` (prefill),
`forward(tokens [B, k], valid [B, k]) -> logits [B, k, V]` (append and score k positions in one pass),
`crop(lengths)` (roll back to absolute per-row lengths) and `select_rows(index)`.
"""

from specdec.models.hf import HFCausalLM
from specdec.models.seq2seq import HFSeq2SeqLM

__all__ = ["HFCausalLM", "HFSeq2SeqLM"]
