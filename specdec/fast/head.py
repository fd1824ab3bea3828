"""A feature-level draft head (EAGLE-style): one decoder layer that reads the target's last hidden state.

Terms (positions are the target's):
  feature f_t     the target's final-normed hidden state at position t (what its LM head reads)
  head step       input (f_t, token_{t+1}) at position t → f̂_{t+1}, the head's own final-normed output;
                  logits = the target's LM head(f̂_{t+1}) → q for token_{t+2}
  drafting        continues on its own predictions: (f̂_{t+1}, drafted token_{t+2}) → f̂_{t+2} → ...

The head is `fc: [2·dim → dim]` over concat(target_embed[token_{t+1}], f_t) feeding a one-layer `FastLlama`
(its own attention, MLP and final norm; its token embedding is a 1-row placeholder it never reads). The
token embedding and the LM head are the TARGET's tensors, shared (bound with `bind`, never copied or saved).

Reduced draft vocabulary (`HeadConfig.draft_vocab_size`, the ids in the `draft_vocab` buffer): the head then
scores only those N tokens with the target's LM head rows for them (gathered once at `bind`; N·dim instead of
V·dim multiply-adds per drafted token: the LM head is most of a one-layer head's cost on a CPU), and its
logits over the full vocabulary are those N scores with the float32 minimum elsewhere, so q — the softmax the
engine samples from — is the reduced softmax mapped into the full vocabulary, exactly 0 outside it.

A head is saved as a small folder: `feature_head.json` (the target shape numbers it was trained for and its
layer's numbers) and `model.safetensors` (fc, the layer, its norms). Never pickled.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.fast.kernels import cpu_linear
from specdec.fast.model import FastLlama, KVCache, LlamaShape
from specdec.fast.quant.kernel import quant_linear
from specdec.fast.quant.weight import QuantWeight, embedding, quantized

__all__ = ["HeadConfig", "FeatureHead", "is_feature_head", "load_feature_head", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "feature_head.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "specdec-feature-head"
VERSION = 1


@dataclass(frozen=True)
class HeadConfig:
    """The target numbers a head is trained for (vocab_size, dim; target_layers informational) and its layer's."""

    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int | None = None
    target_layers: int | None = None
    draft_vocab_size: int | None = None  # None: the head may propose any token; N: only the N in `draft_vocab`

    @classmethod
    def for_target(cls, shape: LlamaShape, **overrides) -> "HeadConfig":
        """A head shaped like one layer of the target `shape` (RoPE: the default, at the target's theta)."""
        base = dict(vocab_size=shape.vocab_size, dim=shape.dim, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads,
                    head_dim=shape.head_dim, intermediate_size=shape.intermediate_size,
                    rms_norm_eps=shape.rms_norm_eps, rope_theta=shape.rope_theta, max_positions=shape.max_positions,
                    target_layers=shape.n_layers)
        return cls(**{**base, **overrides})

    def layer_shape(self) -> LlamaShape:
        """The head's one-layer decoder (vocabulary 1: its token embedding is never read)."""
        return LlamaShape(vocab_size=1, dim=self.dim, n_layers=1, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                          head_dim=self.head_dim, intermediate_size=self.intermediate_size,
                          rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, tie_word_embeddings=True,
                          max_positions=self.max_positions)


class FeatureHead(torch.nn.Module):
    """fc + a one-layer `FastLlama`; `bind(target)` shares the target's embedding and LM head."""

    def __init__(self, config: HeadConfig, *, layer: FastLlama | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if not isinstance(config, HeadConfig):
            raise TypeError(f"config must be a HeadConfig, got {type(config).__name__}")
        self.config = config
        if layer is None:
            layer = FastLlama(config.layer_shape(), device=device, dtype=dtype)
        elif layer.shape.n_layers != 1 or layer.shape.dim != config.dim:
            raise ValueError(f"layer must be a one-layer FastLlama of width {config.dim}, got "
                             f"{layer.shape.n_layers} layers of width {layer.shape.dim}")
        self.layer = layer
        self.fc = torch.nn.Parameter(torch.zeros(config.dim, 2 * config.dim, device=layer.device, dtype=layer.dtype),
                                     requires_grad=False)
        n = config.draft_vocab_size
        if n is not None and not 1 <= n <= config.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, {config.vocab_size}], got {n}")
        self.register_buffer("draft_vocab", None if n is None else torch.arange(n, device=layer.device))
        self._draft_lm_head: torch.Tensor | None = None  # the target's LM head rows of draft_vocab (at bind)
        self._draft_quant = None  # the same rows still quantized, where the target's head is (`fast.quant`)
        self._target: tuple[FastLlama, ...] = ()  # a tuple, so the target's weights are not this module's

    # ------------------------------------------------------------------------------------------ binding
    @property
    def target(self) -> FastLlama:
        if not self._target:
            raise ValueError("this FeatureHead is not bound to a target: call head.bind(target) first")
        return self._target[0]

    def bind(self, target: FastLlama, name: str = "target") -> "FeatureHead":
        """Share `target`'s token embedding and LM head (checked: same width and vocabulary); returns self."""
        check_matches(self.config, target.shape, name)
        self._target = (target,)
        self._draft_lm_head = self._draft_quant = None
        if self.draft_vocab is not None:
            self._draft_lm_head = target.lm_head.detach().index_select(0, self.draft_vocab.to(target.lm_head.device))
            quant = quantized(target.lm_head)  # a GGUF's head kept quantized: its rows too (a quarter of the bytes)
            if isinstance(quant, QuantWeight) and self.device.type == "cpu":
                self._draft_quant = quant.select_rows(self.draft_vocab.cpu())
        self.layer.cpu_attention = getattr(target, "cpu_attention", False)  # (the target's CPU decode attention, `fast.quant.attention`)
        self.use_quantized_products(isinstance(quantized(target.lm_head), QuantWeight))
        return self

    def _linear_weights(self) -> list:
        return [self.fc] + [p for name, p in self.layer.named_parameters()
                            if name.split(".")[0] in ("wqkv", "wo", "w_gate_up", "w_down")]

    def use_quantized_products(self, on: bool) -> "FeatureHead":
        """`on` (what `bind` passes: whether the target's LM head is GGUF blocks on `fast.quant`'s kernel): fc and
        the layer's linears multiply through 8-bit block copies (`fast.quant.dense`; the dense tensors stay), on a
        float32 CPU head with the kernel built; off: dense products. Returns self."""
        from specdec.fast.quant import dense
        from specdec.fast.quant.kernel import kernel_available

        dense.detach(self._linear_weights())
        if on and self.device.type == "cpu" and self.dtype == torch.float32 and kernel_available():
            dense.attach(self._linear_weights())
        return self

    def set_draft_vocab(self, token_ids: torch.Tensor) -> "FeatureHead":
        """Restrict drafting to `token_ids` (distinct ids in [0, vocab_size)); unbinds (call `bind` again)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().unique()  # sorted
        if ids.numel() != torch.as_tensor(token_ids).numel():
            raise ValueError("draft vocabulary: token ids must be distinct")
        if ids.numel() == 0 or ids[0] < 0 or ids[-1] >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary: token ids must lie in [0, {self.config.vocab_size})")
        self.config = replace(self.config, draft_vocab_size=int(ids.numel()))
        self.draft_vocab = ids.to(self.fc.device)
        self._target, self._draft_lm_head, self._draft_quant = (), None, None
        return self

    @property
    def device(self) -> torch.device:
        return self.fc.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    # ------------------------------------------------------------------------------------------ forward
    def inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """fc(concat(target_embed[next_tokens], features)): `[B, k, dim]`, `[B, k]` → `[B, k, dim]`."""
        embedded = embedding(next_tokens, self.target.embed).to(self.dtype)  # (a quantized target's: its rows)
        x = torch.cat([embedded, features.to(self.dtype)], -1)
        quant = quantized(self.fc)  # (an 8-bit copy on the quantized CPU path: `_quantize_products`)
        return quant_linear(x, quant) if quant is not None else cpu_linear.linear(x, self.fc)  # (F.linear off CPU)

    feature_layers = None  # reads the target's final-normed state (see `FastLlama.feature_layers`)

    @property
    def feature_dim(self) -> int:
        return self.config.dim

    feedback_inputs = inputs  # its own predicted features go through fc like the target's

    def step(self, hidden: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One head step on its own previous prediction: `[B, k, dim]`, `[B, k]` → `[B, k, dim]`."""
        return self(hidden, next_tokens, cache)

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache,
                valid: torch.Tensor | None = None, *, last_only: bool = False) -> torch.Tensor:
        """Head steps at the cache's next positions: (f_t `[B, k, dim]`, token_{t+1} `[B, k]`) → f̂_{t+1} `[B, k, dim]`
        (`[B, 1, dim]` with last_only). Writes the head's KV cache like `FastLlama.forward`."""
        _, hidden = self.layer(None, cache, valid, embeds=self.inputs(features, next_tokens), last_only=last_only,
                               return_hidden=True, compute_logits=False)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head on predicted features: `[B, k, dim]` → float32 `[B, k, V]` (with a draft vocabulary:
        its N scores, the float32 minimum at every other token, whose softmax weight is exactly 0)."""
        target = self.target
        if self._draft_lm_head is None:
            return target._logits(hidden.to(target.dtype))
        if self._draft_quant is not None:
            scores = quant_linear(hidden.to(torch.float32), self._draft_quant)  # [B, k, N]
        else:
            scores = cpu_linear.linear(hidden.to(target.dtype), self._draft_lm_head).float()  # [B, k, N] (F.linear off CPU)
        full = scores.new_full((*scores.shape[:-1], self.config.vocab_size), torch.finfo(torch.float32).min)
        return full.scatter_(-1, self.draft_vocab.expand(*scores.shape[:-1], -1), scores)

    def copy_to(self, device, dtype: torch.dtype) -> "FeatureHead":
        """A copy on `device` in `dtype` (unbound; RoPE frequencies stay float32, unlike `Module.to`)."""
        head = FeatureHead(self.config, device=device, dtype=dtype)
        params = dict(head.named_parameters())
        with torch.no_grad():
            for key, value in self.named_parameters():
                params[key].copy_(value)
            if self.draft_vocab is not None:
                head.draft_vocab.copy_(self.draft_vocab)
        return head.eval()

    # ------------------------------------------------------------------------------------------ save/load
    def save(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write `feature_head.json` + `model.safetensors` (fc, the layer, its norms in `dtype`; never the target's
        tensors). `load` casts them to the dtype it is asked for."""
        from safetensors.torch import save_file

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"fc": self.fc}
        if self.draft_vocab is not None:
            tensors["draft_vocab"] = self.draft_vocab
        for name, param in self.layer.named_parameters():
            if name not in ("embed", "lm_head"):
                tensors[f"layer.{name}"] = param
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        save_file({k: v.detach().cpu().contiguous() if k == "draft_vocab" else v.detach().cpu().to(dtype).contiguous()
                   for k, v in tensors.items()}, str(out / WEIGHTS_NAME))
        meta = {"format": FORMAT, "version": VERSION, **asdict(self.config)}
        (out / CONFIG_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        return out

    @classmethod
    def load(cls, folder: str | os.PathLike, *, target: FastLlama | None = None, device=None,
             dtype: torch.dtype | None = None, name: str = "target") -> "FeatureHead":
        """Load a saved head (refused before reading weights when `target`'s width/vocabulary differ; then bound)."""
        config = read_config(folder)
        if target is not None:
            check_matches(config, target.shape, name)
            device = target.device if device is None else device
            dtype = target.dtype if dtype is None else dtype
        from safetensors.torch import load_file

        head = cls(config, device=device or "cpu", dtype=dtype or torch.float32)
        state = load_file(str(Path(folder) / WEIGHTS_NAME))
        expected = {"fc"} | {f"layer.{n}" for n, _ in head.layer.named_parameters() if n not in ("embed", "lm_head")}
        if config.draft_vocab_size is not None:
            expected.add("draft_vocab")
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(f"{folder}: not a feature head of this shape (missing {missing}, unexpected {extra})")
        params = dict(head.named_parameters())
        if "draft_vocab" in state:
            ids = state.pop("draft_vocab")
            if ids.dtype != torch.int64 or ids.shape != (config.draft_vocab_size,):
                raise ValueError(f"{folder}: draft_vocab must be {config.draft_vocab_size} int64 ids")
            head.set_draft_vocab(ids)
        with torch.no_grad():
            for key, value in state.items():
                param = params[key]
                if param.shape != value.shape:
                    raise ValueError(f"{folder}: {key} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
                param.copy_(value.to(param.dtype))
            head.layer.embed.zero_()
        return head.bind(target, name) if target is not None else head.eval()


def check_matches(config: HeadConfig, shape: LlamaShape, name: str = "target") -> None:
    """A head only drafts for targets of the width and vocabulary it was trained for (ValueError naming `name`)."""
    if config.dim != shape.dim or config.vocab_size != shape.vocab_size:
        raise ValueError(f"{name}: the feature head was trained for a target of dim {config.dim} and vocabulary "
                         f"{config.vocab_size}; this one has dim {shape.dim} and vocabulary {shape.vocab_size}")


def read_config(folder: str | os.PathLike) -> HeadConfig:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"{folder} is not a feature head folder (no {CONFIG_NAME})")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} config")
    known = {f.name for f in fields(HeadConfig)}
    return HeadConfig(**{k: v for k, v in meta.items() if k in known})


def is_feature_head(obj) -> bool:
    """True for a `FeatureHead` or a folder holding one."""
    if isinstance(obj, FeatureHead):
        return True
    if isinstance(obj, (str, os.PathLike)):
        return (Path(obj) / CONFIG_NAME).is_file()
    return False


def load_feature_head(obj, target: FastLlama, name: str = "drafter") -> FeatureHead:
    """A `FeatureHead` (or folder) bound to `target`, on its device and dtype (a copy when `obj` is elsewhere,
    in another dtype, or already bound to another target)."""
    if isinstance(obj, FeatureHead):
        check_matches(obj.config, target.shape, name)
        if obj.device != target.device or obj.dtype != target.dtype or (obj._target and obj._target[0] is not target):
            obj = obj.copy_to(target.device, target.dtype)  # never rebind a head another target drafts with
        return obj.bind(target, name)
    return FeatureHead.load(obj, target=target, name=name)
