"""`FastLlama`'s decoder layers (mixed into `specdec.fast.model.FastLlama`; its module doc has the terms).

`_eager_layers`: the layers in eager PyTorch, every family of `FAMILIES` (norms, activations, RoPE tables, sandwich
norms, parallel residuals, windows, soft-capping), its attention `slot_attention` (the Triton kernel on CUDA);
`_fused_layers`: the Llama body (`Arch.fusable`) on the fused kernels of `specdec.fast.kernels`. Both run the
batch-invariant GEMM and attention under `bitwise`. The GEMM helpers (`_gemm`, `_linear`, `_row_parallel`,
`_logits`) are what a tensor-parallel subclass overrides (`specdec.distributed.sharded`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.fast.cache import KVCache
from specdec.fast.families import mlp_activation, norm
from specdec.fast.kernels.attention import (causal_prefix_attention, slot_attention, slot_attention_bias,
                                             triton_unsupported)
from specdec.fast.kernels import cpu_linear
from specdec.fast.kernels.invariant import invariant_attention, invariant_linear
from specdec.fast.kernels.linear import FASTER_THAN_CUBLAS, linear
from specdec.fast.kernels.mlp import silu_mul
from specdec.fast.kernels.norm import add_rms_norm, rms_norm
from specdec.fast.kernels.rope import rope_cache_write
from specdec.fast.quant.attention import CPU_ATTENTION_MAX_QUERIES, cpu_attention
from specdec.fast.quant.kernel import kernel_available, quant_add_linear_, quant_linear
from specdec.fast.quant.weight import QuantWeight, quantized

__all__ = ["LlamaLayers"]


def _unless_bitwise(quant, kernel: str):
    if kernel == "bitwise" and not kernel_available():  # (q8_mm is row-count invariant; its BLAS fallback is not)
        raise ValueError(f"bitwise=True does not cover GGUF weights kept quantized ({quant.source}) without the "
                         "quantized kernel; set gguf_weights='dequantized' to run them in float32")
    return quant


class LlamaLayers:
    """The layer bodies and GEMM helpers of `FastLlama` (reads its weights, `shape`, `bitwise`, `kernels`)."""

    # (N, K) weight shapes that linear_kernel="auto" sends to the Triton GEMM; None = `linear.FASTER_THAN_CUBLAS`
    # (a measured set: `kernels.linear_choice.faster_shapes`)
    triton_linear_shapes: frozenset | None = None
    # the eager body's attention of up to CPU_ATTENTION_MAX_QUERIES new tokens a row on the CPU: `fast.quant.attention`
    # (row-count invariant, reads only the live slots) in place of SDPA; `fast.quant.attach` sets it on GGUF models
    cpu_attention = False

    def _gemm(self, weight: torch.Tensor) -> str:
        """The `kernels.linear` mode for this weight on the fused path (see `linear_kernel`); "bitwise" =
        `invariant_linear`."""
        if self.bitwise:
            return "bitwise"
        mode = self.linear_kernel
        faster = FASTER_THAN_CUBLAS if self.triton_linear_shapes is None else self.triton_linear_shapes
        if mode == "auto" and tuple(weight.shape) not in faster:
            return "reference"
        return mode

    def _row_parallel(self, x: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor,
                      kernel: str = "reference") -> torch.Tensor:
        """x += inp @ weightᵀ in place (`x [N, dim]`); a tensor-parallel subclass all-reduces the product.
        kernel: "reference" is cuBLAS's addmm_; "bitwise" `invariant_linear`; else `kernels.linear` (its
        weight-streaming kernel for few rows). A GGUF weight kept quantized (`fast.quant`) takes its kernel."""
        quant = quantized(weight)
        if quant is not None and not isinstance(quant, QuantWeight):  # FP8 / int4 (fast.quant.fp8, .int4)
            return quant.add_linear_(x, inp, kernel)
        if quant is not None:
            return quant_add_linear_(x, inp, _unless_bitwise(quant, kernel))
        if kernel == "reference":
            if x.device.type == "cpu":  # oneDNN on a packed weight, or the weight-major product (kernels.cpu_linear)
                return cpu_linear.add_linear_(x, inp, weight)
            return x.addmm_(inp, weight.t())
        if kernel == "bitwise":
            return invariant_linear(inp, weight, residual=x, out=x)
        return linear(inp, weight, residual=x, out=x, kernel=kernel)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                kernel: str = "reference") -> torch.Tensor:
        """x @ weightᵀ (+ bias): "reference" F.linear (cuBLAS / the CPU BLAS), "bitwise" `invariant_linear`, else
        `kernels.linear`; a GGUF weight kept quantized (`fast.quant`), its kernel."""
        quant = quantized(weight)
        if quant is not None and not isinstance(quant, QuantWeight):  # FP8 / int4 (fast.quant.fp8, .int4)
            return quant.linear(x, bias, kernel)
        if quant is not None:
            return quant_linear(x, _unless_bitwise(quant, kernel), bias)
        if kernel == "reference":
            if x.device.type == "cpu":  # oneDNN on a packed weight, or the weight-major product (kernels.cpu_linear)
                return cpu_linear.linear(x, weight, bias)
            return F.linear(x, weight, bias)
        if kernel == "bitwise":
            return invariant_linear(x, weight, bias)
        return linear(x, weight, bias, kernel=kernel)

    def _logits(self, x: torch.Tensor, kernel: str = "reference") -> torch.Tensor:
        """Float32 logits `[B, k, V]` of final hidden states `x [B, k, dim]`; a vocab-parallel subclass gathers them."""
        logits = self._linear(x, self.lm_head, kernel=kernel)
        cap, scale = self.shape.arch.final_softcap, self.shape.arch.logit_scale
        logits = logits if scale is None else logits / scale  # (Granite)
        return (logits if cap is None else torch.tanh(logits / cap) * cap).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return norm(x, weight, bias, self.shape.arch.norm, self.shape.rms_norm_eps)

    def _mlp(self, h: torch.Tensor, i: int, kernel: str = "reference") -> torch.Tensor:
        """The MLP's inner activations `[N, I]`: act(gate)·up, or act(up + bias)."""
        up = self._linear(h, self.w_gate_up[i], self.b_up[i] if self.shape.arch.mlp_bias else None, kernel)
        return mlp_activation(up, self.shape.arch)

    def _eager_layers(self, x: torch.Tensor, cache: KVCache, rope_pos: torch.Tensor, slots: torch.Tensor,
                      tables: list, capture: list | None = None, attention: str = "reference", tree=None,
                      causal: bool = False, attend=None) -> torch.Tensor:
        """The decoder layers in eager PyTorch: `x [B, k, dim]` → `[B, k, dim]`. attention: `slot_attention`'s
        kernel (the Triton one on CUDA for families the fused layer does not cover). capture (optional): appends
        a copy of the residual stream entering each layer of `feature_layers`. Under `bitwise` the GEMMs and the
        attention are the invariant ones (the Llama body's branch only: other families are refused). causal: the
        columns are positions 0..k-1 of fresh rows (`forward`'s `causal_prefix`): layers without a window or a
        softcap attend by `causal_prefix_attention` (no mask). attend (optional): `attend(i, q, key, value, window)`
        writes layer i's new K/V and returns its attention `[B, k, H, D]` in place of the cache's write and
        `slot_attention` (`fast.ragged`: a ragged batch over the block pool; `cache` is then not touched)."""
        s, a = self.shape, self.shape.arch
        gemm = "bitwise" if self.bitwise else "reference"
        batch, k = x.shape[:2]
        nq, nkv, hd = s.n_heads, s.n_kv_heads, s.head_dim
        rot = hd if a.rotary_dim is None else a.rotary_dim
        # RoPE factors `[B, k, 1, R]` per table, for the q and k heads at once (one contiguous block)
        factors = [(cos[rope_pos][:, :, None], sin[rope_pos][:, :, None]) for cos, sin in tables]
        write_index = cache.write_index(slots) if attend is None else None
        masks = {}  # one mask per window, shared by the layers (and built only for the reference: on CPU "auto" too)
        bound = rope_pos if tree is None else slots  # what a query sees up to: its position, a tree node its slot
        x = x.reshape(batch * k, s.dim)  # the residual stream
        for i in range(s.n_layers):
            if capture is not None and i in self.feature_layers:
                capture.append(x.clone().view(batch, k, s.dim))
            h = self._norm(x, self.attn_norm[i], self.attn_norm_bias[i] if a.norm == "layer" else None)
            qkv = self._linear(h, self.wqkv[i], self.bqkv[i] if s.qkv_bias else None, gemm)
            qkv = qkv.view(batch, k, nq + 2 * nkv, hd)
            qk, v = qkv[:, :, : nq + nkv], qkv[:, :, nq + nkv :]
            if s.qk_norm:
                qk = torch.cat([self._norm(qk[:, :, :nq], self.q_norm[i]), self._norm(qk[:, :, nq:], self.k_norm[i])],
                               dim=2)
            if rot:
                cos, sin = factors[a.rope_index(i)]
                rotated = torch.addcmul(qk[..., :rot] * cos, torch.roll(qk[..., :rot], rot // 2, dims=-1), sin)
                qk = rotated if rot == hd else torch.cat([rotated, qk[..., rot:]], dim=-1)
            q, key = qk[:, :, :nq], qk[:, :, nq:]
            if attend is None:
                cache.write(i, write_index, key, v)
            window = a.window(i)
            if attend is not None:
                attn = attend(i, q, key, v, window)
            elif self.bitwise:  # (token trees are refused in forward; a paged cache: its rows' blocks gathered)
                attn = invariant_attention(q, *cache.layer(i), bound, a.attn_scale, window=window)
            elif self.cpu_attention and tree is None and k <= CPU_ATTENTION_MAX_QUERIES and x.device.type == "cpu":
                keys, values, table = cache.attention_inputs(i)  # (each query its own live slots: row-count
                attn = cpu_attention(q, keys, values, bound, a.attn_scale, window=window,  # invariant)
                                     softcap=a.attn_softcap, block_table=table)
            elif causal and window is None and a.attn_softcap is None and tree is None:
                attn = causal_prefix_attention(q, *cache.layer(i), a.attn_scale)
            else:
                if window not in masks and (attention == "reference" or attention == "auto" and x.device.type == "cpu"):
                    masks[window] = slot_attention_bias(bound, cache.span, nq // nkv, self.dtype, window, tree)
                keys, values, table = cache.attention_inputs(i)  # (paged: the pool and the rows' block table)
                attn = slot_attention(q, keys, values, bound, a.attn_scale, window=window, softcap=a.attn_softcap,
                                      kernel=attention, bias=masks.get(window), tree=tree, block_table=table)
            attn = attn.reshape(batch * k, nq * hd)
            bo = self.bo[i] if s.o_bias else None
            if a.sandwich_norms:  # Gemma 2/3: x + norm(attn), then x + norm(mlp(norm(x)))
                x = x + self._norm(F.linear(attn, self.wo[i], bo), self.post_attn_norm[i])
                act = self._mlp(self._norm(x, self.mlp_norm[i]), i)
                x = x + self._norm(F.linear(act, self.w_down[i]), self.post_mlp_norm[i])
                continue
            if a.parallel_residual:  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
                act = self._mlp(self._norm(x, self.mlp_norm[i], self.mlp_norm_bias[i]), i)
                x = F.linear(act, self.w_down[i], self.b_down[i]) + F.linear(attn, self.wo[i], bo) + x
                continue
            x = self._row_parallel(x, attn, self.wo[i], gemm)  # residual add fused into the GEMM
            x = x if bo is None else x + bo
            act = self._mlp(self._norm(x, self.mlp_norm[i], self.mlp_norm_bias[i] if a.norm == "layer" else None), i,
                            gemm)
            x = self._row_parallel(x, act, self.w_down[i], gemm)
            x = x + self.b_down[i] if a.mlp_bias else x
        return x.view(batch, k, s.dim)

    def _fused_layers(self, x: torch.Tensor, cache: KVCache, rope_pos: torch.Tensor, slots: torch.Tensor,
                      tables: list, capture: list | None = None, tree=None) -> torch.Tensor:
        """The decoder layers on the fused kernels (the module doc lists them); `Arch.fusable` families only."""
        s, a = self.shape, self.shape.arch
        batch, k = x.shape[:2]
        nq, hd, eps = s.n_heads, s.head_dim, s.rms_norm_eps
        mode = "triton"  # forward checked that the fused kernels run here; attention picks by the model's mode
        attn_kernel, bound = None, rope_pos if tree is None else slots  # (a tree node sees up to its own slot)
        x = x.reshape(batch * k, s.dim)  # the residual stream, updated in place by the row-parallel GEMMs
        written = cache.fused_slots(slots)  # (paged: the fed tokens' flat pool entries)
        for i in range(s.n_layers):
            if capture is not None and i in self.feature_layers:
                capture.append(x.clone().view(batch, k, s.dim))
            h = rms_norm(x, self.attn_norm[i], eps, kernel=mode)
            qkv = self._linear(h, self.wqkv[i], kernel=self._gemm(self.wqkv[i])).view(batch, k, -1)  # (bias: in RoPE)
            cos, sin = tables[a.rope_index(i)]
            keys, values, table = cache.attention_inputs(i)  # (paged: the layer's pools and the rows' block table)
            q = rope_cache_write(qkv, *cache.fused_views(i), rope_pos, written, cos, sin, nq,
                                 bias=self.bqkv[i] if s.qkv_bias else None,
                                 q_norm=self.q_norm[i] if s.qk_norm else None,
                                 k_norm=self.k_norm[i] if s.qk_norm else None, eps=eps, kernel=mode)
            if attn_kernel is None:  # "triton" insists only where the attention kernel covers the shape
                attn_kernel = self.kernels
                if attn_kernel == "triton" and triton_unsupported(q, keys, values, bound):
                    attn_kernel = "reference"
            if self.bitwise:  # (static only: forward runs a paged cache's bitwise layers eagerly)
                attn = invariant_attention(q, keys, values, bound, a.attn_scale, window=a.window(i))
            else:
                attn = slot_attention(q, keys, values, bound, a.attn_scale, window=a.window(i),
                                      kernel=attn_kernel, tree=tree, block_table=table)
            x = self._row_parallel(x, attn.reshape(batch * k, nq * hd), self.wo[i], self._gemm(self.wo[i]))  # residual add in the GEMM
            if s.o_bias:
                x, h = add_rms_norm(x, self.bo[i], self.mlp_norm[i], eps, kernel=mode)
            else:
                h = rms_norm(x, self.mlp_norm[i], eps, kernel=mode)
            gate_up = self._linear(h, self.w_gate_up[i], kernel=self._gemm(self.w_gate_up[i]))
            x = self._row_parallel(x, silu_mul(gate_up, kernel=mode), self.w_down[i], self._gemm(self.w_down[i]))
        return x.view(batch, k, s.dim)
