"""Attention adapters: the transformers families whose attention does not go through the attention interface.

Falcon, Bloom, MPT, GPT-Neo, XGLM and GPT-NeoX-Japanese compute attention inside their attention module's own
`forward` (transformers 5 gives them no `AttentionInterface` call), so the backend cannot plug the engine's
attention in by name. For each, an adapter stands in for that module's `forward` while an engine forward runs
(`HFBackendModel` sets it on the module instance and removes it after; the model is unchanged outside): it calls
the module's own projections, head split, RoPE function and output projection in the order its `forward` does,
and hands the heads to `hf_backend.engine_attention` with what the module's attention adds to the engine's masks:

- Falcon: RoPE (the family's `apply_rotary_pos_emb`), or with `alibi=True` an ALiBi bias; multi-query and grouped
  ("new decoder architecture") K/V keep one copy per KV head in the cache (the module broadcasts them over its
  query heads: the same values);
- Bloom, MPT: an ALiBi bias (`Alibi`), MPT's `clip_qkv`; Bloom's `slow_but_exact` output projection (with
  `pretraining_tp` > 1: the sum of one bias-free product per slice, as the module computes it);
- GPT-Neo: no 1/√d scaling, and a sliding window of `config.window_size` on its "local" layers;
- XGLM: nothing added to the masks (its sinusoidal positions join the embeddings outside attention, from the
  position ids the backend passes; the query is scaled by 1/√d before the product, as the module does);
  cross-attention (an encoder's states) is refused;
- GPT-NeoX-Japanese: RoPE on the first `rotary_ndims` of each head (its partial rotary factor), its fused QKV
  interleaved per head, and the output bias it hands the layer apart (`dense_bias`, the last layer's only).

`Alibi` is the bias by absolute position, built with the family's own slope function, so a slot's bias is the one
the model's own forward gives the same position. The backend's self-check compares every adapter against the
model's own forward (`reference`: the attention implementation whose output the model's default computes) and
refuses a model where they differ — a transformers release that changes one of these modules is refused, not run
inexactly.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Adapter", "Alibi", "adapter_for"]


@dataclass(frozen=True)
class Alibi:
    """An ALiBi bias by absolute position for one family: `bias(span)` → `[H, span]` (slot j holds position j), the
    value the family's forward adds to head h's logit of key position j (up to a constant per query, which the
    softmax does not see). Hashable: a forward builds it once for all its layers (`_Forward.extra`)."""

    family: str  # "bloom" / "falcon" / "mpt"
    module: str  # the family's modeling module (its slope functions)
    heads: int
    dtype: torch.dtype
    device: torch.device
    scale: float = 1.0  # Falcon adds alibi / √d

    def __call__(self, span: int) -> torch.Tensor:
        fam = sys.modules[self.module]
        if self.family == "mpt":  # slope · (j − (span − 1)): the family's table over `span` keys (as MptModel calls
            # it: its default alibi_bias_max)
            return fam.build_mpt_alibi_tensor(self.heads, span, device=self.device).view(
                self.heads, span).to(self.dtype)
        ones = torch.ones(1, span, dtype=torch.long, device=self.device)  # slope · j, as from an all-ones mask
        alibi = fam.build_alibi_tensor(ones, self.heads, self.dtype).view(self.heads, span)
        return alibi if self.scale == 1.0 else alibi / self.scale


@dataclass(frozen=True)
class Adapter:
    """`forward(module, *args, **kwargs)`: the module's outputs with its attention through the engine's;
    `reference(module)`: the attention implementation the self-check compares with; `why_not(module)`: a reason the
    adapter cannot run this module's configuration, or None."""

    forward: Callable
    reference: Callable = lambda module: "eager"
    why_not: Callable = lambda module: None


def _attend(module, query, key, value, **kwargs):
    from specdec.fast.hf_engine_attention import engine_attention

    return engine_attention(module, query, key, value, None, **kwargs)[0]  # [B, k, H, D]


def _family(module):
    return sys.modules[type(module).__module__]


def _weight(module) -> torch.Tensor:
    return next(p for p in module.parameters())


def _alibi(module, family: str, heads: int, **kw) -> Alibi:
    weight = _weight(module)
    dtype = weight.dtype if weight.is_floating_point() else torch.float32
    return Alibi(family, type(module).__module__, heads, dtype, weight.device, **kw)


# --------------------------------------------------------------------------------------------------- Falcon
def _falcon_split(module, fused: torch.Tensor):
    """Falcon's fused QKV [B, k, (H + 2·H_kv)·D] → query [B, k, H, D], key and value [B, k, H_kv, D] (its three
    layouts: grouped per KV head, multi-query, interleaved per head; split here, not by a private helper of the
    attention class, which transformers has renamed between releases)."""
    batch, length = fused.shape[:2]
    d = module.head_dim
    if module.new_decoder_architecture:  # per KV head: its group's queries, then its key, then its value
        grouped = fused.view(batch, length, module.num_kv_heads, -1, d)
        return grouped[..., :-2, :].flatten(2, 3), grouped[..., -2, :], grouped[..., -1, :]
    heads = fused.view(batch, length, -1, d)
    if module.multi_query:
        return heads.split([module.num_heads, 1, 1], dim=2)
    return heads.unflatten(2, (module.num_heads, 3)).unbind(3)  # per head: its query, key and value


def _falcon(module, hidden_states, *args, position_embeddings=None, **kwargs):
    # transformers ≤ 5.24 passes the ALiBi tensor to the attention, later releases fold it into the mask; either
    # way the engine builds its own bias from the config
    query, key, value = _falcon_split(module, module.query_key_value(hidden_states))
    batch, length = query.shape[:2]
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # [B, H | H_kv, k, D]
    bias = None
    if not module.config.alibi:
        query, key = _family(module).apply_rotary_pos_emb(query, key, *position_embeddings)
    else:
        bias = _alibi(module, "falcon", module.num_heads, scale=math.sqrt(module.head_dim))
    out = _attend(module, query, key, value, scaling=module.inv_norm_factor, alibi=bias)
    return module.dense(out.reshape(batch, length, module.num_heads * module.head_dim)), None


def _falcon_reference(module) -> str:
    # transformers 5's eager Falcon attention adds the ALiBi bias twice (once to the scores, once more in the mask
    # its model forward builds); its sdpa path — the default — adds it once, as Falcon's original code does
    return "sdpa" if module.config.alibi else "eager"


# --------------------------------------------------------------------------------------------------- Bloom
def _bloom(module, hidden_states, residual, alibi=None, attention_mask=None, layer_past=None, use_cache=False,
           output_attentions=False, **kwargs):
    batch, length, _ = hidden_states.shape
    query, key, value = module._reshape(module.query_key_value(hidden_states))  # [B, H, k, D]
    bias = _alibi(module, "bloom", module.num_heads)  # baddbmm(alibi, q, kᵀ, beta=1, alpha=1/√d)
    out = _attend(module, query, key, value, scaling=module.inv_norm_factor, alibi=bias)
    output = _bloom_dense(module, out.reshape(batch, length, module.num_heads * module.head_dim))
    return _family(module).dropout_add(output, residual, module.hidden_dropout, module.training), None


def _bloom_dense(module, context: torch.Tensor) -> torch.Tensor:
    """Bloom's output projection of `[B, k, hidden]`; with `slow_but_exact` and `pretraining_tp` > 1 the module sums
    one product per slice of the hidden size, without the projection's bias (as transformers computes it)."""
    if not (module.pretraining_tp > 1 and module.slow_but_exact):
        return module.dense(context)
    slices = module.hidden_size / module.pretraining_tp
    output = torch.zeros_like(context)
    for i in range(module.pretraining_tp):
        span = slice(int(i * slices), int((i + 1) * slices))
        output = output + torch.nn.functional.linear(context[:, :, span], module.dense.weight[:, span])
    return output


def _bloom_why_not(module) -> str | None:
    if module.beta != 1.0:
        return f"Bloom's attention scales its ALiBi bias by beta = {module.beta}"
    return None


# --------------------------------------------------------------------------------------------------- MPT
def _mpt(module, hidden_states, position_bias=None, cache=None, attention_mask=None, **kwargs):
    batch, length = hidden_states.shape[:2]
    mixed = module.Wqkv(hidden_states)
    if module.clip_qkv:
        mixed = mixed.clamp(min=-module.clip_qkv, max=module.clip_qkv)
    query, key, value = (t.reshape(batch, length, module.n_heads, module.head_dim).transpose(1, 2)
                         for t in mixed.chunk(3, dim=2))
    bias = None
    if position_bias is not None:
        bias = _alibi(module, "mpt", module.n_heads)
    out = _attend(module, query, key, value, scaling=module.softmax_scale, alibi=bias)
    return module.out_proj(out.reshape(batch, length, -1)), None


# --------------------------------------------------------------------------------------------------- GPT-Neo
def _gpt_neo(module, hidden_states, attention_mask=None, layer_past=None, use_cache=False, output_attentions=False,
             **kwargs):
    query, key, value = (module._split_heads(proj(hidden_states), module.num_heads, module.head_dim)
                         for proj in (module.q_proj, module.k_proj, module.v_proj))  # [B, H, k, D]
    window = module.config.window_size if module.attention_type == "local" else None
    out = _attend(module, query, key, value, scaling=1.0, sliding_window=window)  # (GPT-Neo does not scale)
    out = module.out_proj(out.reshape(*hidden_states.shape[:2], module.num_heads * module.head_dim))
    return module.resid_dropout(out), None


# --------------------------------------------------------------------------------------------------- XGLM
def _xglm(module, hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
    if key_value_states is not None:
        from specdec.fast.hf_engine_attention import UnsupportedArchitecture

        raise UnsupportedArchitecture("XGLM's cross-attention (encoder states): the engine runs decoders")
    batch, length = hidden_states.shape[:2]
    query = module.q_proj(hidden_states) * module.scaling  # (scaled before the product, as the module does)
    query, key, value = (t.view(batch, length, module.num_heads, module.head_dim).transpose(1, 2)
                         for t in (query, module.k_proj(hidden_states), module.v_proj(hidden_states)))  # [B, H, k, D]
    out = _attend(module, query, key, value, scaling=1.0)
    return module.out_proj(out.reshape(batch, length, module.embed_dim)), None


# --------------------------------------------------------------------------------------------------- GPT-NeoX-Japanese
def _gpt_neox_japanese(module, hidden_states, attention_mask=None, position_ids=None, layer_past=None,
                       use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
    batch, length = hidden_states.shape[:2]
    d, heads, rot = module.head_size, module.num_attention_heads, module.rotary_ndims
    fused = module.query_key_value(hidden_states).view(batch, length, heads, 3 * d).transpose(1, 2)
    query, key, value = fused.split(d, dim=-1)  # per head: its query, key and value, [B, H, k, D] each
    q_rot, k_rot = _family(module).apply_rotary_pos_emb(query[..., :rot], key[..., :rot], *position_embeddings)
    query, key = torch.cat((q_rot, query[..., rot:]), dim=-1), torch.cat((k_rot, key[..., rot:]), dim=-1)
    out = _attend(module, query, key, value, scaling=1.0 / module.norm_factor)
    return module.dense(out.reshape(batch, length, heads * d)), None, module.dense_bias


#: (modeling module, attention class) → its adapter (subclasses match: Falcon's flash-attention class)
_ADAPTERS = {
    ("transformers.models.falcon.modeling_falcon", "FalconAttention"): Adapter(_falcon, _falcon_reference),
    ("transformers.models.bloom.modeling_bloom", "BloomAttention"): Adapter(_bloom, why_not=_bloom_why_not),
    ("transformers.models.mpt.modeling_mpt", "MptAttention"): Adapter(_mpt),
    ("transformers.models.gpt_neo.modeling_gpt_neo", "GPTNeoSelfAttention"): Adapter(_gpt_neo),
    ("transformers.models.xglm.modeling_xglm", "XGLMAttention"): Adapter(_xglm),
    ("transformers.models.gpt_neox_japanese.modeling_gpt_neox_japanese", "GPTNeoXJapaneseAttention"):
        Adapter(_gpt_neox_japanese),
}


def adapter_for(module: torch.nn.Module) -> Adapter | None:
    """The adapter of this module's attention class (or of a class it derives from), or None."""
    for cls in type(module).__mro__:
        found = _ADAPTERS.get((cls.__module__, cls.__name__))
        if found is not None:
            return found
    return None
