"""The engine's attention for transformers' attention-function registry (`fast.hf_backend`): `engine_attention`
writes a layer's new keys and values into the engine's cache and attends over it with the engine's masks, reading
one forward's shared inputs (`_Forward`: the cache, write slots, positions, a token tree) from a context variable
that `HFBackendModel.forward` sets for the length of the forward; it honours attention sinks and ALiBi biases
(`fast.hf_attention`) and refuses, with `UnsupportedArchitecture`, inputs the engine does not compute."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from specdec.fast.cache import KVCache, PagedKVCache
from specdec.fast.hf_attention import extras_attention
from specdec.fast.kernels.attention import causal_prefix_attention, slot_attention, slot_attention_bias

__all__ = ["ATTENTION_NAME", "UnsupportedArchitecture", "engine_attention"]

#: the attention implementation's name in transformers' registry
ATTENTION_NAME = "specdec_engine"
_FORWARD: ContextVar["_Forward | None"] = ContextVar("specdec_engine_forward", default=None)
#: attention keyword arguments the engine's attention cannot honour (their value must be None)
_REFUSED_KWARGS = {"position_bias": "a relative position bias", "attention_chunk_size": "chunked attention"}
#: the self-check's text covers sliding windows up to this many tokens (gpt-oss's 128, GPT-Neo's 256)
SELF_CHECK_WINDOW = 256
#: attention keyword arguments naming per-head attention sinks (gpt-oss: one more logit in each softmax denominator)
_SINK_KWARGS = ("s_aux", "sinks")


class UnsupportedArchitecture(ValueError):
    """The backend cannot run this model (the engine's build turns it into `UnsupportedModel`)."""


def _refusal(why: str) -> Exception:
    return UnsupportedArchitecture(why)


@dataclass
class _Forward:
    """One forward's attention inputs, shared by every layer (built once per forward, like `FastLlama`'s)."""

    layers: dict  # id(attention module) → its layer in the cache
    cache: KVCache | PagedKVCache | None = None
    write_index: torch.Tensor | None = None
    bound: torch.Tensor | None = None  # [B, k] what each query sees up to (its position; a tree node its slot)
    tree: object = None  # kernels.attention.TreeMask
    kernel: str = "reference"
    causal: bool = False
    masks: dict = field(default_factory=dict)
    found: list | None = None  # the probe's record: (module, query shape, key shape, value shape, window)
    extras: dict = field(default_factory=dict)  # what every layer of this forward shares (an ALiBi bias per span)
    key_positions: torch.Tensor | None = None  # [B, S] a token tree's: slot j's position (chains: j itself)

    def extra(self, key, build):
        """`build()` once per forward for `key` (an ALiBi bias: every layer of a model shares it)."""
        if key not in self.extras:
            self.extras[key] = build()
        return self.extras[key]


def engine_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                     softcap=None, alibi=None, **kwargs):
    """transformers' attention-function signature: query `[B, H, k, D]`, key/value `[B, H_kv, k, D]` of the k fed
    tokens (after the layer's projections and RoPE) → (output `[B, k, H, D]`, None). Writes K/V into the engine's
    cache and attends over it; `attention_mask` is unused (the engine's masks come from positions).

    Beyond the engine's own masks it honours attention sinks (`s_aux` / `sinks` `[H]`: gpt-oss; `slot_attention`
    takes them, the Triton kernel included) and an ALiBi bias (`alibi`: a function of the span S → `[H, S]`, the
    bias of absolute position j, passed by the adapters of `fast.hf_adapters`; each key reads its own position's,
    `_key_bias`): a layer with a bias takes `hf_attention.extras_attention` over its gathered slots, on every device
    (the Triton kernel takes no bias)."""
    step = _FORWARD.get()
    if step is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention ran outside an engine forward (the model's configs name it "
                           "only while `HFBackendModel.forward` runs; is the model shared with another thread?)")
    for name, what in _REFUSED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise _refusal(f"{type(module).__name__} passes {name} ({what}) to its attention: the engine's attention "
                           "does not compute it")
    if kwargs.get("is_causal") is False:
        raise _refusal(f"{type(module).__name__} attends bidirectionally (is_causal=False): not a decoder")
    window = int(sliding_window) if sliding_window else None
    if step.found is not None:  # the probe: one token, whose attention over itself is its value
        step.found.append((module, tuple(query.shape), tuple(key.shape), tuple(value.shape), window))
        group = query.shape[1] // value.shape[1]
        return value.transpose(1, 2).repeat_interleave(group, dim=2), None
    layer = step.layers.get(id(module))
    if layer is None:
        raise RuntimeError(f"{type(module).__name__} was not an attention layer when the backend was built")
    cache = step.cache
    dtype = cache.keys[layer].dtype
    q = query.transpose(1, 2).to(dtype)  # [B, k, H, D]
    cache.write(layer, step.write_index, key.transpose(1, 2).to(dtype), value.transpose(1, 2).to(dtype))
    group = q.shape[2] // key.shape[1]
    sinks = next((kwargs[n] for n in _SINK_KWARGS if kwargs.get(n) is not None), None)
    if alibi is not None:
        key_mask = ("extras", window)
        if key_mask not in step.masks:
            step.masks[key_mask] = slot_attention_bias(step.bound, cache.span, 1, torch.float32, window, step.tree)
        bias = None if alibi is None else step.extra(("alibi", alibi), lambda: _key_bias(alibi, cache.span, step))
        out = extras_attention(q, *cache.layer(layer), step.masks[key_mask], scaling, softcap=softcap, alibi=bias,
                               sinks=sinks)
    elif step.causal and window is None and softcap is None and step.tree is None and sinks is None:
        out = causal_prefix_attention(q, *cache.layer(layer), scaling)
    else:
        if window not in step.masks and (step.kernel == "reference" or step.kernel == "auto" and not q.is_cuda):
            step.masks[window] = slot_attention_bias(step.bound, cache.span, group, dtype, window, step.tree)
        keys, values, table = cache.attention_inputs(layer)
        out = slot_attention(q, keys, values, step.bound, scaling, window=window, softcap=softcap, kernel=step.kernel,
                             bias=step.masks.get(window), tree=step.tree, block_table=table, sinks=sinks)
    return out.to(query.dtype), None


def _key_bias(alibi, span: int, step: _Forward) -> torch.Tensor:
    """An ALiBi bias by key position: `[H, S]` where slot j holds position j (chains); a token tree's nodes sit at
    slots past their positions, so each row's slots read the bias of their own positions → `[B, H, S]`."""
    table = alibi(span)  # [H, S]: the bias of position j
    if step.key_positions is None:
        return table
    return table[:, step.key_positions].transpose(0, 1)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, engine_attention)
