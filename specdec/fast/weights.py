"""From a transformers checkpoint of `specdec.fast.families.FAMILIES` to `FastLlama`'s fused weights: `hf_weights`
yields (parameter name, layer, tensor) — q|k|v and gate|up concatenated, GPT-2's Conv1D transposed, NeoX's per-head
interleaved q|k|v regrouped, Gemma's norms as (1 + w) in float32, Granite's residual multiplier folded into the
output projections — and `hf_ropes` reads the RoPE tables (inv_freq, attention scaling) off the model itself.
"""

from __future__ import annotations

import torch

from specdec.fast.families import LlamaShape

__all__ = ["hf_weights", "hf_ropes", "stack_rows"]


def hf_ropes(model, shape: LlamaShape) -> list[tuple[torch.Tensor | None, float]]:
    """(inv_freq, attention scaling) per RoPE table, read off a transformers model's rotary embedding (None =
    compute the default from rope_theta)."""
    if shape.arch.rotary_dim == 0:
        return []
    base = getattr(model, "model", None) or getattr(model, "gpt_neox", None)
    base = getattr(base, "language_model", base)  # (Gemma 3's vision-language wrapper)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        return [(None, 1.0)]
    if getattr(rotary, "rope_type", None) == "dynamic":
        raise ValueError("FastLlama does not support dynamic RoPE scaling (its frequencies depend on the length)")
    if model.config.get_text_config().model_type == "gemma3_text":  # one table per layer type present, sorted
        return [(getattr(rotary, f"{t}_inv_freq"), float(getattr(rotary, f"{t}_attention_scaling")))
                for t in sorted(set(model.config.get_text_config().layer_types))]
    inv_freq = getattr(rotary, "original_inv_freq", None) if shape.arch.rope_limit else None  # LongRoPE: short
    tables = [(inv_freq if inv_freq is not None else rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)))]
    if shape.arch.layer_rope:  # SmolLM3's NoPE layers: frequencies 0, so cos = 1 and sin = 0 (x passes unchanged)
        tables.append((torch.zeros_like(tables[0][0]), 1.0))
    return tables


def stack_rows(parts: list[torch.Tensor], share: bool = False) -> torch.Tensor:
    """parts `[N_i, ...]` stacked along rows → `[ΣN_i, ...]` (q|k|v, gate|up).

    A view, no copy, when the parts already lie end to end in one storage (stacked before, with `share`). With
    `share`, a new stack is made and each part's `.data` re-pointed to its rows of it, so the transformers model and
    FastLlama read one copy (the parameters keep their identity; the old tensors are freed with their last user).
    """
    first = parts[0]
    if all(p.is_contiguous() and p.dtype == first.dtype and p.device == first.device and p.shape[1:] == first.shape[1:]
           and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for p in parts) and all(
            b.storage_offset() == a.storage_offset() + a.numel() for a, b in zip(parts, parts[1:])):
        rows = sum(p.shape[0] for p in parts)
        return first.detach().as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
    stacked = torch.cat([p.detach() for p in parts])
    if share:
        for part, rows in zip(parts, stacked.split([p.shape[0] for p in parts])):
            part.data = rows
    return stacked


def hf_weights(model, shape: LlamaShape, *, share: bool = False):
    """Yield (FastLlama parameter name, layer index or None, tensor) for every weight of a transformers model.

    share: stacked weights re-point the model's parameters into the stack (`stack_rows`), so taking every yielded
    tensor as it is (`fast.held_once`) holds each weight once; without it the model is left untouched.
    """
    config, a = model.config, shape.arch
    params = dict(model.named_parameters())
    stack = lambda parts: stack_rows(parts, share)  # noqa: E731
    one_plus = (lambda w: 1.0 + w.float()) if a.norm == "rms1p" else (lambda w: w)
    if config.model_type == "gpt2":
        yield from _gpt2_weights(model, params, shape)
        return
    if config.model_type == "gpt_neox":
        yield from _neox_weights(model, params, shape)
        return
    if config.model_type == "starcoder2":
        yield from _starcoder2_weights(model, params, shape, stack)
        return
    root = "model.language_model." if config.model_type == "gemma3" else "model."
    res = float(getattr(config, "residual_multiplier", 1.0)) if config.model_type == "granite" else 1.0
    scaled = (lambda w: w * res) if res != 1.0 else (lambda w: w)  # Granite: x + m·f(x), m folded into f's output
    yield "embed", None, params[root + "embed_tokens.weight"]
    for i in range(shape.n_layers):
        pre = f"{root}layers.{i}."
        attn, mlp = pre + "self_attn.", pre + "mlp."
        if config.model_type == "phi3":
            yield "wqkv", i, params[attn + "qkv_proj.weight"]
            yield "w_gate_up", i, params[mlp + "gate_up_proj.weight"]
        else:
            yield "wqkv", i, stack([params[attn + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
            yield "w_gate_up", i, stack([params[mlp + "gate_proj.weight"], params[mlp + "up_proj.weight"]])
        yield "wo", i, scaled(params[attn + "o_proj.weight"])
        yield "w_down", i, scaled(params[mlp + "down_proj.weight"])
        if shape.qkv_bias:
            yield "bqkv", i, stack([params[attn + n + ".bias"] for n in ("q_proj", "k_proj", "v_proj")])
        if shape.o_bias:
            yield "bo", i, scaled(params[attn + "o_proj.bias"])
        if shape.qk_norm:
            yield "q_norm", i, one_plus(params[attn + "q_norm.weight"])
            yield "k_norm", i, one_plus(params[attn + "k_norm.weight"])
        yield "attn_norm", i, one_plus(params[pre + "input_layernorm.weight"])
        if a.sandwich_norms:
            yield "post_attn_norm", i, one_plus(params[pre + "post_attention_layernorm.weight"])
            yield "mlp_norm", i, one_plus(params[pre + "pre_feedforward_layernorm.weight"])
            yield "post_mlp_norm", i, one_plus(params[pre + "post_feedforward_layernorm.weight"])
        else:
            yield "mlp_norm", i, one_plus(params[pre + "post_attention_layernorm.weight"])
    yield "final_norm", None, one_plus(params[root + "norm.weight"])
    if not shape.tie_word_embeddings:
        yield "lm_head", None, model.get_output_embeddings().weight


def _gpt2_weights(model, params, shape: LlamaShape):
    yield "embed", None, params["transformer.wte.weight"]
    yield "pos_embed", None, params["transformer.wpe.weight"]
    for i in range(shape.n_layers):
        pre = f"transformer.h.{i}."
        for fast, hf in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            yield fast, i, params[pre + hf + ".weight"]
            yield fast + "_bias", i, params[pre + hf + ".bias"]
        for fast, bias, hf in (("wqkv", "bqkv", "attn.c_attn"), ("wo", "bo", "attn.c_proj"),
                               ("w_gate_up", "b_up", "mlp.c_fc"), ("w_down", "b_down", "mlp.c_proj")):
            yield fast, i, params[pre + hf + ".weight"].t()  # Conv1D keeps [in, out]
            yield bias, i, params[pre + hf + ".bias"]
    yield "final_norm", None, params["transformer.ln_f.weight"]
    yield "final_norm_bias", None, params["transformer.ln_f.bias"]
    if not shape.tie_word_embeddings:
        yield "lm_head", None, model.get_output_embeddings().weight


def _neox_weights(model, params, shape: LlamaShape):
    heads, hd, dim = shape.n_heads, shape.head_dim, shape.dim
    yield "embed", None, params["gpt_neox.embed_in.weight"]
    for i in range(shape.n_layers):
        pre = f"gpt_neox.layers.{i}."
        for fast, hf in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            yield fast, i, params[pre + hf + ".weight"]
            yield fast + "_bias", i, params[pre + hf + ".bias"]
        # query_key_value interleaves per head ([H, 3, D] rows); the fused layout is q heads | k heads | v heads
        qkv = params[pre + "attention.query_key_value.weight"]
        yield "wqkv", i, qkv.view(heads, 3, hd, dim).transpose(0, 1).reshape(3 * heads * hd, dim)
        if shape.qkv_bias:
            bias = params[pre + "attention.query_key_value.bias"]
            yield "bqkv", i, bias.view(heads, 3, hd).transpose(0, 1).reshape(-1)
        yield "wo", i, params[pre + "attention.dense.weight"]
        if shape.o_bias:
            yield "bo", i, params[pre + "attention.dense.bias"]
        yield "w_gate_up", i, params[pre + "mlp.dense_h_to_4h.weight"]
        yield "b_up", i, params[pre + "mlp.dense_h_to_4h.bias"]
        yield "w_down", i, params[pre + "mlp.dense_4h_to_h.weight"]
        yield "b_down", i, params[pre + "mlp.dense_4h_to_h.bias"]
    yield "final_norm", None, params["gpt_neox.final_layer_norm.weight"]
    yield "final_norm_bias", None, params["gpt_neox.final_layer_norm.bias"]
    if not shape.tie_word_embeddings:
        yield "lm_head", None, model.get_output_embeddings().weight


def _starcoder2_weights(model, params, shape: LlamaShape, stack):
    bias = shape.arch.mlp_bias
    yield "embed", None, params["model.embed_tokens.weight"]
    for i in range(shape.n_layers):
        pre = f"model.layers.{i}."
        for fast, hf in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            yield fast, i, params[pre + hf + ".weight"]
            yield fast + "_bias", i, params[pre + hf + ".bias"]
        attn = pre + "self_attn."
        yield "wqkv", i, stack([params[attn + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
        yield "wo", i, params[attn + "o_proj.weight"]
        yield "w_gate_up", i, params[pre + "mlp.c_fc.weight"]
        yield "w_down", i, params[pre + "mlp.c_proj.weight"]
        if bias:
            yield "bqkv", i, stack([params[attn + n + ".bias"] for n in ("q_proj", "k_proj", "v_proj")])
            yield "bo", i, params[attn + "o_proj.bias"]
            yield "b_up", i, params[pre + "mlp.c_fc.bias"]
            yield "b_down", i, params[pre + "mlp.c_proj.bias"]
    yield "final_norm", None, params["model.norm.weight"]
    yield "final_norm_bias", None, params["model.norm.bias"]
    if not shape.tie_word_embeddings:
        yield "lm_head", None, model.get_output_embeddings().weight
