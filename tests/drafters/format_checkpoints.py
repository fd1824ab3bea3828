"""Random-weight drafter checkpoints in the published layouts (names and shapes as the reference code saves
them: SafeAILab EAGLE `cnets1.py` / `cnets.py`, FasterDecoding Medusa, vLLM Medusa, vLLM `speculators` eagle3),
and independent reference forwards built from transformers' own Llama modules, for tiny targets."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding


def _llama_config(target, **over) -> dict:
    c = target.config
    base = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=c.hidden_size,
                intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads, num_hidden_layers=1, rms_norm_eps=c.rms_norm_eps,
                rope_theta=getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"],
                vocab_size=c.vocab_size, max_position_embeddings=c.max_position_embeddings, hidden_act="silu")
    return {**base, **over}


def _layer_tensors(target, prefix: str, seed: int, qkv_in: int, scale: float = 0.5) -> dict:
    """One decoder layer: the target's last layer (so drafts agree with it often) plus noise; q/k/v widened for
    EAGLE-3 (their input is [embed; hidden], 2·dim)."""
    gen = torch.Generator().manual_seed(seed)
    last = target.model.layers[-1]
    out = {}
    for name, p in last.named_parameters():
        if name == "input_layernorm.weight":
            continue
        value = p.detach().clone()
        if name.startswith("self_attn.") and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) \
                and qkv_in != value.shape[1]:
            value = torch.cat([0.5 * value, value], 1)  # [embed part; hidden part]
        out[prefix + name] = value + scale * 0.02 * torch.randn(value.shape, generator=gen)
    return out


def _save(folder: Path, config: dict, tensors: dict, weights: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if weights.endswith(".safetensors"):
        save_file(tensors, str(folder / weights))
    else:
        torch.save(tensors, folder / weights)
    return folder


def write_eagle1(folder: Path, target, seed: int = 0, *, fc_bias: bool = True, with_embed: bool = True,
                 weights: str = "model.safetensors") -> Path:
    """EAGLE-1/2 (cnets1.py `Model` state dict): fc (+bias), layers.0.* without input_layernorm, embed_tokens."""
    d = target.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    fc = torch.cat([0.1 * torch.randn(d, d, generator=gen), torch.eye(d)], 1)  # [embed | feature] → mostly the feature
    tensors = {"fc.weight": fc, **_layer_tensors(target, "layers.0.", seed, d)}
    if fc_bias:
        tensors["fc.bias"] = 0.05 * torch.randn(d, generator=gen)
    if with_embed:
        tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    return _save(folder, _llama_config(target, bias=fc_bias), tensors, weights)


def eagle3_tensors(target, seed: int, draft_ids: list[int], prefix: str, num_features: int = 3) -> dict:
    """EAGLE-3 (cnets.py `Model`): midlayer.* (or layers.0.*) with 2·dim q/k/v, hidden_norm, input_layernorm; fc over
    three target features; its own norm and lm_head over the draft vocabulary; d2t offsets and the t2d mask."""
    d, vocab = target.config.hidden_size, target.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    tensors = _layer_tensors(target, prefix, seed, 2 * d)
    tensors[prefix + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
    tensors[prefix + "hidden_norm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
    fc = [0.1 * torch.randn(d, (num_features - 1) * d, generator=gen), torch.eye(d)]
    tensors["fc.weight"] = torch.cat(fc, 1)  # mostly the last (highest) feature
    tensors["norm.weight"] = target.model.norm.weight.detach().clone()
    ids = torch.tensor(draft_ids)
    tensors["lm_head.weight"] = target.lm_head.weight.detach()[ids].clone()
    tensors["d2t"] = ids - torch.arange(len(ids))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    return tensors


def write_eagle3(folder: Path, target, draft_ids: list[int], seed: int = 0) -> Path:
    config = _llama_config(target, draft_vocab_size=len(draft_ids))
    return _save(folder, config, eagle3_tensors(target, seed, draft_ids, "midlayer."))


def write_speculators_eagle3(folder: Path, target, draft_ids: list[int], layers: list[int], seed: int = 0) -> Path:
    """vLLM speculators "eagle3": layers.0.* names, the numbers under transformer_layer_config, norm flags."""
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": _llama_config(target), "draft_vocab_size": len(draft_ids),
              "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": layers,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}}}
    return _save(folder, config, eagle3_tensors(target, seed, draft_ids, "layers.0.", len(layers)))


def medusa_tensors(target, num_heads: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    d = target.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    lm = target.lm_head.weight.detach()
    return [(0.3 * torch.randn(d, d, generator=gen), 0.1 * torch.randn(d, generator=gen),
             lm + 0.02 * torch.randn(lm.shape, generator=gen)) for _ in range(num_heads)]


def write_medusa(folder: Path, target, num_heads: int = 3, seed: int = 0) -> Path:
    """FasterDecoding Medusa-1: medusa_lm_head.safetensors with {i}.0.linear.{weight,bias} and {i}.1.weight."""
    tensors = {}
    for i, (w, b, lm) in enumerate(medusa_tensors(target, num_heads, seed)):
        tensors.update({f"{i}.0.linear.weight": w, f"{i}.0.linear.bias": b, f"{i}.1.weight": lm})
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"}
    return _save(folder, config, tensors, "medusa_lm_head.safetensors")


def write_vllm_medusa(folder: Path, target, token_map: list[int], num_heads: int = 2, seed: int = 0) -> Path:
    """vLLM's Medusa: blocks.{i}.layers.0.weight (no bias: medusa_fc_bias false), lm_heads.{i}.weight, token_map."""
    ids = torch.tensor(token_map)
    tensors = {"token_map": ids}
    for i, (w, _, lm) in enumerate(medusa_tensors(target, num_heads, seed)):
        tensors.update({f"blocks.{i}.layers.0.weight": w, f"lm_heads.{i}.weight": lm[ids].clone()})
    config = {"model_type": "medusa", "num_heads": num_heads, "num_hidden_layers": 1,
              "hidden_size": target.config.hidden_size, "vocab_size": target.config.vocab_size,
              "truncated_vocab_size": len(token_map)}
    return _save(folder, config, tensors)


# ---------------------------------------------------------------------------------------------- references
def _hf_layer(target, state: dict, prefix: str, qkv_in: int) -> LlamaDecoderLayer:
    config = transformers.LlamaConfig(**{k: v for k, v in _llama_config(target).items() if k != "architectures"})
    config._attn_implementation = "sdpa"  # causal without a mask
    layer = LlamaDecoderLayer(config, 0).eval()
    attn = layer.self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, name)
        setattr(attn, name, torch.nn.Linear(qkv_in, old.out_features, bias=False))
    own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    own.setdefault("input_layernorm.weight", torch.ones(target.config.hidden_size))
    layer.load_state_dict({k: v for k, v in own.items() if k != "hidden_norm.weight"})
    return layer


def _rope(target, x):
    config = transformers.LlamaConfig(**{k: v for k, v in _llama_config(target).items() if k != "architectures"})
    return LlamaRotaryEmbedding(config)(x, torch.arange(x.shape[1])[None])


@torch.no_grad()
def reference_eagle1(target, state: dict, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """cnets1.py's forward over entries (f_t, x_{t+1}): `[1, k, d]`, `[1, k]` → target LM head logits `[1, k, V]`."""
    layer = _hf_layer(target, state, "layers.0.", target.config.hidden_size)
    layer.input_layernorm = torch.nn.Identity()  # layer 0 has no input norm
    embeds = target.model.embed_tokens(tokens)
    x = torch.nn.functional.linear(torch.cat([embeds, features], -1), state["fc.weight"], state.get("fc.bias"))
    out = layer(x, position_embeddings=_rope(target, x))
    out = out[0] if isinstance(out, tuple) else out
    return target.lm_head(out)


def _norm(weight: torch.Tensor, eps: float) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(weight.shape[-1], eps=eps)
    norm.weight.data.copy_(weight)
    return norm


@torch.no_grad()
def eagle3_fc(target, state: dict, aux: torch.Tensor, norm_before_fc: bool = False, fc_norm: bool = False):
    """speculators' input side: [Norm(concat) | concat(Norm(a), Norm(b), Norm(c)) | concat] → fc: `[1, k, d]`."""
    eps = target.config.rms_norm_eps
    if norm_before_fc:
        aux = _norm(state["input_norm.weight"], eps)(aux)
    if fc_norm:
        chunks = aux.chunk(3, dim=-1)
        aux = torch.cat([_norm(state[f"fc_norm.{i}.weight"], eps)(c) for i, c in enumerate(chunks)], -1)
    return torch.nn.functional.linear(aux, state["fc.weight"])


@torch.no_grad()
def reference_eagle3_layer(target, state: dict, hidden: torch.Tensor, tokens: torch.Tensor, prefix: str,
                           norm_before_residual: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cnets.py's `LlamaDecoderLayeremb` (and speculators' first layer) over hidden `[1, k, d]` (after fc, or the
    head's own outputs) → (raw outputs `[1, k, d]`, logits over the target vocabulary `[1, k, V]`, -inf outside
    the draft vocabulary)."""
    d, vocab, eps = target.config.hidden_size, target.config.vocab_size, target.config.rms_norm_eps
    layer = _hf_layer(target, state, prefix, 2 * d)
    embeds = layer.input_layernorm(target.model.embed_tokens(tokens))
    normed = _norm(state[prefix + "hidden_norm.weight"], eps)(hidden)
    residual = normed if norm_before_residual else hidden
    h = torch.cat([embeds, normed], -1)
    x = residual + layer.self_attn(h, position_embeddings=_rope(target, h), attention_mask=None)[0]
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    draft = torch.nn.functional.linear(_norm(state["norm.weight"], eps)(x), state["lm_head.weight"])
    ids = torch.arange(len(state["d2t"])) + state["d2t"]
    out = torch.full((*draft.shape[:-1], vocab), float("-inf"))
    out[..., ids] = draft
    return x, out


def reference_eagle3(target, state: dict, aux: torch.Tensor, tokens: torch.Tensor, prefix: str,
                     norm_before_residual: bool = False) -> torch.Tensor:
    """cnets.py's forward over entries (a_t, x_{t+1}): aux `[1, k, 3d]` → logits `[1, k, V]`."""
    hidden = eagle3_fc(target, state, aux)
    return reference_eagle3_layer(target, state, hidden, tokens, prefix, norm_before_residual)[1]


@torch.no_grad()
def reference_medusa(heads, features: torch.Tensor) -> torch.Tensor:
    """Medusa's ResBlock (x + SiLU(Wx + b)) then each head's LM head: `[B, d]` → `[B, K, V]`."""
    out = []
    for w, b, lm in heads:
        x = features + torch.nn.functional.silu(torch.nn.functional.linear(features, w, b))
        out.append(torch.nn.functional.linear(x, lm))
    return torch.stack(out, 1)
