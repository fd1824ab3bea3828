"""A compact T5 (v1.0 relu, v1.1 gated-gelu): encoder and decoder with fused weights and a static per-row cache.

Terms (as in `specdec.fast.model`):
  slot        row b's decoder token at position t lives in self-attention slot t; rollback moves `lengths`.
  junk slot   the last slot, never attended to: padding tokens (valid == False) write there.
  source      the encoder output of a request, padded to a fixed width T (a power of two, so a handful of
              shapes serve every request); `cross_bias [B, 1, 1, T]` is 0 at real encoder tokens, −inf at padding.
  cross K/V   each layer's cross-attention keys/values `[B, H, T, D]`, computed once per request
              (`FastT5.encode_into`: the encoder, then one GEMM for all layers) and read by every decode step.

T5 specifics, as transformers' `T5Attention`: no 1/√d scaling of q·k; the first layer's relative position
bias (unidirectional buckets in the decoder: a query at position p attending slot s uses bucket(p − s))
is shared by every layer's self-attention; cross-attention has no position bias; RMS norm without mean or
bias; decoder outputs scaled by d_model^-0.5 before the LM head when the config says so (T5 v1.0, tied).
The encoder's self-attention uses the bidirectional buckets of its own first layer's bias and a key
padding mask (padding never changes a real token's output). `encode_into` and `forward` have no host
syncs: with fixed shapes both can be captured in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from specdec.fast.kernels.attention import SDPA_BACKENDS
from specdec.fast.model import KVCache

__all__ = ["T5Shape", "T5Cache", "FastT5", "check_t5"]

# dense_act_fn (from feed_forward_proj) → the activation; anything else is refused
_ACTIVATIONS = {
    "relu": F.relu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}


@dataclass(frozen=True)
class T5Shape:
    """The numbers that define a T5 decoder pass."""

    vocab_size: int
    dim: int
    n_layers: int  # decoder layers
    n_enc_layers: int
    n_heads: int
    head_dim: int  # d_kv
    ff: int  # d_ff
    gated: bool  # v1.1 (gated-gelu): act(wi_0 x) * wi_1 x; v1.0: act(wi x)
    act: str  # dense_act_fn
    eps: float
    num_buckets: int
    max_distance: int
    scale_outputs: bool  # multiply the final states by dim^-0.5 before the LM head

    @classmethod
    def from_hf(cls, config) -> "T5Shape":
        """The shape of a transformers T5 config; anything the fast decoder does not reproduce is refused."""
        model_type = getattr(config, "model_type", None)
        if model_type != "t5":
            raise ValueError(
                f"the fast encoder-decoder path covers model_type 't5'; got {model_type!r} "
                "(other models run on the transformers path)"
            )
        proj = str(getattr(config, "feed_forward_proj", "relu"))
        act = getattr(config, "dense_act_fn", proj.split("-")[-1])
        parts = proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or act not in _ACTIVATIONS:
            raise ValueError(
                f"the fast T5 decoder covers feed_forward_proj relu, gelu, silu and their gated- forms; got "
                f"{proj!r} (dense_act_fn {act!r})"
            )
        scale = getattr(config, "scale_decoder_outputs", None)  # transformers 5.x; 4.x: tie_word_embeddings
        if scale is None:
            scale = getattr(config, "tie_word_embeddings", True)
        return cls(
            vocab_size=config.vocab_size,
            dim=config.d_model,
            n_layers=config.num_decoder_layers if config.num_decoder_layers is not None else config.num_layers,
            n_enc_layers=config.num_layers,
            n_heads=config.num_heads,
            head_dim=config.d_kv,
            ff=config.d_ff,
            gated=len(parts) == 2,
            act=act,
            eps=float(config.layer_norm_epsilon),
            num_buckets=int(config.relative_attention_num_buckets),
            max_distance=int(config.relative_attention_max_distance),
            scale_outputs=bool(scale),
        )


@dataclass
class T5Cache(KVCache):
    """Self-attention K/V `[B, H, S, D]` per layer (slot S−1 = junk) and `lengths [B]` (a `KVCache`); `self_bias
    [S, H, S]`: the additive self-attention bias of a query at each position over every slot (relative position
    bias where it may look, −inf elsewhere); the request's source: cross K/V `[B, H, T, D]` per layer and
    `cross_bias [B, 1, 1, T]` (0 at real encoder tokens, −inf at padding)."""

    self_bias: torch.Tensor
    cross_keys: list[torch.Tensor]
    cross_values: list[torch.Tensor]
    cross_bias: torch.Tensor

    @property
    def source_width(self) -> int:
        return self.cross_bias.shape[-1]

    def select_rows(self, index: torch.Tensor) -> "T5Cache":
        pick = lambda ts: [t.index_select(0, index) for t in ts]  # noqa: E731
        return T5Cache(pick(self.keys), pick(self.values), self.lengths.index_select(0, index), self.self_bias,
                       pick(self.cross_keys), pick(self.cross_values), self.cross_bias.index_select(0, index))


def _buckets(relative: torch.Tensor, bidirectional: bool, shape: T5Shape) -> torch.Tensor:
    """transformers' bucket of each relative position (memory − query): the one definition of the bucketing."""
    from transformers.models.t5.modeling_t5 import T5Attention

    return T5Attention._relative_position_bucket(relative, bidirectional=bidirectional,
                                                 num_buckets=shape.num_buckets, max_distance=shape.max_distance)


def check_t5(model) -> T5Shape:
    """The shape of a transformers T5ForConditionalGeneration the fast T5 reproduces; TypeError/ValueError else."""
    config = getattr(model, "config", None)
    if config is None or not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a transformers T5ForConditionalGeneration, got {type(model).__name__}")
    shape = T5Shape.from_hf(config)
    if type(model).__name__ != "T5ForConditionalGeneration":
        raise ValueError(f"the fast T5 loads T5ForConditionalGeneration, got {type(model).__name__}")
    odd = sorted({str(p.dtype) for p in model.parameters() if not p.is_floating_point()})
    if odd:
        raise ValueError(f"the fast T5 needs floating-point weights; this model has {', '.join(odd)} (quantized?)")
    return shape


class FastT5(torch.nn.Module):
    """T5 encoder + decoder with fused weights (q|k|v; every decoder layer's cross k|v in one matrix; gated
    wi_0|wi_1). `encode_into(ids, mask, cache)` runs the encoder and fills the cross K/V; `forward(tokens,
    cache, valid)` appends decoder tokens. Built with `from_hf`.
    """

    def __init__(self, shape: T5Shape, *, device, dtype: torch.dtype):
        super().__init__()
        self.shape = s = shape
        inner = s.n_heads * s.head_dim

        def empty(*size):
            return torch.nn.Parameter(torch.empty(*size, device=device, dtype=dtype), requires_grad=False)

        def per_layer(*size, n=s.n_layers):
            return torch.nn.ParameterList([empty(*size) for _ in range(n)])

        def embedding():  # an nn.Embedding, so that analysis.op_cost_ratio counts it as a lookup
            return torch.nn.Embedding(s.vocab_size, s.dim, device=device, dtype=dtype).requires_grad_(False)

        ffn_in = (2 if s.gated else 1) * s.ff
        n_enc = s.n_enc_layers
        # encoder
        self.enc_embed = embedding()
        self.enc_attn_norm, self.enc_ff_norm = per_layer(s.dim, n=n_enc), per_layer(s.dim, n=n_enc)
        self.enc_wqkv, self.enc_wo = per_layer(3 * inner, s.dim, n=n_enc), per_layer(s.dim, inner, n=n_enc)
        self.enc_wi, self.enc_wff_out = per_layer(ffn_in, s.dim, n=n_enc), per_layer(s.dim, s.ff, n=n_enc)
        self.enc_final_norm = empty(s.dim)
        self.enc_bias_table = empty(2 * s.max_distance + 1, s.n_heads)  # by memory − query + max_distance
        # decoder
        self.embed = embedding()
        self.self_norm, self.cross_norm, self.ff_norm = per_layer(s.dim), per_layer(s.dim), per_layer(s.dim)
        self.wqkv, self.wo = per_layer(3 * inner, s.dim), per_layer(s.dim, inner)
        self.cross_wq, self.cross_wo = per_layer(inner, s.dim), per_layer(s.dim, inner)
        self.cross_wkv = empty(s.n_layers * 2 * inner, s.dim)  # [k_0; v_0; k_1; v_1; ...]
        self.wi, self.wff_out = per_layer(ffn_in, s.dim), per_layer(s.dim, s.ff)
        self.final_norm = empty(s.dim)  # folds the dim^-0.5 output scaling when the config has it
        self.lm_head = empty(s.vocab_size, s.dim)
        self.bias_table = empty(s.max_distance + 1, s.n_heads)  # by query − memory (saturates at max_distance)
        self.act = _ACTIVATIONS[s.act]
        self.start_token_id = 0
        self.config = None
        self.generation_config = None

    @classmethod
    def from_hf(cls, model, *, device=None, dtype: torch.dtype | None = None) -> "FastT5":
        """From a transformers `T5ForConditionalGeneration` (refused: other types, configs it does not cover)."""
        from specdec.models.seq2seq import decoder_start_token_id

        shape = check_t5(model)
        config = model.config
        params = dict(model.named_parameters())  # tied weights appear once, under their first name
        ref = params["shared.weight"]
        device = torch.device(device) if device is not None else ref.device
        dtype = dtype or ref.dtype
        fast = cls(shape, device=device, dtype=dtype)

        def get(*names):
            name = next(n for n in names if n in params)
            return params[name].detach().to(device=device, dtype=dtype)

        def ffn_in(ff):
            return torch.cat([get(ff + "wi_0.weight"), get(ff + "wi_1.weight")]) if shape.gated else get(ff + "wi.weight")

        s = shape
        with torch.no_grad():
            fast.enc_embed.weight.copy_(get("encoder.embed_tokens.weight", "shared.weight"))
            for i in range(s.n_enc_layers):
                pre = f"encoder.block.{i}.layer."
                att, ff = pre + "0.SelfAttention.", pre + "1.DenseReluDense."
                fast.enc_wqkv[i].copy_(torch.cat([get(att + n + ".weight") for n in "qkv"]))
                fast.enc_wo[i].copy_(get(att + "o.weight"))
                fast.enc_wi[i].copy_(ffn_in(ff))
                fast.enc_wff_out[i].copy_(get(ff + "wo.weight"))
                fast.enc_attn_norm[i].copy_(get(pre + "0.layer_norm.weight"))
                fast.enc_ff_norm[i].copy_(get(pre + "1.layer_norm.weight"))
            fast.enc_final_norm.copy_(get("encoder.final_layer_norm.weight"))
            table = params["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].detach()
            relative = torch.arange(-s.max_distance, s.max_distance + 1)
            fast.enc_bias_table.copy_(table[_buckets(relative, True, s).to(table.device)].to(device=device, dtype=dtype))

            fast.embed.weight.copy_(get("decoder.embed_tokens.weight", "shared.weight"))
            cross_kv = []
            for i in range(s.n_layers):
                pre = f"decoder.block.{i}.layer."
                att, cross, ff = pre + "0.SelfAttention.", pre + "1.EncDecAttention.", pre + "2.DenseReluDense."
                fast.wqkv[i].copy_(torch.cat([get(att + n + ".weight") for n in "qkv"]))
                fast.wo[i].copy_(get(att + "o.weight"))
                fast.cross_wq[i].copy_(get(cross + "q.weight"))
                fast.cross_wo[i].copy_(get(cross + "o.weight"))
                cross_kv += [get(cross + "k.weight"), get(cross + "v.weight")]
                fast.wi[i].copy_(ffn_in(ff))
                fast.wff_out[i].copy_(get(ff + "wo.weight"))
                fast.self_norm[i].copy_(get(pre + "0.layer_norm.weight"))
                fast.cross_norm[i].copy_(get(pre + "1.layer_norm.weight"))
                fast.ff_norm[i].copy_(get(pre + "2.layer_norm.weight"))
            fast.cross_wkv.copy_(torch.cat(cross_kv))
            final = params["decoder.final_layer_norm.weight"].detach().float()
            if s.scale_outputs:
                final = final * s.dim**-0.5
            fast.final_norm.copy_(final.to(device=device, dtype=dtype))
            fast.lm_head.copy_(get("lm_head.weight", "shared.weight"))
            table = params["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].detach()
            relative = -torch.arange(s.max_distance + 1)
            fast.bias_table.copy_(table[_buckets(relative, False, s).to(table.device)].to(device=device, dtype=dtype))
        fast.start_token_id = decoder_start_token_id(model)
        fast.config = config
        fast.generation_config = getattr(model, "generation_config", None)
        return fast.eval()

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    def new_cache(self, batch_size: int, num_slots: int, source_width: int) -> T5Cache:
        """A zeroed cache: ≥ `num_slots` usable slots (+1 junk, rounded up to 16) and `source_width` source slots."""
        s = self.shape
        total = (num_slots + 1 + 15) // 16 * 16

        def make(width):
            return torch.zeros(batch_size, s.n_heads, width, s.head_dim, device=self.device, dtype=self.dtype)

        slot = torch.arange(total, device=self.device)
        distance = slot[:, None] - slot[None, :]  # [query position, slot]
        self_bias = self.bias_table[distance.clamp(0, s.max_distance)].permute(0, 2, 1)  # [S, H, S]
        self_bias = self_bias.masked_fill(((distance < 0) | (slot[None, :] == total - 1))[:, None], float("-inf"))
        layers = range(s.n_layers)
        return T5Cache([make(total) for _ in layers], [make(total) for _ in layers],
                       torch.zeros(batch_size, dtype=torch.long, device=self.device), self_bias.contiguous(),
                       [make(source_width) for _ in layers], [make(source_width) for _ in layers],
                       torch.zeros(batch_size, 1, 1, source_width, device=self.device, dtype=self.dtype))

    # ------------------------------------------------------------------------------------------- blocks
    def _ffn(self, x: torch.Tensor, norm, wi, wo) -> torch.Tensor:
        h = F.rms_norm(x, (self.shape.dim,), norm, self.shape.eps)
        if self.shape.gated:
            gate, up = F.linear(h, wi).chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(F.linear(h, wi))
        return x + F.linear(h, wo)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, wo) -> torch.Tensor:
        """o(attention) of `q [B, H, k, D]` over `keys/values [B, H, S, D]` with additive `bias`; T5: no 1/√D."""
        batch, heads, k, dim = q.shape
        with sdpa_kernel(SDPA_BACKENDS):  # (no cuDNN: a plan built per new shape; see `kernels.attention`)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=1.0)
        return F.linear(out.transpose(1, 2).reshape(batch, k, heads * dim), wo)

    # ------------------------------------------------------------------------------------------- encoder
    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encoder output `[B, T, dim]` of right-padded `ids [B, T]` (`mask [B, T]`: 1 = real token)."""
        s = self.shape
        batch, width = ids.shape
        nh, hd = s.n_heads, s.head_dim
        index = torch.arange(width, device=ids.device)
        relative = (index[None, :] - index[:, None]).clamp(-s.max_distance, s.max_distance) + s.max_distance
        bias = self.enc_bias_table[relative].permute(2, 0, 1)[None]  # [1, H, T, T]
        bias = bias.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))  # [B, H, T, T]
        x = F.embedding(ids, self.enc_embed.weight)
        for i in range(s.n_enc_layers):
            h = F.rms_norm(x, (s.dim,), self.enc_attn_norm[i], s.eps)
            q, key, v = F.linear(h, self.enc_wqkv[i]).view(batch, width, 3, nh, hd).permute(2, 0, 3, 1, 4)
            x = x + self._attend(q, key, v, bias, self.enc_wo[i])
            x = self._ffn(x, self.enc_ff_norm[i], self.enc_wi[i], self.enc_wff_out[i])
        return F.rms_norm(x, (s.dim,), self.enc_final_norm, s.eps)

    def encode_into(self, ids: torch.Tensor, mask: torch.Tensor, cache: T5Cache) -> None:
        """Start a request in `cache`: encode `ids [B, T]` (`mask [B, T]`, T = the cache's source width), write
        every layer's cross K/V and the source mask, and empty the decoder cache (lengths = 0)."""
        s = self.shape
        batch, width = ids.shape
        kv = F.linear(self.encode(ids, mask), self.cross_wkv)  # [B, T, L·2·H·D]: one GEMM for every layer
        kv = kv.view(batch, width, s.n_layers, 2, s.n_heads, s.head_dim).permute(2, 3, 0, 4, 1, 5)
        for i in range(s.n_layers):
            cache.cross_keys[i].copy_(kv[i, 0])
            cache.cross_values[i].copy_(kv[i, 1])
        cache.cross_bias.copy_(torch.zeros_like(cache.cross_bias).masked_fill(~mask.bool()[:, None, None, :],
                                                                              float("-inf")))
        cache.lengths.zero_()

    # ------------------------------------------------------------------------------------------- decoder
    def forward(self, tokens: torch.Tensor, cache: T5Cache, valid: torch.Tensor | None = None, *,
                last_only: bool = False, advance: bool = True) -> torch.Tensor:
        """Append decoder `tokens [B, k]` at each row's own slots → float32 logits `[B, k, V]` (`[B, 1, V]` last_only).

        valid [B, k] (optional): False marks padding; a row's valid tokens go to slots lengths[b], lengths[b]+1, …
        in order, padding to the junk slot (its logits are meaningless). Position 0 always reads this model's
        decoder start token (a drafter shares the target's text, whose start id may differ).
        """
        s = self.shape
        batch, k = tokens.shape
        device = tokens.device
        total = cache.keys[0].shape[2]
        junk = total - 1
        if valid is None:
            positions = cache.lengths[:, None] + torch.arange(k, device=device)[None, :]
            slots = positions.clamp(max=junk)
            added = k
        else:
            valid_long = valid.long()
            positions = (cache.lengths[:, None] + valid_long.cumsum(1) - 1).clamp_min(0)
            slots = torch.where(valid, positions.clamp(max=junk), torch.full_like(positions, junk))
            added = valid_long.sum(1)
        tokens = torch.where(positions == 0, torch.full_like(tokens, self.start_token_id), tokens)
        self_bias = cache.self_bias[positions.clamp(max=junk)].transpose(1, 2).contiguous()  # [B, H, k, S]
        write_index = slots[:, None, :, None].expand(batch, s.n_heads, k, s.head_dim)

        nh, hd = s.n_heads, s.head_dim
        x = F.embedding(tokens, self.embed.weight)  # [B, k, dim]
        for i in range(s.n_layers):
            h = F.rms_norm(x, (s.dim,), self.self_norm[i], s.eps)
            q, key, v = F.linear(h, self.wqkv[i]).view(batch, k, 3, nh, hd).permute(2, 0, 3, 1, 4)  # [B, H, k, D]
            cache.keys[i].scatter_(2, write_index, key)
            cache.values[i].scatter_(2, write_index, v)
            x = x + self._attend(q, cache.keys[i], cache.values[i], self_bias, self.wo[i])
            h = F.rms_norm(x, (s.dim,), self.cross_norm[i], s.eps)
            q = F.linear(h, self.cross_wq[i]).view(batch, k, nh, hd).transpose(1, 2)
            x = x + self._attend(q, cache.cross_keys[i], cache.cross_values[i], cache.cross_bias, self.cross_wo[i])
            x = self._ffn(x, self.ff_norm[i], self.wi[i], self.wff_out[i])
        if last_only:
            x = x[:, -1:]
        x = F.rms_norm(x, (s.dim,), self.final_norm, s.eps)
        logits = F.linear(x, self.lm_head).float()
        if advance:
            cache.lengths.add_(added)
        return logits
