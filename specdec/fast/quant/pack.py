"""Reference packers: a float weight `[N, K]` → the tensors a GPTQ, AWQ or FP8 checkpoint holds (round-to-nearest,
no calibration: for tests and random-weight benchmarks, not a quantizer to ship models with).

`quantize_int4` picks per group of `group` weights along K an asymmetric 4-bit grid (scale = (max − min) / 15,
zero = round(−min / scale), at least 1); `pack_gptq` / `pack_awq` lay the integers out as those formats do (`fast.quant.int4`'s
module doc); `quantize_fp8` scales per tensor, per channel or per 128 × 128 block so the largest |w| maps to 448.
"""

from __future__ import annotations

import torch

from specdec.fast.quant.fp8 import E4M3_MAX, FP8
from specdec.fast.quant.int4 import AWQ_ORDER, pack_rows

__all__ = ["quantize_int4", "pack_gptq", "pack_awq", "pack_columns", "quantize_fp8"]


def quantize_int4(weight: torch.Tensor, group: int = 128, scale_dtype: torch.dtype = torch.float16):
    """weight `[N, K]` → (q uint8 `[K, N]` in 0..15, zeros uint8 `[K/G, N]`, scales `[K/G, N]` in scale_dtype), with
    w ≈ (q − z) · s; the float32 arithmetic uses the scales as rounded to scale_dtype."""
    n, k = weight.shape
    if k % group:
        raise ValueError(f"K = {k} is not a multiple of the group {group}")
    w = weight.detach().float().t().reshape(k // group, group, n)  # [K/G, G, N]
    lo, hi = w.amin(dim=1).clamp(max=0.0), w.amax(dim=1).clamp(min=0.0)
    scales = ((hi - lo) / 15.0).clamp_min(1e-8).to(scale_dtype)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(1, 15)  # (≥ 1: GPTQ's v1 stores z − 1 in 4 bits)
    q = torch.round(w / s[:, None] + zeros[:, None]).clamp(0, 15)
    return q.reshape(k, n).to(torch.uint8), zeros.to(torch.uint8), scales.contiguous()


def pack_columns(q: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """uint8 `[R, C]` (C % 8 == 0) → int32 `[R, C/8]`, nibble p holding column 8i + order[p] (order None = p)."""
    r, c = q.shape
    q = q.to(torch.int32).view(r, c // 8, 8)
    if order is not None:
        q = q[:, :, list(order)]
    out = q[:, :, 0].contiguous()
    for p in range(1, 8):
        out |= q[:, :, p] << (4 * p)
    return out


def pack_gptq(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, checkpoint_format: str = "gptq"):
    """(q `[K, N]`, zeros, scales) → GPTQ's (qweight `[K/8, N]`, qzeros `[K/G, N/8]`, scales, g_idx `[K]`);
    checkpoint_format "gptq" stores z − 1 (auto-gptq's v1)."""
    k = q.shape[0]
    group = k // zeros.shape[0]
    stored = (zeros.to(torch.int16) - (1 if checkpoint_format == "gptq" else 0)) & 0xF
    g_idx = torch.arange(k, dtype=torch.int32) // group
    return pack_rows(q), pack_columns(stored.to(torch.uint8)), scales, g_idx


def pack_awq(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor):
    """(q `[K, N]`, zeros, scales) → AWQ's (qweight `[K, N/8]`, qzeros `[K/G, N/8]`, scales), AWQ's column order."""
    return pack_columns(q, AWQ_ORDER), pack_columns(zeros, AWQ_ORDER), scales


def quantize_fp8(weight: torch.Tensor, scheme: str = "channel"):
    """weight `[N, K]` → (e4m3 `[N, K]`, float32 scale: `[]` per tensor, `[N, 1]` per channel, `[⌈N/128⌉, ⌈K/128⌉]`
    per block) with w ≈ e4m3 · scale."""
    w = weight.detach().float()
    n, k = w.shape
    if scheme == "tensor":
        scale = (w.abs().amax() / E4M3_MAX).clamp_min(1e-12)
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale
    if scheme == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp_min(1e-12)
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale
    if scheme != "block":
        raise ValueError(f"scheme must be 'tensor', 'channel' or 'block', got {scheme!r}")
    bn, bk = -(-n // 128), -(-k // 128)
    padded = torch.zeros(bn * 128, bk * 128, device=w.device)
    padded[:n, :k] = w
    scale = (padded.view(bn, 128, bk, 128).abs().amax(dim=(1, 3)) / E4M3_MAX).clamp_min(1e-12)
    full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale
