"""Published EAGLE heads (EAGLE-1/2, EAGLE-3) as the engine's feature drafters.

Terms (positions are the target's; an "entry" at position t is what the head reads there):
  EAGLE-1/2 (SafeAILab `cnets1.py`; vLLM `llama_eagle.py`)  entry = fc([embed(x_{t+1}); f_t]) (+ fc bias), f_t the
            target's final-normed state; one Llama layer WITHOUT its input norm; no final norm: the raw output
            r_{t+1} is fed back as the next entry's feature and read by the target's LM head.
  EAGLE-3 (SafeAILab `cnets.py`; vLLM `llama_eagle3.py`; `speculators` eagle3)  the target keeps the residual
            stream entering three of its layers (default 2, L//2, L−3) per position; entry = [embed(x_{t+1});
            fc(a_t)] (2·dim wide) into a layer whose q/k/v read [input_norm(embed); hidden_norm(h)] and whose
            residual is h (hidden_norm(h) with norm_before_residual); the raw output r is fed back as h (norm(r)
            with norm_output); logits = its own LM head(norm(r)) over a draft vocabulary of D tokens, mapped into
            the target's with `d2t` (target id = draft id + d2t[draft id]): -inf outside, so q is 0 there and q is
            exactly the law the engine draws from.

`EagleHead` shares the target's embedding (unless the checkpoint has its own) and, for EAGLE-1, its LM head;
`bind(target)` checks the widths and vocabularies. Checkpoint names and detection live in `specdec.drafters.formats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.fast.kernels.attention import slot_attention_bias, slot_attention_reference
from specdec.fast.model import FastLlama, KVCache, LlamaShape
from specdec.fast.quant.weight import embedding

__all__ = ["EagleConfig", "EagleLayer", "EagleHead"]


@dataclass(frozen=True)
class EagleConfig:
    """A published EAGLE head's numbers. version 1 = EAGLE-1/2 (and HASS), 3 = EAGLE-3.

    vocab_size / target_dim: the target's vocabulary and width it was trained for (checked at `bind`);
    dim ... rope_theta: its layer's; draft_vocab_size: rows of an EAGLE-3 LM head (None = the target's);
    feature_layers: EAGLE-3's target layers (whose input states it reads); the flags: see the module doc."""

    version: int
    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int | None = None
    target_dim: int | None = None
    draft_vocab_size: int | None = None
    feature_layers: tuple[int, ...] = ()
    fc_bias: bool = False
    own_embedding: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self):
        if self.version not in (1, 3):
            raise ValueError(f"EAGLE version must be 1 or 3, got {self.version!r}")
        if self.version == 3 and len(self.feature_layers) < 1:
            raise ValueError("an EAGLE-3 head needs the target layers it reads (feature_layers)")

    @property
    def fc_in(self) -> int:
        """fc's input width: [embed; feature] (EAGLE-1) or the concatenated target features (EAGLE-3)."""
        if self.version == 1:
            return 2 * self.dim
        return len(self.feature_layers) * (self.target_dim or self.dim)

    def layer_shape(self) -> LlamaShape:
        return LlamaShape(vocab_size=1, dim=self.dim, n_layers=1, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                          head_dim=self.head_dim, intermediate_size=self.intermediate_size,
                          rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, tie_word_embeddings=True,
                          max_positions=self.max_positions)


class EagleLayer(FastLlama):
    """An EAGLE head's one decoder layer (eager; inside the engine's graphs on CUDA). Its input is the entry
    (`[B, k, dim]` for EAGLE-1, `[B, k, 2·dim]` = [embed; h] for EAGLE-3); its output is the raw residual stream."""

    normed_output = False

    def __init__(self, config: EagleConfig, *, inv_freq: torch.Tensor | None = None, rope_scaling: float = 1.0,
                 device="cpu", dtype: torch.dtype = torch.float32):
        super().__init__(config.layer_shape(), inv_freq=inv_freq, rope_scaling=rope_scaling, device=device,
                         dtype=dtype, kernels="reference")
        self.eagle = config
        s = self.shape
        if config.version == 3:  # q|k|v read [input_norm(embed); hidden_norm(h)]
            qkv_out = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim
            self.wqkv[0] = torch.nn.Parameter(torch.empty(qkv_out, 2 * s.dim, device=device, dtype=dtype),
                                              requires_grad=False)
            self.hidden_norm = torch.nn.Parameter(torch.ones(s.dim, device=device, dtype=dtype), requires_grad=False)
        with torch.no_grad():
            self.final_norm.fill_(1.0)  # never read (normed_output is False)
            self.embed.zero_()  # never read: the entries come in as vectors

    def _fused(self, kernels: str | None = None) -> bool:
        return False

    def _eager_layers(self, x: torch.Tensor, cache: KVCache, rope_pos: torch.Tensor, slots: torch.Tensor,
                      tables: list, capture: list | None = None, attention: str = "reference",
                      tree=None, causal: bool = False) -> torch.Tensor:
        # (causal: a prefix hint the one layer does not need — it attends with the mask either way)
        if tree is not None:
            raise ValueError("an EAGLE head drafts chains: it does not score token trees")
        s, c = self.shape, self.eagle
        cos_table, sin_table = tables[0]
        batch, k = x.shape[:2]
        eps = s.rms_norm_eps
        if c.version == 3:
            embeds, hidden = x[..., : s.dim], x[..., s.dim :]
            normed = F.rms_norm(hidden, (s.dim,), self.hidden_norm, eps)
            residual = normed if c.norm_before_residual else hidden
            h = torch.cat([F.rms_norm(embeds, (s.dim,), self.attn_norm[0], eps), normed], -1)
        else:  # EAGLE-1's only layer has no input norm
            residual = h = x
        nq, nkv, hd = s.n_heads, s.n_kv_heads, s.head_dim
        q, key, v = F.linear(h, self.wqkv[0]).view(batch, k, nq + 2 * nkv, hd).split([nq, nkv, nkv], dim=2)
        cos, sin = cos_table[rope_pos][:, :, None, :], sin_table[rope_pos][:, :, None, :]
        q = q * cos + torch.roll(q, hd // 2, dims=-1) * sin  # (sin_table is signed: rotate_half as a roll)
        key = key * cos + torch.roll(key, hd // 2, dims=-1) * sin
        cache.write(0, cache.write_index(slots), key, v)  # (a static or a paged cache, `fast.cache`)
        keys, values = cache.layer(0)
        bias = slot_attention_bias(rope_pos, cache.span, nq // nkv, self.dtype)
        attn = slot_attention_reference(q, keys, values, rope_pos, bias=bias)
        x = residual + F.linear(attn.reshape(batch, k, nq * hd), self.wo[0])
        gate, up = F.linear(F.rms_norm(x, (s.dim,), self.mlp_norm[0], eps), self.w_gate_up[0]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w_down[0])


class EagleHead(torch.nn.Module):
    """fc + `EagleLayer` (+ EAGLE-3's norms, LM head and vocabulary map); see the module doc."""

    def __init__(self, config: EagleConfig, *, inv_freq: torch.Tensor | None = None, rope_scaling: float = 1.0,
                 device="cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.layer = EagleLayer(config, inv_freq=inv_freq, rope_scaling=rope_scaling, device=device, dtype=dtype)

        def param(*size, fill=None):
            t = torch.zeros(*size, device=device, dtype=dtype) if fill is None else \
                torch.full(size, fill, device=device, dtype=dtype)
            return torch.nn.Parameter(t, requires_grad=False)

        self.fc = param(config.dim, config.fc_in)
        self.fc_bias = param(config.dim) if config.fc_bias else None
        self.embed = param(config.vocab_size, config.dim) if config.own_embedding else None
        if config.version == 3:
            n, width = len(config.feature_layers), config.target_dim or config.dim
            self.norm = param(config.dim, fill=1.0)
            self.lm_head = param(config.draft_vocab_size or config.vocab_size, config.dim)
            self.input_norm = param(n * width, fill=1.0) if config.norm_before_fc else None
            self.fc_norms = param(n, width, fill=1.0) if config.fc_norm else None
            draft = config.draft_vocab_size or config.vocab_size
            self.register_buffer("draft_to_target", torch.arange(draft, device=device), persistent=False)
            self.mapped = draft != config.vocab_size  # False: draft id = target id (no scatter into the vocabulary)
        self._target: tuple[FastLlama, ...] = ()

    # ------------------------------------------------------------------------------------------ binding
    @property
    def target(self) -> FastLlama:
        if not self._target:
            raise ValueError("this EagleHead is not bound to a target: call head.bind(target) first")
        return self._target[0]

    def bind(self, target: FastLlama, name: str = "target") -> "EagleHead":
        """Read `target`'s embedding (unless the head has its own) and, for EAGLE-1, its LM head; checked first."""
        c, shape = self.config, target.shape
        width = c.target_dim or c.dim
        if width != shape.dim or c.vocab_size != shape.vocab_size:
            raise ValueError(f"{name}: the EAGLE-{c.version} head was trained for a target of hidden size {width} and "
                             f"vocabulary {c.vocab_size}; this one has hidden size {shape.dim} and vocabulary "
                             f"{shape.vocab_size}")
        if c.feature_layers and max(c.feature_layers) >= shape.n_layers:
            raise ValueError(f"{name}: the EAGLE-3 head reads target layers {list(c.feature_layers)}; this target has "
                             f"{shape.n_layers} layers")
        self._target = (target,)
        return self

    @property
    def device(self) -> torch.device:
        return self.fc.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """The target layers whose input states the engine keeps (None = the final-normed state)."""
        return tuple(sorted(self.config.feature_layers)) if self.config.version == 3 else None

    @property
    def feature_dim(self) -> int:
        """Width of the target features the head reads per position."""
        return self.config.fc_in if self.config.version == 3 else self.config.dim

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """EAGLE-3's draft vocabulary: target id of each draft id `[D]` (distinct, in [0, V); checked by the loader)."""
        self.draft_to_target.copy_(draft_to_target.to(self.draft_to_target.device))
        self.mapped = len(draft_to_target) != self.config.vocab_size or \
            not torch.equal(draft_to_target.cpu(), torch.arange(len(draft_to_target)))

    # ------------------------------------------------------------------------------------------ forward
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        table = self.embed if self.embed is not None else self.target.embed
        return embedding(tokens, table).to(self.dtype)  # (a quantized target's table: its rows dequantized)

    def inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Entries from target features `[B, k, feature_dim]` and tokens x_{t+1} `[B, k]` → `[B, k, layer input]`."""
        c, features = self.config, features.to(self.dtype)
        if c.version == 1:
            return F.linear(torch.cat([self._embed(next_tokens), features], -1), self.fc, self.fc_bias)
        if self.input_norm is not None:
            features = F.rms_norm(features, (features.shape[-1],), self.input_norm, c.rms_norm_eps)
        if self.fc_norms is not None:
            n, width = self.fc_norms.shape
            chunks = features.unflatten(-1, (n, width))
            features = (F.rms_norm(chunks, (width,), eps=c.rms_norm_eps) * self.fc_norms).flatten(-2)
        return torch.cat([self._embed(next_tokens), F.linear(features, self.fc)], -1)

    def feedback_inputs(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Entries from the head's own outputs r `[B, k, dim]` (drafting past the known features)."""
        c = self.config
        if c.version == 1:
            return F.linear(torch.cat([self._embed(next_tokens), hidden.to(self.dtype)], -1), self.fc, self.fc_bias)
        if c.norm_output:
            hidden = F.rms_norm(hidden, (c.dim,), self.norm, c.rms_norm_eps)
        return torch.cat([self._embed(next_tokens), hidden.to(self.dtype)], -1)

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache,
                valid: torch.Tensor | None = None, *, last_only: bool = False) -> torch.Tensor:
        """Head steps over target features: `[B, k, feature_dim]`, `[B, k]` → r `[B, k, dim]` (`[B, 1, dim]`)."""
        _, hidden = self.layer(None, cache, valid, embeds=self.inputs(features, next_tokens), last_only=last_only,
                               return_hidden=True, compute_logits=False)
        return hidden

    def step(self, hidden: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One head step on its own previous output: `[B, k, dim]`, `[B, k]` → `[B, k, dim]`."""
        _, out = self.layer(None, cache, embeds=self.feedback_inputs(hidden, next_tokens), return_hidden=True,
                            compute_logits=False)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the TARGET's vocabulary `[B, k, V]` (EAGLE-3: -inf outside the draft vocabulary)."""
        c = self.config
        if c.version == 1:
            return self.target._logits(hidden.to(self.target.dtype))
        draft = F.linear(F.rms_norm(hidden, (c.dim,), self.norm, c.rms_norm_eps), self.lm_head).float()
        if not self.mapped:
            return draft
        out = draft.new_full((*draft.shape[:-1], c.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.draft_to_target, draft)

    def copy_to(self, device, dtype: torch.dtype) -> "EagleHead":
        """A copy on `device` in `dtype` (unbound)."""
        layer = self.layer
        head = EagleHead(self.config, inv_freq=layer.inv_freq, rope_scaling=layer.rope_scaling, device=device,
                         dtype=dtype)
        params = dict(head.named_parameters())
        with torch.no_grad():
            for key, value in self.named_parameters():
                params[key].copy_(value)
        if self.config.version == 3:
            head.set_vocab_map(self.draft_to_target)
        return head.eval()

