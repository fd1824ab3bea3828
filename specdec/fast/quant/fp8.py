"""`Fp8Weight`: an FP8 (e4m3) weight-only matrix `[N, K]` with its float32 scales, as transformers' FP8 checkpoints and
compressed-tensors' "float-quantized" schemes store it:

    w[n, k] = e4m3[n, k] · scale        per tensor (one scale), per channel (`[N]`), or per 128 × 128 block
                                        (`[⌈N/128⌉, ⌈K/128⌉]`: transformers' FineGrainedFP8 `weight_scale_inv`)

Products (`linear`, `add_linear_`):
  "triton"     `fast.kernels.quant_linear`: the e4m3 weight read once per call, widened to x's dtype in registers
               (exact), fp32 accumulation, the scale on each tile's fp32 partial (every layout); the default on
               CUDA for ≤ 4096 rows (`quant_linear.TRITON_ROWS`).
  "scaled_mm"  `torch._scaled_mm` (W8A8 on Hopper's FP8 tensor cores): activations quantized per token to e4m3 with
               their own scale (amax / 448); per-tensor and per-channel scales only. Off unless
               `SPECDEC_FP8_KERNEL=scaled_mm` (its activation rounding moves the logits; the weight-only kernel keeps
               x as it is, and decoding is bandwidth-bound: the weight bytes decide, the same 1 byte either way).
  reference    the weight dequantized to x's dtype (computed in float32), then F.linear: the CPU path, prefill on
               CUDA (longer prefill chunks), and what the others are tested against.
Measured on an H200 (8B shape, batch 1): the Triton kernel decoded 235.6 tok/s, `_scaled_mm` 146.5 (cuBLAS's FP8 GEMM
at one row plus the activation quantization's launches), hence the default. Static activation scales in a checkpoint (compressed-tensors `input_scale`) are not used: activations stay in x's
dtype (or are quantized per token under "scaled_mm").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["Fp8Weight", "FP8", "ENV", "fp8_kernel", "scaled_mm_linear", "join"]

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ENV = "SPECDEC_FP8_KERNEL"  # "triton" (default) | "scaled_mm"


def fp8_kernel() -> str:
    value = os.environ.get(ENV, "triton")
    if value not in ("triton", "scaled_mm"):
        raise ValueError(f"{ENV} must be 'triton' or 'scaled_mm', got {value!r}")
    return value


@dataclass(frozen=True, eq=False)
class Fp8Weight:
    """weight e4m3 `[N, K]`; scale float32 `[N]` (per channel; a per-tensor scale is broadcast to it) or, `block`,
    `[⌈N/128⌉, ⌈K/128⌉]`; `scheme`: "tensor", "channel" or "block" (for the log line)."""

    weight: torch.Tensor
    scale: torch.Tensor
    scheme: str
    source: str = "FP8"

    def __post_init__(self):
        n, k = self.weight.shape
        if self.weight.dtype != FP8 or not self.weight.is_contiguous():
            raise ValueError(f"Fp8Weight: weight must be a contiguous float8_e4m3fn [N, K], got {self.weight.dtype}")
        want = (-(-n // 128), -(-k // 128)) if self.scheme == "block" else (n,)
        if self.scheme not in ("tensor", "channel", "block"):
            raise ValueError(f"Fp8Weight: scheme must be 'tensor', 'channel' or 'block', got {self.scheme!r}")
        if tuple(self.scale.shape) != want or self.scale.dtype != torch.float32 or not self.scale.is_contiguous():
            raise ValueError(f"Fp8Weight: scale must be a contiguous float32 {want} for scheme {self.scheme!r}, got "
                             f"{self.scale.dtype} {tuple(self.scale.shape)}")

    @classmethod
    def from_checkpoint(cls, weight: torch.Tensor, scale: torch.Tensor, source: str = "FP8",
                        name: str = "weight") -> "Fp8Weight":
        """From a checkpoint's e4m3 weight and its scale: one value (per tensor), `[N]` / `[N, 1]` (per channel) or
        `[⌈N/128⌉, ⌈K/128⌉]` (128 × 128 blocks); other block sizes are refused naming `name`."""
        if weight.dtype != FP8:
            raise ValueError(f"{name}: FP8 weights must be float8_e4m3fn, got {weight.dtype}")
        n, k = weight.shape
        scale = scale.float()
        if scale.numel() == 1:
            return cls(weight.contiguous(), scale.reshape(1).expand(n).contiguous(), "tensor", source)
        if scale.numel() == n and (scale.dim() == 1 or scale.shape[-1] == 1):
            return cls(weight.contiguous(), scale.reshape(n).contiguous(), "channel", source)
        if tuple(scale.shape) == (-(-n // 128), -(-k // 128)):
            return cls(weight.contiguous(), scale.contiguous(), "block", source)
        raise ValueError(f"{name}: an FP8 scale of shape {tuple(scale.shape)} for a {n} x {k} weight is not per "
                         "tensor, per channel or per 128 x 128 block")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    @property
    def format(self) -> str:
        return f"{self.source} e4m3 (per-{self.scheme} scales)"

    @property
    def nbytes(self) -> int:
        return self.weight.numel() + self.scale.numel() * 4

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`[N, K]` in `dtype`, computed in float32 (the reference)."""
        n, k = self.shape
        if self.scheme == "block":
            scale = self.scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        else:
            scale = self.scale[:, None]
        return (self.weight.float() * scale).to(dtype)

    def kernel_args(self):
        return ("fp8_block" if self.scheme == "block" else "fp8"), self.weight, None, self.scale, 128

    def to(self, device) -> "Fp8Weight":
        return Fp8Weight(self.weight.to(device), self.scale.to(device), self.scheme, self.source)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
        """x `[..., K]` @ Wᵀ (+ bias) → `[..., N]` in x's dtype (the module doc's products)."""
        return self._product(x, bias, None, kernel)

    def add_linear_(self, residual: torch.Tensor, x: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
        """residual += x @ Wᵀ in place; returns residual."""
        return self._product(x, None, residual, kernel)

    def _product(self, x, bias, residual, kernel):
        from specdec.fast.kernels.quant_linear import weight_only

        if (kernel not in ("bitwise", "triton", "gemv") and x.is_cuda and self.scheme != "block"
                and fp8_kernel() == "scaled_mm"):
            y = scaled_mm_linear(x, self, bias)
            return y if residual is None else residual.add_(y)
        return weight_only(x, self, bias, residual, kernel)


def scaled_mm_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[..., K]` (bf16 / fp16, CUDA) quantized per token to e4m3, times the e4m3 weight on FP8 tensor cores
    (`torch._scaled_mm`, row-wise scales) → `[..., N]` in x's dtype. Per-tensor / per-channel weights only."""
    if weight.scheme == "block":
        raise ValueError("scaled_mm_linear covers per-tensor and per-channel FP8 scales, not 128 x 128 blocks")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    amax = x2.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-12)
    scale = amax / E4M3_MAX
    xq = (x2.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    y = torch._scaled_mm(xq, weight.weight.t(), scale_a=scale, scale_b=weight.scale.view(1, -1),
                         bias=bias, out_dtype=x.dtype)
    return y.view(*x.shape[:-1], weight.shape[0])


def join(weights: list) -> Fp8Weight:
    """Stack matrices of one K by rows (q|k|v, gate|up); per-tensor scales become per-channel, blocks need every
    part's N to be a multiple of 128 (else ValueError)."""
    schemes = {w.scheme for w in weights}
    if len({w.shape[1] for w in weights}) != 1:
        raise ValueError(f"join: the matrices' K differ: {[w.shape for w in weights]}")
    cat = torch.cat([w.weight for w in weights]).contiguous()
    if "block" in schemes:
        if schemes != {"block"} or any(w.shape[0] % 128 for w in weights[:-1]):
            raise ValueError("join: 128 x 128 block scales stack only with block scales, every part but the last "
                             "a multiple of 128 rows")
        return Fp8Weight(cat, torch.cat([w.scale for w in weights]).contiguous(), "block", weights[0].source)
    scheme = "tensor" if schemes == {"tensor"} and len({float(w.scale[0]) for w in weights}) == 1 else "channel"
    return Fp8Weight(cat, torch.cat([w.scale for w in weights]).contiguous(), scheme, weights[0].source)
