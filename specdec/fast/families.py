"""What the decoder families the fast model runs differ in: one `LlamaShape` (+ its `Arch`) per config, and the
family-specific pieces of the layer (norms, MLP activation, RoPE tables). The checkpoint weight mapping is in
`specdec.fast.weights`.

Families (model_type → what its `Arch` sets beyond Llama's RMSNorm · SiLU-gated MLP · full RoPE):
  llama, mistral, qwen2, qwen3  the Llama body (Qwen2: q/k/v bias; Qwen3: q/k RMSNorm; Mistral/Qwen2: windows)
  gemma                         x̂·(1 + w) RMSNorm in float32, GELU-tanh, embedding × sqrt(dim)
  gemma2                        + attention and final logit soft-capping, query_pre_attn_scalar, norms after
                                attention and after the MLP too, sliding-window layers alternating with global ones
  gemma3_text                   gemma2's body without soft-capping, + q/k norms, local (sliding) layers on their own
                                RoPE base; `gemma3` (4B and up: the vision-language wrapper) runs its language model
                                on text prompts
  phi3                          fused q|k|v and gate|up in the checkpoint, partial rotary, LongRoPE (short factors:
                                texts up to original_max_position_embeddings), sliding window
  gpt_neox                      LayerNorm with biases, GELU MLP with biases, partial rotary, parallel residual
  gpt2                          LayerNorm with biases, learned positions, GELU-tanh MLP, Conv1D weights (transposed)
  smollm3                       the Llama body with NoPE layers (no_rope_layers: an identity RoPE table)
  granite                       the Llama body with embedding, attention, residual (folded into the output
                                projections) and logit multipliers
  starcoder2                    LayerNorm with biases, GELU-tanh MLP (c_fc, c_proj) and attention with biases
                                (use_bias), sliding window
A config option outside these (another activation, dynamic RoPE, GPT-2's per-layer attention scaling, ...) is
refused with one line naming it; nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = ["Arch", "LlamaShape", "FAMILIES", "norm", "mlp_activation", "rope_table"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt_neox", "gpt2",
            "starcoder2", "gemma3", "smollm3", "granite")
_GEMMA = ("gemma", "gemma2", "gemma3_text")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                "gelu": "gelu"}


@dataclass(frozen=True)
class Arch:
    """How a family computes a layer, beyond the Llama body (the defaults are Llama's)."""

    norm: str = "rms"  # "rms": x̂·w; "rms1p": x̂·(1 + w) in float32 (Gemma); "layer": LayerNorm with a bias
    act: str = "silu"  # of the MLP: "silu", "gelu_tanh", "gelu" (erf)
    gated: bool = True  # act(gate)·up (Llama) or act(up) (GPT-2 / NeoX)
    mlp_bias: bool = False
    embed_scale: float | None = None  # Gemma: token embeddings × sqrt(dim) (rounded to the model dtype); Granite
    round_embed_scale: bool = True  # Gemma rounds the scale to the model dtype first; Granite multiplies by a float
    logit_scale: float | None = None  # Granite: logits / logits_scaling
    attn_scale: float | None = None  # None = head_dim^-0.5 (Gemma 2/3: query_pre_attn_scalar^-0.5)
    attn_softcap: float | None = None  # Gemma 2: scores → c·tanh(scores / c)
    final_softcap: float | None = None  # Gemma 2: logits → c·tanh(logits / c)
    sandwich_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP as well
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    rotary_dim: int | None = None  # rotated dims of each head (None = all of them; 0 = no RoPE)
    learned_positions: bool = False  # GPT-2: a position embedding added to the token embedding
    layer_windows: tuple = ()  # per layer: its sliding window, or None (() = no layer has one)
    layer_rope: tuple = ()  # per layer: which RoPE table it reads (() = table 0 everywhere)
    rope_limit: int | None = None  # LongRoPE: its short-factor tables hold for texts up to this many tokens

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_index(self, layer: int) -> int:
        return self.layer_rope[layer] if self.layer_rope else 0

    @property
    def fusable(self) -> bool:
        """True when the fused Triton layer (RMSNorm, SiLU-gated MLP, full RoPE) computes this family."""
        return (self.norm == "rms" and self.act == "silu" and self.gated and not self.mlp_bias
                and self.attn_softcap is None and not self.sandwich_norms and not self.parallel_residual
                and self.rotary_dim is None)


@dataclass(frozen=True)
class LlamaShape:
    """The numbers that define a forward pass (the family's differences in `arch`)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5  # (of every norm, LayerNorm included)
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 (and Llama/Qwen3 with attention_bias, GPT-2, NeoX)
    o_bias: bool = False  # Llama/Qwen3 with attention_bias, GPT-2, NeoX
    qk_norm: bool = False  # Qwen3, Gemma 3: a norm over each q and k head before RoPE
    sliding_window: int | None = None  # the widest attention window of any layer (per layer: arch.layer_windows)
    max_positions: int | None = None  # the config's max_position_embeddings
    arch: Arch = field(default_factory=Arch)

    @property
    def context(self) -> int | None:
        """The longest text the model computes exactly (max_position_embeddings, or LongRoPE's short range)."""
        limits = [n for n in (self.max_positions, self.arch.rope_limit) if n]
        return min(limits) if limits else None

    @classmethod
    def from_hf(cls, config) -> "LlamaShape":
        """The shape of a transformers config of one of `FAMILIES`; anything else is refused (ValueError)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in FAMILIES:
            raise ValueError(f"the fast model covers model_type {', '.join(FAMILIES)}; got {model_type!r} "
                             "(other models run on the transformers path: engine='hf')")
        if model_type == "gpt2":
            return _gpt2_shape(config)
        if model_type == "gemma3":  # the vision-language wrapper: its language model, on text
            shape = cls.from_hf(config.text_config)
            tied = bool(getattr(config, "tie_word_embeddings", shape.tie_word_embeddings))
            return dataclasses.replace(shape, tie_word_embeddings=tied)
        if getattr(config, "mlp_bias", False):
            raise ValueError(f"{model_type} checkpoints with mlp_bias are not covered by the fast model")
        act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
        act = _ACTIVATIONS.get(act_name)
        if act is None or (model_type not in ("gpt_neox", "starcoder2", *_GEMMA) and act != "silu"):
            raise ValueError(f"the fast model does not cover hidden_act={act_name!r} for {model_type}")
        rope = _rope_params(config)
        rope_types = {p.get("rope_type", p.get("type", "default")) for p in rope.values()}
        if rope_types & {"dynamic"}:
            raise ValueError("RoPE type 'dynamic' depends on the text length; the fast model does not cover it")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        partial = float(next(iter(rope.values())).get("partial_rotary_factor",
                                                      getattr(config, "partial_rotary_factor", 1.0)))
        rotary_dim = int(head_dim * partial)
        if rotary_dim != head_dim and model_type not in ("phi3", "gpt_neox"):
            raise ValueError(f"partial rotary ({partial}) is not covered for {model_type}")
        windows = _layer_windows(config)
        attention_bias = bool(getattr(config, "attention_bias", model_type == "gpt_neox"))
        layer_norm = model_type in ("gpt_neox", "starcoder2")  # (with biases)
        if model_type == "starcoder2":
            attention_bias = bool(config.use_bias)
        arch = Arch(
            norm="layer" if layer_norm else "rms1p" if model_type in _GEMMA else "rms",
            act=act, gated=not layer_norm, mlp_bias=model_type == "gpt_neox" or attention_bias and layer_norm,
            embed_scale=(config.hidden_size ** 0.5 if model_type in _GEMMA else
                         float(config.embedding_multiplier) if model_type == "granite" else None),
            round_embed_scale=model_type != "granite",
            logit_scale=float(config.logits_scaling) if model_type == "granite" else None,
            attn_scale=(config.query_pre_attn_scalar ** -0.5 if model_type in ("gemma2", "gemma3_text") else
                        float(config.attention_multiplier) if model_type == "granite" else None),
            attn_softcap=getattr(config, "attn_logit_softcapping", None) if model_type != "gemma" else None,
            final_softcap=getattr(config, "final_logit_softcapping", None) if model_type != "gemma" else None,
            sandwich_norms=model_type in ("gemma2", "gemma3_text"),
            parallel_residual=model_type == "gpt_neox" and bool(config.use_parallel_residual),
            rotary_dim=None if rotary_dim == head_dim else rotary_dim,
            layer_windows=windows,
            layer_rope=_layer_rope(config),
            rope_limit=_longrope_limit(config, rope),
        )
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention is not a decoder: the fast model does not cover it")
        eps = (getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", None)
               or getattr(config, "norm_epsilon", None))
        return cls(
            vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=config.num_hidden_layers,
            n_heads=heads, head_dim=head_dim,
            n_kv_heads=heads if model_type == "gpt_neox" else getattr(config, "num_key_value_heads", None) or heads,
            intermediate_size=config.intermediate_size, rms_norm_eps=float(eps),
            rope_theta=float(next(iter(rope.values())).get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            sliding_window=max((w for w in windows if w), default=None),
            max_positions=getattr(config, "max_position_embeddings", None),
            arch=arch,
        )

    @property
    def num_parameters(self) -> int:  # biases and norms other than one weight per norm (a few thousand) left out
        qkv = self.dim * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        mlp = (3 if self.arch.gated else 2) * self.dim * self.intermediate_size
        norms = (4 if self.arch.sandwich_norms else 2) * self.dim
        layer = qkv + self.n_heads * self.head_dim * self.dim + mlp + norms
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.dim
        return self.n_layers * layer + self.vocab_size * self.dim + head + self.dim


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kind: str, eps: float) -> torch.Tensor:
    """The family's norm over the last dim: "rms" x̂·w; "rms1p" Gemma's, in float32 (`weight` holds 1 + w);
    "layer" LayerNorm with a bias."""
    if kind == "layer":
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if kind == "rms1p":
        return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def mlp_activation(up: torch.Tensor, arch: Arch) -> torch.Tensor:
    """The MLP's inner activations from its first projection `[N, 2I]` (gated: act(gate)·up) or `[N, I]`."""
    gate, up = up.chunk(2, dim=-1) if arch.gated else (up, None)
    if arch.act == "silu":
        act = F.silu(gate)
    else:
        act = F.gelu(gate, approximate="tanh" if arch.act == "gelu_tanh" else "none")
    return act if up is None else act * up


def rope_table(inv_freq: torch.Tensor, scaling: float, num_positions: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, signed sin `[P, R]` in `dtype` as transformers computes them (float32, then cast): rotate_half(x)·sin ==
    roll(x, R/2)·[−sin_lo, sin_hi], so RoPE is a roll and a multiply-add."""
    freqs = torch.arange(num_positions, device=inv_freq.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)
    half = freqs.shape[1]
    return cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)


def _gpt2_shape(config) -> LlamaShape:
    for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if getattr(config, option, False):
            raise ValueError(f"gpt2 with {option}=True is not covered by the fast model")
    if not getattr(config, "scale_attn_weights", True):
        raise ValueError("gpt2 with scale_attn_weights=False is not covered by the fast model")
    act = _ACTIVATIONS.get(config.activation_function)
    if act not in ("gelu_tanh", "gelu"):
        raise ValueError(f"the fast model does not cover activation_function={config.activation_function!r}")
    dim, heads = config.n_embd, config.n_head
    arch = Arch(norm="layer", act=act, gated=False, mlp_bias=True, rotary_dim=0, learned_positions=True)
    return LlamaShape(vocab_size=config.vocab_size, dim=dim, n_layers=config.n_layer, n_heads=heads, n_kv_heads=heads,
                      head_dim=dim // heads, intermediate_size=config.n_inner or 4 * dim,
                      rms_norm_eps=float(config.layer_norm_epsilon),
                      tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)), qkv_bias=True,
                      o_bias=True, max_positions=config.n_positions, arch=arch)


def _rope_params(config) -> dict:
    """{layer type or "all": RoPE parameters} (Gemma 3 keeps one set per layer type)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return {"all": {}}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return dict(rope)
    return {"all": rope}


def _longrope_limit(config, rope: dict) -> int | None:
    for params in rope.values():
        if params.get("rope_type", params.get("type")) == "longrope":
            limit = params.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", None)
            if not limit:
                raise ValueError("a LongRoPE config without original_max_position_embeddings is not covered")
            return int(limit)
    return None


def _layer_rope(config) -> tuple:
    """Each layer's RoPE table: Gemma 3 one per layer type present (sorted); SmolLM3 table 1 = identity (NoPE)."""
    if config.model_type == "gemma3_text":
        types = config.layer_types
        return tuple(sorted(set(types)).index(t) for t in types)
    if config.model_type == "smollm3" and not all(config.no_rope_layers):
        return tuple(0 if use else 1 for use in config.no_rope_layers)
    return ()


def _layer_windows(config) -> tuple:
    """Each layer's attention window (None = global), or () when no layer has one."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return ()
    if not getattr(config, "use_sliding_window", True):  # Qwen2, SmolLM3: windows only when switched on
        return ()
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return (int(window),) * config.num_hidden_layers
    unknown = set(layer_types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not covered by the fast model")
    if "sliding_attention" not in layer_types:
        return ()
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
