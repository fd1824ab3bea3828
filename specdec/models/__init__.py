"""Targets: adapters giving one small interface over autoregressive models.

A target owns its KV cache and offers `begin(prompts, max_new_tokens) -> TokenBuffer` (prefill),
`forward(tokens [B, k], valid [B, k]) -> logits [B, k, V]` (append and score k positions in one pass),
`crop(lengths)` (roll back to absolute per-row lengths) and `select_rows(index)` — written down as the
`Target` protocol (`protocol.py`, with `as_target`: a transformers model → its adapter).
"""

from specdec.models.hf import HFCausalLM
from specdec.models.protocol import Target, as_target
from specdec.models.seq2seq import HFSeq2SeqLM

__all__ = ["HFCausalLM", "HFSeq2SeqLM", "Target", "as_target"]
