"""KL(p‖q) per position with its gradient in one pass over the logits (the feature head's distillation loss).

    kl_rows(q_logits, p_logits)   q `[B, T, V]` (differentiable), p `[B, T, V]` (fixed) → KL(p‖q) `[B, T]` float32
                                  p = softmax(p_logits), q = softmax(q_logits) (temperature 1)

Eager autograd over a `[B, T, V]` float32 KL reads and writes the logits ~20 times (casts, two log-softmaxes,
products, the backward of each); at batch 64 × 223 positions × vocabulary 8192 that is ~11 GB per draft step.
The Triton kernel reads both rows once, writes KL and the gradient ∂KL/∂z_q = softmax(q) − p (in q's dtype,
what autograd would hand the bf16 logits) in the same pass; the backward only scales it. Math in float32.
`kl_rows_reference` is the eager definition (CPU, and CUDA without Triton); tests hold the kernel to it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec.fast.kernels.select import next_power_of_2, use_triton

__all__ = ["kl_rows", "kl_rows_reference", "MAX_VOCAB"]

MAX_VOCAB = 1 << 15  # one row per program, held in registers; larger vocabularies take the reference


def kl_rows_reference(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """The eager definition: Σ_x p(x) (log p(x) − log q(x)) per position, float32 `[...]`."""
    log_p = F.log_softmax(p_logits.float(), -1)
    return (log_p.exp() * (log_p - F.log_softmax(q_logits.float(), -1))).sum(-1)


def kl_rows(q_logits: torch.Tensor, p_logits: torch.Tensor, *, kernel: str = "auto") -> torch.Tensor:
    """`kl_rows_reference`'s function `[B, T, V]`, `[B, T, V]` → `[B, T]` (kernel: "auto", "triton", "reference")."""
    if q_logits.shape != p_logits.shape or q_logits.dim() != 3:
        raise ValueError(f"q_logits and p_logits must both be [B, T, V], got {tuple(q_logits.shape)} and "
                         f"{tuple(p_logits.shape)}")
    supported = (q_logits.shape[-1] <= MAX_VOCAB and q_logits.stride(-1) == 1 and p_logits.stride(-1) == 1
                 and q_logits.numel() > 0)
    if not use_triton(kernel, q_logits.device, supported, "kl_rows"):
        return kl_rows_reference(q_logits, p_logits)
    return _FusedKL.apply(q_logits, p_logits.detach())


class _FusedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
        b, t, v = q_logits.shape
        kl = torch.empty(b, t, dtype=torch.float32, device=q_logits.device)
        grad = torch.empty(b, t, v, dtype=q_logits.dtype, device=q_logits.device)
        block = next_power_of_2(v)
        warps = 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 4096 else 16
        _kernel()[(b * t,)](q_logits, p_logits, kl, grad, t, q_logits.stride(0), q_logits.stride(1),
                            p_logits.stride(0), p_logits.stride(1), v, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(grad)
        return kl

    @staticmethod
    def backward(ctx, grad_kl: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_kl[..., None].to(grad.dtype), None


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kl_rows_kernel(q_ptr, p_ptr, kl_ptr, grad_ptr, t, stride_qb, stride_qt, stride_pb, stride_pt, v,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        bi = row // t
        ti = row - bi * t
        cols = tl.arange(0, BLOCK)
        mask = cols < v
        zq = tl.load(q_ptr + bi * stride_qb + ti * stride_qt + cols, mask=mask, other=float("-inf")).to(tl.float32)
        zp = tl.load(p_ptr + bi * stride_pb + ti * stride_pt + cols, mask=mask, other=float("-inf")).to(tl.float32)
        mq = tl.max(zq, axis=0)
        mp = tl.max(zp, axis=0)
        eq = tl.exp(zq - mq)  # 0 past the vocabulary
        ep = tl.exp(zp - mp)
        sq = tl.sum(eq, axis=0)
        sp = tl.sum(ep, axis=0)
        p = ep / sp
        log_ratio = (tl.where(mask, zp, 0.0) - mp - tl.log(sp)) - (tl.where(mask, zq, 0.0) - mq - tl.log(sq))
        kl = tl.sum(tl.where(mask, p * log_ratio, 0.0), axis=0)
        tl.store(kl_ptr + row, kl)
        tl.store(grad_ptr + row * v + cols, (eq / sq - p).to(grad_ptr.dtype.element_ty), mask=mask)

    return kl_rows_kernel
