"""The zoo's models: build `transformers` models from a `ModelShape`, count them, save them like user checkpoints.

`build_model` makes a LlamaForCausalLM (SDPA attention, scaled residual init) or a T5ForConditionalGeneration (a
unit-logit head); `flops_per_token` / `peak_flops` give training MFU; `save_model` writes safetensors + tokenizer.
The zoo's special ids are fixed here (`PAD_ID`, `BOS_ID`, `EOS_ID`: `specdec.zoo.tokenizer.SPECIAL_TOKENS`).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import torch

from specdec.zoo.presets import ModelShape

__all__ = ["PAD_ID", "BOS_ID", "EOS_ID", "PEAK_BF16_FLOPS", "build_model", "count_params", "flops_per_token",
           "peak_flops", "resolve_device", "save_model", "scale_residual_init"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # fixed by specdec.zoo.tokenizer.SPECIAL_TOKENS

# Dense bf16 peak of known accelerators, for MFU (vendor datasheet numbers).
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def build_model(shape: ModelShape, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """A freshly initialized HF model: LlamaForCausalLM (SDPA attention) or T5ForConditionalGeneration."""
    torch.manual_seed(seed)
    if shape.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        if shape.dim % shape.heads:
            raise ValueError(f"dim {shape.dim} is not divisible by heads {shape.heads}")
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=shape.dim,
            intermediate_size=shape.ff,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads or shape.heads,
            max_position_embeddings=shape.max_len,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            initializer_range=0.02,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            attn_implementation="sdpa",
        )
        model = scale_residual_init(LlamaForCausalLM(config))
    elif shape.arch == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(
            vocab_size=vocab_size,
            d_model=shape.dim,
            d_kv=shape.dim // shape.heads,
            d_ff=shape.ff,
            num_layers=shape.layers,
            num_decoder_layers=shape.layers,
            num_heads=shape.heads,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            dropout_rate=shape.dropout,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=PAD_ID,
        )
        model = T5ForConditionalGeneration(config)
        # transformers initializes an untied T5 head with std 1.0 (made for a tied head whose input is scaled
        # by d_model^-0.5): logits then have std ≈ √d_model (≈ 23 at d = 512, initial loss ≈ 170 nats instead
        # of ln V ≈ 9) and AdamW spends the whole budget shrinking the head; std d_model^-0.5 gives unit logits
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, shape.dim**-0.5)
    else:
        raise ValueError(f"unknown arch {shape.arch!r}; expected 'llama' or 't5'")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = EOS_ID, PAD_ID
    if shape.arch == "llama":
        gen.bos_token_id = BOS_ID
    else:
        gen.decoder_start_token_id = PAD_ID
    return model


def scale_residual_init(model: torch.nn.Module) -> torch.nn.Module:
    """Scaled residual init (GPT-2) of a Llama, in place: each of its L blocks adds two outputs (attention's and the
    MLP's projections) to the residual stream, so both start × 1/√(2L)."""
    layers = model.model.layers
    scale = 1.0 / math.sqrt(2 * len(layers))
    with torch.no_grad():
        for layer in layers:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    return model


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Training FLOPs per token: 6·(matmul params) + 12·L·d·T for attention (PaLM appendix B, the MFU
    convention: attention counted in full, as PaLM does, even where a causal kernel skips half of it).

    Encoder-decoder: a token passes through one of the two stacks (source tokens the encoder, target tokens
    the decoder), so per counted token it is half of the matmul parameters and of the layers."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    matmul_params = count_params(model) - emb  # input embedding is a lookup, not a matmul
    if getattr(cfg, "tie_word_embeddings", False):
        matmul_params += emb  # ...but the tied output head is
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", 0) * 2
    dim = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model")
    share = 0.5 if getattr(cfg, "is_encoder_decoder", False) else 1.0
    return share * (6.0 * matmul_params + 12.0 * layers * dim * seq_len)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            return value
    return None


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def save_model(
    model: torch.nn.Module,
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None,
    *,
    dtype: str | None = None,
    max_shard_size: str | None = None,
) -> Path:
    """`save_pretrained` (safetensors) + the tokenizer, so the folder loads like any user checkpoint
    (`tokenizer_dir=None`: models over non-text tokens, e.g. `specdec.zoo.images`, have no tokenizer).

    dtype: store the weights in this dtype ("float16"/"bfloat16") to save space; config.json still says
    float32, so `from_pretrained(folder)` computes in fp32 (what CPU decoding wants).
    """
    from specdec.zoo.tokenizer import load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    to_save = copy.deepcopy(model).to("cpu").float()
    if dtype is not None:
        to_save = to_save.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    to_save.save_pretrained(str(out), safe_serialization=True, **kwargs)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = "float32"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        load_tokenizer(tokenizer_dir).save_pretrained(str(out))
    return out
