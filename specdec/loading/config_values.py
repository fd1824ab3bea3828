"""The values of a config, checked before any weight is read: every field the engine or the loop reads.

`checks.check_bounds` bounds the sizes (layers, widths, vocabulary); this module checks what a size bound does
not: floats finite and positive where the model divides by them or takes their logarithm (`rope_theta`, the norm
epsilons, soft-caps, multipliers), ranges (`partial_rotary_factor` in (0, 1], a RoPE scaling `factor` no model
has ever used refused), the names transformers looks up (`hidden_act` in its activation table, `torch_dtype` a
torch dtype) and the head arithmetic (`num_key_value_heads` >= 1 dividing `num_attention_heads`, which divides
`hidden_size` unless `head_dim` is given). Each refusal is one line naming the field and the file: a config that
used to load and run (`rope_theta` 0, `torch_dtype` "float1024") or fail deep inside (a bare
`ZeroDivisionError`, `KeyError: 'evil'`) is refused here.
"""

from __future__ import annotations

import math

__all__ = ["check_values", "POSITIVE_FLOATS", "MAX_ROPE_THETA", "MAX_ROPE_FACTOR"]

MAX_ROPE_THETA = 1e12  # released models use 1e4 .. 1e8
MAX_ROPE_FACTOR = 1e4  # RoPE scaling factors in use: 2 .. 64
#: field → (lowest, highest, lowest included); a float the forward pass divides by, scales with or logs
POSITIVE_FLOATS = {
    "rope_theta": (0.0, MAX_ROPE_THETA, False),
    "rms_norm_eps": (0.0, 1.0, False), "layer_norm_eps": (0.0, 1.0, False), "layer_norm_epsilon": (0.0, 1.0, False),
    "norm_epsilon": (0.0, 1.0, False), "norm_eps": (0.0, 1.0, False),
    "partial_rotary_factor": (0.0, 1.0, False),
    "query_pre_attn_scalar": (0.0, 1e8, False),
    "final_logit_softcapping": (0.0, 1e8, False), "attn_logit_softcapping": (0.0, 1e8, False),
    "logits_scaling": (0.0, 1e8, False), "embedding_multiplier": (0.0, 1e8, False),
    "attention_multiplier": (0.0, 1e8, False), "residual_multiplier": (0.0, 1e8, False),
}
# inside rope_scaling / rope_parameters
_ROPE_FLOATS = {
    "rope_theta": (0.0, MAX_ROPE_THETA, False), "factor": (0.0, MAX_ROPE_FACTOR, False),
    "low_freq_factor": (0.0, 1e8, False), "high_freq_factor": (0.0, 1e8, False),
    "attention_factor": (0.0, 1e8, False), "beta_fast": (0.0, 1e8, False), "beta_slow": (0.0, 1e8, False),
    "mscale": (0.0, 1e8, False), "mscale_all_dim": (0.0, 1e8, True), "partial_rotary_factor": (0.0, 1.0, False),
}
_ACTIVATIONS = ("hidden_act", "hidden_activation", "activation_function")
_DTYPES = ("torch_dtype", "dtype")
_OTHER_HEAD_SHAPES = ("kv_lora_rank", "qk_head_dim", "qk_nope_head_dim", "v_head_dim", "d_kv")


def check_values(config: dict, where: str, what: str) -> None:
    """Refuse (ValueError naming `what`, `where` and the field) a config value the engine or loop could not
    run with; sub-configs (`text_config`) too. Reads the dict only."""
    for prefix, part in (("", config), ("text_config.", config.get("text_config"))):
        if isinstance(part, dict):
            _check_part(part, prefix, where, what, config.get("model_type"))


def _fail(where: str, what: str, field: str, value, need: str) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise ValueError(f"{what}: {where} has {field} {shown}; it must be {need}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_float(part: dict, key: str, bounds, prefix: str, where: str, what: str) -> None:
    value = part.get(key)
    if value is None:
        return
    low, high, low_included = bounds
    if not _number(value) or not math.isfinite(value) or value > high or value < low or (
            value == low and not low_included):
        _fail(where, what, prefix + key, value, f"a finite number in {'[' if low_included else '('}{low:g}, {high:g}]")


def _check_part(part: dict, prefix: str, where: str, what: str, top_type: str | None) -> None:
    for key, bounds in POSITIVE_FLOATS.items():
        _check_float(part, key, bounds, prefix, where, what)
    for name in ("rope_scaling", "rope_parameters"):
        rope = part.get(name)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            _fail(where, what, prefix + name, rope, "an object (or null)")
        for key, bounds in _ROPE_FLOATS.items():
            _check_float(rope, key, bounds, f"{prefix}{name}.", where, what)
        original = rope.get("original_max_position_embeddings")
        if original is not None and (not isinstance(original, int) or isinstance(original, bool) or original < 1):
            _fail(where, what, f"{prefix}{name}.original_max_position_embeddings", original, "an integer >= 1")
        for key in ("long_factor", "short_factor"):
            factors = rope.get(key)
            if factors is not None and (not isinstance(factors, list) or not all(
                    _number(f) and math.isfinite(f) and 0 < f <= MAX_ROPE_FACTOR for f in factors)):
                _fail(where, what, f"{prefix}{name}.{key}", factors, f"a list of finite numbers in (0, {MAX_ROPE_FACTOR:g}]")
    _check_names(part, prefix, where, what)
    _check_heads(part, prefix, where, what, top_type)


def _check_names(part: dict, prefix: str, where: str, what: str) -> None:
    from transformers.activations import ACT2FN

    for key in _ACTIVATIONS:
        value = part.get(key)
        if value is not None and (not isinstance(value, str) or value not in ACT2FN):
            _fail(where, what, prefix + key, value, f"an activation transformers knows ({', '.join(sorted(ACT2FN)[:6])}, ...)")
    import torch

    for key in _DTYPES:
        value = part.get(key)
        if value is None or isinstance(value, torch.dtype):
            continue
        name = value[len("torch."):] if isinstance(value, str) and value.startswith("torch.") else value
        if not isinstance(name, str) or not (name == "auto" or isinstance(getattr(torch, name, None), torch.dtype)):
            _fail(where, what, prefix + key, value, "a torch dtype name (float32, float16, bfloat16, ...)")


def _check_heads(part: dict, prefix: str, where: str, what: str, top_type: str | None) -> None:
    heads = next((part[k] for k in ("num_attention_heads", "n_head", "num_heads") if _int(part.get(k))), None)
    kv = part.get("num_key_value_heads")
    if kv is not None:
        if not _int(kv) or kv < 1:
            _fail(where, what, prefix + "num_key_value_heads", kv, "an integer >= 1")
        if heads is not None and heads % kv:
            _fail(where, what, prefix + "num_key_value_heads", kv, f"a divisor of the {heads} attention heads")
    from specdec.fast.families import FAMILIES  # the engine's families: head_dim = hidden / heads unless given

    if part.get("model_type", top_type) not in FAMILIES or any(part.get(k) is not None for k in _OTHER_HEAD_SHAPES):
        return  # (other families size their heads their own way: latent attention, T5's d_kv, class defaults)
    head_dim = part.get("head_dim")
    if head_dim is not None and (not _int(head_dim) or head_dim < 1):
        _fail(where, what, prefix + "head_dim", head_dim, "an integer >= 1")
    hidden = next((part[k] for k in ("hidden_size", "n_embd") if _int(part.get(k))), None)
    if heads and hidden and "head_dim" not in part and hidden % heads:  # (head_dim = hidden / heads)
        _fail(where, what, prefix + "num_attention_heads", heads, f"a divisor of hidden_size {hidden} (or give head_dim)")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
