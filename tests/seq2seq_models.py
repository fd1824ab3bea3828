"""Tiny random T5 and BART models for the encoder-decoder tests (no downloads)."""

from __future__ import annotations

import torch
import transformers


def _scramble(model, std: float, position_std: float, embedding_std: float | None = None, head_std: float | None = None):
    # Default inits make tiny random models repeat one token forever; larger weights (and position
    # tables) give varied outputs whose greedy path depends on every position.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                continue
            scale = std
            if "relative_attention_bias" in name or "embed_positions" in name:
                scale = position_std
            elif name == "shared.weight" and embedding_std is not None:
                scale = embedding_std
            elif name.startswith("lm_head") and head_std is not None:
                scale = head_std
            param.normal_(0, scale)
    return model.eval()


def make_t5(seed: int = 0, layers: int = 2, d_model: int = 32, *, vocab: int, **kw):
    torch.manual_seed(seed)
    cfg = transformers.T5Config(
        vocab_size=vocab, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=layers, num_decoder_layers=layers,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **kw,
    )
    return _scramble(transformers.T5ForConditionalGeneration(cfg), 0.5, 3.0, embedding_std=2.0)


def make_bart(seed: int = 0, layers: int = 2, d_model: int = 32, *, vocab: int, max_positions: int = 128, **kw):
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(
        vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_position_embeddings=max_positions, forced_eos_token_id=None, tie_word_embeddings=False, **kw,
    )
    return _scramble(transformers.BartForConditionalGeneration(cfg), 0.1, 0.3, head_std=1.0)


def teacher_forced_logits(model, prompt: list[int], decoder_text: list[int]) -> torch.Tensor:
    """Logits `[len(decoder_text), V]` of the whole model run on one encoder input (no cache, no padding)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoder_text])).logits[0]
