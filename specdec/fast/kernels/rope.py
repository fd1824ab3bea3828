"""RoPE on the q and k heads of the fused q|k|v projection, with k and v written straight into the slot cache.

One launch per layer replaces: per-forward cos/sin tensors, the rotation of the q|k|v block, two cache
scatters (and, for Qwen3, the per-head q/k RMSNorm). Shapes:

  qkv        `[B, k, (H + 2·H_kv)·D]`  the q|k|v projection of k new tokens per row
  keys/values `[B, H_kv, S, D]`        one layer's cache (any strides: views of a larger slot cache work)
  positions  `[B, k]` long              each token's RoPE position (the row of the tables it reads)
  slots      `[B, k]` long              the cache slot its k and v go to (padding: the junk slot S−1)
  cos, sin   `[P, D]`                   the model's tables (`FastLlama.rope_tables`); `sin` is signed so that
                                        rotate_half(x)·sin == roll(x, D/2)·sin_signed (`sin_signed[:D/2] = −sin`)
  → q        `[B, k, H, D]`             rotated queries, contiguous, ready for `slot_attention`

bias `[(H + 2·H_kv)·D]` (optional, Qwen2): the projection's bias, added first (so the GEMM needs no bias launch).
q_norm/k_norm `[D]` (optional, Qwen3): RMSNorm over each q and k head (weights, eps) before the rotation.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec.fast.kernels.select import next_power_of_2, use_triton

__all__ = ["rope_cache_write", "rope_cache_write_reference"]


def rope_cache_write_reference(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                               slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, *,
                               bias: torch.Tensor | None = None, q_norm: torch.Tensor | None = None,
                               k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """The eager definition (rotation in float32, rounded once to the input dtype); see the module doc."""
    batch, k = qkv.shape[:2]
    kv_heads, dim = keys.shape[1], keys.shape[3]
    x = qkv.reshape(batch, k, n_heads + 2 * kv_heads, dim)
    if bias is not None:
        x = (x.float() + bias.float().view(n_heads + 2 * kv_heads, dim)).to(qkv.dtype)
    q, key, v = x[:, :, :n_heads], x[:, :, n_heads : n_heads + kv_heads], x[:, :, n_heads + kv_heads :]
    if q_norm is not None:
        q = F.rms_norm(q.float(), (dim,), q_norm.float(), eps)
    if k_norm is not None:
        key = F.rms_norm(key.float(), (dim,), k_norm.float(), eps)
    c, s = cos[positions].float()[:, :, None], sin[positions].float()[:, :, None]  # [B, k, 1, D]

    def rotate(t):
        t = t.float()
        return (t * c + torch.roll(t, dim // 2, dims=-1) * s).to(qkv.dtype)

    rows = torch.arange(batch, device=qkv.device)[:, None]  # [B, 1] with slots [B, k] → cache[b, :, slot]
    keys[rows, :, slots] = rotate(key)
    values[rows, :, slots] = v
    return rotate(q).contiguous()


def rope_cache_write(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                     slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, *,
                     bias: torch.Tensor | None = None, q_norm: torch.Tensor | None = None,
                     k_norm: torch.Tensor | None = None, eps: float = 1e-6, kernel: str = "auto") -> torch.Tensor:
    """`rope_cache_write_reference`'s function in one launch. kernel: "auto", "triton", "reference"."""
    batch, k = qkv.shape[:2]
    kv_heads, dim = keys.shape[1], keys.shape[3]
    heads = n_heads + 2 * kv_heads
    if qkv.shape[2:].numel() != heads * dim or values.shape != keys.shape or keys.shape[0] != batch:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not match {n_heads} query heads and a cache of "
                         f"{tuple(keys.shape)} / values {tuple(values.shape)}")
    if positions.shape != (batch, k) or slots.shape != (batch, k):
        raise ValueError(f"positions and slots must be [{batch}, {k}], got {tuple(positions.shape)}, "
                         f"{tuple(slots.shape)}")
    if bias is not None and bias.shape != (heads * dim,):
        raise ValueError(f"bias must be [{heads * dim}], got {tuple(bias.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together (Qwen3) or not at all")
    supported = (dim % 2 == 0 and dim <= 1024 and qkv.stride(-1) == 1 and cos.stride(-1) == 1
                 and sin.stride(-1) == 1 and cos.shape[-1] == dim and sin.shape[-1] == dim and qkv.numel() > 0
                 and (bias is None or bias.is_contiguous()))
    if not use_triton(kernel, qkv.device, supported, "rope_cache_write"):
        return rope_cache_write_reference(qkv, keys, values, positions, slots, cos, sin, n_heads,
                                          bias=bias, q_norm=q_norm, k_norm=k_norm, eps=eps)
    rows = qkv.reshape(batch * k, heads * dim)
    q = torch.empty(batch, k, n_heads, dim, device=qkv.device, dtype=qkv.dtype)
    norm = q_norm is not None
    block_d = next_power_of_2(dim)
    # heads per program: a few on the GPU (many programs even at batch 1), all of them in the interpreter
    block_h = min(next_power_of_2(heads), max(1, 512 // block_d) if qkv.device.type == "cuda" else 1 << 30)
    _kernel()[(batch * k, (heads + block_h - 1) // block_h)](
        rows, q, keys, values, positions.contiguous(), slots.contiguous(), cos, sin,
        bias if bias is not None else cos, q_norm if norm else cos, k_norm if norm else cos,
        k, rows.stride(0), cos.stride(0), sin.stride(0), *keys.stride(), *values.stride(), float(eps),
        H=n_heads, HKV=kv_heads, D=dim, BLOCK_H=block_h, BLOCK_D=block_d, BIAS=bias is not None, QK_NORM=norm,
        num_warps=max(1, min(8, block_h * block_d // 256)),
    )
    return q


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rope_cache_kernel(qkv_ptr, q_ptr, k_ptr, v_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, bias_ptr, qw_ptr,
                          kw_ptr, tokens_per_row, stride_qkv, stride_cos, stride_sin,
                          skb, skh, sks, skd, svb, svh, svs, svd, eps,
                          H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                          BLOCK_D: tl.constexpr, BIAS: tl.constexpr, QK_NORM: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)  # token: row b = n // k
        j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # heads [0, H): q, [H, H + HKV): k, then v
        d = tl.arange(0, BLOCK_D)
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)  # roll(x, D/2)
        is_q = j < H
        is_k = (j >= H) & (j < H + HKV)
        is_v = (j >= H + HKV) & (j < H + 2 * HKV)
        mask = (j < H + 2 * HKV)[:, None] & (d < D)[None, :]
        src = qkv_ptr + n * stride_qkv + j[:, None] * D
        x = tl.load(src + d[None, :], mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_D]
        xr = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        if BIAS:  # rounded to the projection's dtype, as a biased GEMM would store it
            bias = bias_ptr + j[:, None] * D
            x = x + tl.load(bias + d[None, :], mask=mask, other=0.0).to(tl.float32)
            xr = xr + tl.load(bias + partner[None, :], mask=mask, other=0.0).to(tl.float32)
            x = x.to(qkv_ptr.dtype.element_ty).to(tl.float32)
            xr = xr.to(qkv_ptr.dtype.element_ty).to(tl.float32)
        if QK_NORM:  # RMSNorm of each q and k head (v heads pass through)
            inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # [BLOCK_H]
            in_d = d < D
            w = tl.where(is_q[:, None], tl.load(qw_ptr + d, mask=in_d, other=0.0).to(tl.float32)[None, :],
                         tl.load(kw_ptr + d, mask=in_d, other=0.0).to(tl.float32)[None, :])
            wr = tl.where(is_q[:, None], tl.load(qw_ptr + partner, mask=in_d, other=0.0).to(tl.float32)[None, :],
                          tl.load(kw_ptr + partner, mask=in_d, other=0.0).to(tl.float32)[None, :])
            normed = (is_q | is_k)[:, None]
            x = tl.where(normed, x * inv_rms[:, None] * w, x)
            xr = tl.where(normed, xr * inv_rms[:, None] * wr, xr)
        pos = tl.load(pos_ptr + n)
        c = tl.load(cos_ptr + pos * stride_cos + d, mask=d < D, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + pos * stride_sin + d, mask=d < D, other=0.0).to(tl.float32)
        y = x * c[None, :] + xr * s[None, :]
        tl.store(q_ptr + (n * H + j[:, None]) * D + d[None, :], y.to(q_ptr.dtype.element_ty),
                 mask=mask & is_q[:, None])
        b = n // tokens_per_row
        slot = tl.load(slot_ptr + n)
        kh = tl.where(is_k, j - H, 0)
        k_dst = k_ptr + b * skb + kh[:, None] * skh + slot * sks + d[None, :] * skd
        tl.store(k_dst, y.to(k_ptr.dtype.element_ty), mask=mask & is_k[:, None])
        vh = tl.where(is_v, j - H - HKV, 0)
        v_dst = v_ptr + b * svb + vh[:, None] * svh + slot * svs + d[None, :] * svd
        tl.store(v_dst, x.to(v_ptr.dtype.element_ty), mask=mask & is_v[:, None])

    return rope_cache_kernel
