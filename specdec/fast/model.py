"""A compact Llama-family decoder (Llama 1/2/3, Mistral, Qwen2, Qwen3) in plain PyTorch with a static, per-row KV cache (gpt-fast style).

Terms:
  slot        one position of the KV cache along S. Row b's token at position t lives in slot t: prompts
              are right-padded, so a row's text is slots [0, lengths[b]) with no holes.
  lengths [B] tokens in each row's cache. A forward of k new tokens writes row b's slots
              [lengths[b], lengths[b] + k) (its own slots, per row) and advances lengths by k.
              Rollback (`crop`) only moves lengths: slots past it are invisible and later overwritten.
  junk slot   the last slot of the cache, never attended to: padding tokens (valid == False) write there.
  mask        a query at position t sees slots j <= t (and never the junk slot).

Weights are fused for batch-1 speed (one q|k|v matrix, one gate|up matrix). `FastLlama.from_hf` loads a
transformers `LlamaForCausalLM` (object or local folder); `FastLlama.random` builds random weights
directly on the device (the 8B-shaped system benchmark). Every forward is free of host syncs and,
with fixed shapes, can be captured in a CUDA graph.

kernels ("auto" | "triton" | "reference", an attribute and a constructor / `from_hf` / `random` argument):
"reference" runs the eager PyTorch layer; "triton" runs each layer in 8 launches + attention with the fused
kernels of `specdec.fast.kernels`: RMSNorm, q|k|v GEMM, (bias +) RoPE + KV write, attention, o GEMM (+ residual),
RMSNorm (+ o bias), gate|up GEMM, SiLU·mul, down GEMM (+ residual); "auto" is "triton" on CUDA where Triton
imports, else "reference".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.fast.kernels.attention import (slot_attention, slot_attention_bias, slot_attention_reference,
                                            triton_unsupported)
from specdec.fast.kernels.linear import FASTER_THAN_CUBLAS, linear
from specdec.fast.kernels.mlp import silu_mul
from specdec.fast.kernels.norm import add_rms_norm, rms_norm
from specdec.fast.kernels.rope import rope_cache_write
from specdec.fast.kernels.select import check_kernel, use_triton

__all__ = ["LlamaShape", "KVCache", "FastLlama"]


@dataclass(frozen=True)
class LlamaShape:
    """The numbers that define a Llama forward pass."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 (and Llama/Qwen3 with attention_bias)
    o_bias: bool = False  # Llama/Qwen3 with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each q and k head before RoPE
    sliding_window: int | None = None  # attention window of some layers (exact only for texts within it)
    max_positions: int | None = None  # the config's max_position_embeddings

    @classmethod
    def from_hf(cls, config) -> "LlamaShape":
        """The shape of a transformers Llama / Mistral / Qwen2 / Qwen3 config; anything else is refused."""
        model_type = getattr(config, "model_type", None)
        if model_type not in FAMILIES:
            raise ValueError(
                f"the fast model covers model_type {', '.join(FAMILIES)}; got {model_type!r} "
                "(other models run on the transformers path: engine='hf')"
            )
        if getattr(config, "mlp_bias", False):
            raise ValueError(f"{model_type} checkpoints with mlp_bias are not covered by the fast model")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"the fast model needs hidden_act='silu', got {config.hidden_act!r}")
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type in ("dynamic", "longrope"):
            raise ValueError(f"RoPE type {rope_type!r} depends on the text length; the fast model does not cover it")
        attention_bias = bool(getattr(config, "attention_bias", False))
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return cls(
            vocab_size=config.vocab_size,
            dim=config.hidden_size,
            n_layers=config.num_hidden_layers,
            n_heads=heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            sliding_window=_sliding_window(config),
            max_positions=getattr(config, "max_position_embeddings", None),
        )

    @property
    def num_parameters(self) -> int:  # biases and q/k norms (a few thousand weights) left out
        qkv = self.dim * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        layer = qkv + self.n_heads * self.head_dim * self.dim + 3 * self.dim * self.intermediate_size + 2 * self.dim
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.dim
        return self.n_layers * layer + self.vocab_size * self.dim + head + self.dim


FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _sliding_window(config) -> int | None:
    """The attention window of the layers that have one, or None when every layer attends to all."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    if getattr(config, "model_type", "") == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window)


@dataclass
class KVCache:
    """keys/values: one `[B, H_kv, S, D]` tensor per layer (slot S−1 is the junk slot); lengths `[B]`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @property
    def num_slots(self) -> int:
        """Usable slots (the junk slot excluded)."""
        return self.keys[0].shape[2] - 1

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def select_rows(self, index: torch.Tensor) -> "KVCache":
        return KVCache(
            [k.index_select(0, index) for k in self.keys],
            [v.index_select(0, index) for v in self.values],
            self.lengths.index_select(0, index),
        )


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class FastLlama(torch.nn.Module):
    """Llama decoder with fused weights; `forward(tokens, cache, ...)` reads and writes a `KVCache`."""

    normed_output = True  # forward applies the final norm (False: hidden states leave as the residual stream)

    def __init__(self, shape: LlamaShape, *, inv_freq: torch.Tensor | None = None, rope_scaling: float = 1.0,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, kernels: str = "auto"):
        super().__init__()
        self.shape = shape
        self.kernels = kernels
        # GEMMs of the fused path: "auto" = `kernels.linear`'s Triton kernel for the weights it measured faster on
        # (`FASTER_THAN_CUBLAS`, ≤ 16 rows on CUDA), cuBLAS for the rest; "triton" = that kernel for every weight it
        # covers; "reference" = cuBLAS always (scripts/bench_forward.py compares them).
        self.linear_kernel = "auto"
        s = shape
        qkv_out = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim

        def empty(*size):
            return torch.nn.Parameter(torch.empty(*size, device=device, dtype=dtype), requires_grad=False)

        self.embed = empty(s.vocab_size, s.dim)
        self.wqkv = torch.nn.ParameterList([empty(qkv_out, s.dim) for _ in range(s.n_layers)])
        self.wo = torch.nn.ParameterList([empty(s.dim, s.n_heads * s.head_dim) for _ in range(s.n_layers)])
        self.w_gate_up = torch.nn.ParameterList([empty(2 * s.intermediate_size, s.dim) for _ in range(s.n_layers)])
        self.w_down = torch.nn.ParameterList([empty(s.dim, s.intermediate_size) for _ in range(s.n_layers)])
        self.bqkv = torch.nn.ParameterList([empty(qkv_out) for _ in range(s.n_layers)]) if s.qkv_bias else None
        self.bo = torch.nn.ParameterList([empty(s.dim) for _ in range(s.n_layers)]) if s.o_bias else None
        self.q_norm = torch.nn.ParameterList([empty(s.head_dim) for _ in range(s.n_layers)]) if s.qk_norm else None
        self.k_norm = torch.nn.ParameterList([empty(s.head_dim) for _ in range(s.n_layers)]) if s.qk_norm else None
        self.attn_norm = torch.nn.ParameterList([empty(s.dim) for _ in range(s.n_layers)])
        self.mlp_norm = torch.nn.ParameterList([empty(s.dim) for _ in range(s.n_layers)])
        self.final_norm = empty(s.dim)
        self.lm_head = self.embed if s.tie_word_embeddings else empty(s.vocab_size, s.dim)
        if inv_freq is None:
            inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        self.register_buffer("inv_freq", inv_freq.detach().float().to(device), persistent=False)
        self.rope_scaling = float(rope_scaling)  # HF's `attention_scaling` (1.0 except for some rope types)
        self.config = None  # the transformers config, when loaded from one
        self.generation_config = None
        # What `return_hidden` returns: None = the final-normed states; layer ids = the residual stream entering each
        # of those layers, concatenated in layer order `[B, k, len·dim]` (EAGLE-3's low/mid/high target features)
        self.feature_layers: tuple[int, ...] | None = None
        self._rope_cache: tuple[int, torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------------------------------- loading
    @classmethod
    def random(cls, shape: LlamaShape, *, device="cuda", dtype=torch.bfloat16, std: float = 0.02,
               seed: int = 0, kernels: str = "auto") -> "FastLlama":
        """Random weights made on the device (fast even for 8B shapes). Benchmark use only."""
        model = cls(shape, device=device, dtype=dtype, kernels=kernels)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                elif name.startswith(("bqkv", "bo")):
                    p.zero_()
                else:
                    p.normal_(0.0, std, generator=gen)
        return model.eval()

    @classmethod
    def from_hf(cls, model, *, device=None, dtype: torch.dtype | None = None, kernels: str = "auto") -> "FastLlama":
        """Load a transformers Llama / Mistral / Qwen2 / Qwen3 causal LM (an object, or a local folder).

        A folder loads in the checkpoint's own dtype unless `dtype` is given (local files only, no remote code).
        """
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from transformers import AutoConfig, AutoModelForCausalLM  # dependency at the edge

            LlamaShape.from_hf(AutoConfig.from_pretrained(model, local_files_only=True))  # refuse before loading
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or "auto", local_files_only=True)
        config = model.config
        shape = LlamaShape.from_hf(config)
        params = dict(model.named_parameters())
        ref = params["model.embed_tokens.weight"]
        device = torch.device(device) if device is not None else ref.device
        dtype = dtype or ref.dtype
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        rope_type = getattr(rotary, "rope_type", "default")
        if rope_type == "dynamic":
            raise ValueError("FastLlama does not support dynamic RoPE scaling (its frequencies depend on the length)")
        inv_freq = getattr(rotary, "inv_freq", None)
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        fast = cls(shape, inv_freq=inv_freq, rope_scaling=scaling, device=device, dtype=dtype, kernels=kernels)

        def get(name):
            return params[name].detach().to(device=device, dtype=dtype)

        with torch.no_grad():
            fast.embed.copy_(get("model.embed_tokens.weight"))
            for i in range(shape.n_layers):
                pre = f"model.layers.{i}."
                attn, mlp = pre + "self_attn.", pre + "mlp."
                fast.wqkv[i].copy_(torch.cat([get(attn + n + ".weight") for n in ("q_proj", "k_proj", "v_proj")]))
                fast.wo[i].copy_(get(attn + "o_proj.weight"))
                fast.w_gate_up[i].copy_(torch.cat([get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight")]))
                fast.w_down[i].copy_(get(mlp + "down_proj.weight"))
                if shape.qkv_bias:
                    fast.bqkv[i].copy_(torch.cat([get(attn + n + ".bias") for n in ("q_proj", "k_proj", "v_proj")]))
                if shape.o_bias:
                    fast.bo[i].copy_(get(attn + "o_proj.bias"))
                if shape.qk_norm:
                    fast.q_norm[i].copy_(get(attn + "q_norm.weight"))
                    fast.k_norm[i].copy_(get(attn + "k_norm.weight"))
                fast.attn_norm[i].copy_(get(pre + "input_layernorm.weight"))
                fast.mlp_norm[i].copy_(get(pre + "post_attention_layernorm.weight"))
            fast.final_norm.copy_(get("model.norm.weight"))
            if not shape.tie_word_embeddings:
                fast.lm_head.copy_(get("lm_head.weight"))
        fast.config = config
        fast.generation_config = getattr(model, "generation_config", None)
        return fast.eval()

    # ------------------------------------------------------------------------------------------- helpers
    @property
    def kernels(self) -> str:
        """Which layer kernels forward runs: "auto", "triton" or "reference" (see the module doc)."""
        return self._kernels

    @kernels.setter
    def kernels(self, value: str) -> None:
        self._kernels = check_kernel(value, "kernels")

    def _fused(self, kernels: str | None = None) -> bool:
        """True when this forward runs the fused layer (host-side only: no sync, capture-safe)."""
        supported = self.shape.head_dim % 2 == 0 and self.shape.head_dim <= 1024
        return use_triton(self.kernels if kernels is None else kernels, self.device, supported, "FastLlama")

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read (every weight once; the embedding is only gathered)."""
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or name == "embed" and not self.shape.tie_word_embeddings:
                continue
            seen.add(id(p))
            total += p.numel() * p.element_size()
        return total

    def new_cache(self, batch_size: int, num_slots: int) -> KVCache:
        """A zeroed cache with at least `num_slots` usable slots (+1 junk slot, rounded up to 16)."""
        s = self.shape
        total = _round_up(num_slots + 1, 16)  # aligned for the fused attention kernels
        size = (batch_size, s.n_kv_heads, total, s.head_dim)
        make = lambda: torch.zeros(size, device=self.device, dtype=self.dtype)  # noqa: E731
        lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        return KVCache([make() for _ in range(s.n_layers)], [make() for _ in range(s.n_layers)], lengths)

    def rope_tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[P, D]` in the model dtype, as HF computes them (float32 then cast).

        Built once for the whole context (at least `num_positions`): captured graphs hold the tables'
        addresses, so a table must never be replaced by a larger one while graphs that read it live.
        """
        if self._rope_cache is None or self._rope_cache[0] < num_positions:
            if self._rope_cache is not None and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("RoPE tables must be built before CUDA graph capture")
            num_positions = max(num_positions, self.shape.max_positions or 0, 4096)
            pos = torch.arange(num_positions, device=self.device, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos = (emb.cos() * self.rope_scaling).to(self.dtype)
            sin = (emb.sin() * self.rope_scaling).to(self.dtype)
            half = self.shape.head_dim // 2
            # rotate_half(x) * sin == roll(x, D/2) * [-sin_lo, sin_hi]
            sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
            self._rope_cache = (num_positions, cos, sin_signed)
        return self._rope_cache[1], self._rope_cache[2]

    # ------------------------------------------------------------------------------------------- forward
    def _gemm(self, weight: torch.Tensor) -> str:
        """The `kernels.linear` mode for this weight on the fused path (see `linear_kernel`)."""
        mode = self.linear_kernel
        if mode == "auto" and tuple(weight.shape) not in FASTER_THAN_CUBLAS:
            return "reference"
        return mode

    def _row_parallel(self, x: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor,
                      kernel: str = "reference") -> torch.Tensor:
        """x += inp @ weightᵀ in place (`x [N, dim]`); a tensor-parallel subclass all-reduces the product.

        kernel: "reference" is cuBLAS's addmm_; otherwise `kernels.linear` (its weight-streaming kernel for few rows).
        """
        if kernel == "reference":
            return x.addmm_(inp, weight.t())
        return linear(inp, weight, residual=x, out=x, kernel=kernel)

    def _logits(self, x: torch.Tensor, kernel: str = "reference") -> torch.Tensor:
        """Float32 logits `[B, k, V]` of final hidden states `x [B, k, dim]`; a vocab-parallel subclass gathers them."""
        if kernel == "reference":
            return F.linear(x, self.lm_head).float()
        return linear(x, self.lm_head, kernel=kernel).float()

    def _eager_layers(self, x: torch.Tensor, cache: KVCache, rope_pos: torch.Tensor, slots: torch.Tensor,
                      cos_table: torch.Tensor, sin_table: torch.Tensor, capture: list | None = None) -> torch.Tensor:
        """The decoder layers in eager PyTorch (kernels="reference"): `x [B, k, dim]` → `[B, k, dim]`.
        capture (optional): appends a copy of the residual stream entering each layer of `feature_layers`."""
        s = self.shape
        batch, k = x.shape[:2]
        device = x.device
        # RoPE factors for the whole q|k|v block (v heads get cos = 1, sin = 0): rotating the contiguous block
        # keeps every elementwise kernel vectorized and `roll` copy-free for any k.
        nq, nkv, hd = s.n_heads, s.n_kv_heads, s.head_dim
        cos = torch.cat([cos_table[rope_pos][:, :, None, :].expand(batch, k, nq + nkv, hd),
                         torch.ones(batch, k, nkv, hd, device=device, dtype=self.dtype)], dim=2)
        sin = torch.cat([sin_table[rope_pos][:, :, None, :].expand(batch, k, nq + nkv, hd),
                         torch.zeros(batch, k, nkv, hd, device=device, dtype=self.dtype)], dim=2)
        write_index = slots[:, None, :, None].expand(batch, s.n_kv_heads, k, s.head_dim)
        bias = slot_attention_bias(rope_pos, cache.keys[0].shape[2], nq // nkv, self.dtype)  # one mask, every layer
        for i in range(s.n_layers):
            if capture is not None and i in self.feature_layers:
                capture.append(x.clone())
            h = F.rms_norm(x, (s.dim,), self.attn_norm[i], s.rms_norm_eps)
            qkv = F.linear(h, self.wqkv[i], self.bqkv[i] if s.qkv_bias else None).view(batch, k, nq + 2 * nkv, hd)
            if s.qk_norm:
                qkv = torch.cat([F.rms_norm(qkv[:, :, :nq], (hd,), self.q_norm[i], s.rms_norm_eps),
                                 F.rms_norm(qkv[:, :, nq : nq + nkv], (hd,), self.k_norm[i], s.rms_norm_eps),
                                 qkv[:, :, nq + nkv :]], dim=2)
            qkv = torch.addcmul(qkv * cos, torch.roll(qkv, hd // 2, dims=-1), sin)  # RoPE on q and k at once
            q, key, v = qkv[:, :, :nq], qkv[:, :, nq : nq + nkv], qkv[:, :, nq + nkv :]
            cache.keys[i].scatter_(2, write_index, key.transpose(1, 2))
            cache.values[i].scatter_(2, write_index, v.transpose(1, 2))
            attn = slot_attention_reference(q, cache.keys[i], cache.values[i], rope_pos, bias=bias)
            attn = attn.reshape(batch * k, nq * hd)
            x = self._row_parallel(x.view(batch * k, s.dim), attn, self.wo[i])  # residual add fused into the GEMM
            if s.o_bias:
                x = x + self.bo[i]
            h = F.rms_norm(x, (s.dim,), self.mlp_norm[i], s.rms_norm_eps)
            gate, up = F.linear(h, self.w_gate_up[i]).chunk(2, dim=-1)
            x = self._row_parallel(x, F.silu(gate) * up, self.w_down[i]).view(batch, k, s.dim)
        return x

    def _fused_layers(self, x: torch.Tensor, cache: KVCache, rope_pos: torch.Tensor, slots: torch.Tensor,
                      cos_table: torch.Tensor, sin_table: torch.Tensor, capture: list | None = None) -> torch.Tensor:
        """The decoder layers on the fused kernels: per layer RMSNorm, qkv GEMM, (bias +) RoPE + KV write, attention,
        o GEMM (+ residual), RMSNorm (+ o bias), gate|up GEMM, SiLU·mul, down GEMM (+ residual)."""
        s = self.shape
        batch, k = x.shape[:2]
        nq, hd, eps = s.n_heads, s.head_dim, s.rms_norm_eps
        mode = "triton"  # forward checked that the fused kernels run here; attention picks by the model's mode
        attn_kernel = None
        x = x.reshape(batch * k, s.dim)  # the residual stream, updated in place by the row-parallel GEMMs
        for i in range(s.n_layers):
            if capture is not None and i in self.feature_layers:
                capture.append(x.clone().view(batch, k, s.dim))
            h = rms_norm(x, self.attn_norm[i], eps, kernel=mode)
            qkv = linear(h, self.wqkv[i], kernel=self._gemm(self.wqkv[i])).view(batch, k, -1)  # (the bias is added by the RoPE kernel)
            q = rope_cache_write(qkv, cache.keys[i], cache.values[i], rope_pos, slots, cos_table, sin_table, nq,
                                 bias=self.bqkv[i] if s.qkv_bias else None,
                                 q_norm=self.q_norm[i] if s.qk_norm else None,
                                 k_norm=self.k_norm[i] if s.qk_norm else None, eps=eps, kernel=mode)
            if attn_kernel is None:  # "triton" insists only where the attention kernel covers the shape
                attn_kernel = self.kernels
                if attn_kernel == "triton" and triton_unsupported(q, cache.keys[i], cache.values[i], rope_pos):
                    attn_kernel = "reference"
            attn = slot_attention(q, cache.keys[i], cache.values[i], rope_pos, kernel=attn_kernel)
            x = self._row_parallel(x, attn.reshape(batch * k, nq * hd), self.wo[i], self._gemm(self.wo[i]))  # residual add in the GEMM
            if s.o_bias:
                x, h = add_rms_norm(x, self.bo[i], self.mlp_norm[i], eps, kernel=mode)
            else:
                h = rms_norm(x, self.mlp_norm[i], eps, kernel=mode)
            act = silu_mul(linear(h, self.w_gate_up[i], kernel=self._gemm(self.w_gate_up[i])), kernel=mode)
            x = self._row_parallel(x, act, self.w_down[i], self._gemm(self.w_down[i]))
        return x.view(batch, k, s.dim)

    def forward(self, tokens: torch.Tensor | None, cache: KVCache, valid: torch.Tensor | None = None,
                *, embeds: torch.Tensor | None = None, last_only: bool = False, advance: bool = True,
                return_hidden: bool = False, compute_logits: bool = True, kernels: str | None = None):
        """Append `tokens [B, k]` to each row at its own slots → logits `[B, k, V]` (float32).

        valid [B, k] (optional): False marks padding; a row's valid tokens are written contiguously from
        `cache.lengths[b]` in order, padding goes to the junk slot and its logits are meaningless.
        last_only: return logits of the last column only (`[B, 1, V]`). advance: move `cache.lengths`.
        embeds [B, k, dim] (optional): input vectors in place of `embed[tokens]` (tokens may then be None).
        return_hidden: return `(logits, hidden)`, hidden `[B, k, dim]` the final-normed states the LM head reads
        (what feature-level drafters consume; with `feature_layers` set, the states entering those layers
        `[B, k, len·dim]`); compute_logits=False skips the LM head (logits None).
        kernels: this call's kernels in place of `self.kernels` (the engine prefills eagerly on "reference":
        outside CUDA graphs each Triton launch costs the host tens of µs, cuBLAS/SDPA calls a few).
        No host synchronization: with fixed shapes this can be captured in a CUDA graph.
        """
        s = self.shape
        batch, k = (tokens if embeds is None else embeds).shape[:2]
        device = cache.lengths.device
        num_slots_total = cache.keys[0].shape[2]
        junk = num_slots_total - 1
        if valid is None:
            positions = cache.lengths[:, None] + torch.arange(k, device=device)[None, :]
            slots = positions.clamp(max=junk)  # past the end: junk (callers size the cache so this never happens)
            added = k
        else:
            valid_long = valid.long()
            positions = cache.lengths[:, None] + valid_long.cumsum(1) - 1
            positions = positions.clamp_min(0)
            slots = torch.where(valid, positions.clamp(max=junk), torch.full_like(positions, junk))
            added = valid_long.sum(1)
        cos_table, sin_table = self.rope_tables(num_slots_total)
        rope_pos = positions.clamp(max=junk)
        x = F.embedding(tokens, self.embed) if embeds is None else embeds.to(self.dtype, copy=True)  # [B, k, dim]
        # (a copy: the layers add to x in place, the caller's embeds stay as they were)
        if kernels is not None:
            check_kernel(kernels, "kernels")
        fused = self._fused(kernels)
        capture = [] if return_hidden and self.feature_layers else None
        layers = self._fused_layers if fused else self._eager_layers
        x = layers(x, cache, rope_pos, slots, cos_table, sin_table, capture)
        if last_only:
            x = x[:, -1:]
        if self.normed_output:  # (an EAGLE head's layer hands out its residual stream; the head norms it)
            x = F.rms_norm(x, (s.dim,), self.final_norm, s.rms_norm_eps)
        logits = self._logits(x, self._gemm(self.lm_head) if fused else "reference") if compute_logits else None
        if advance:
            cache.lengths.add_(added)
        if capture is not None:
            x = torch.cat([c[:, -1:] if last_only else c for c in capture], -1)
        return (logits, x) if return_hidden else logits
