"""CPU fp32 products x @ Wᵀ for `FastLlama`'s "reference" GEMMs: oneDNN on a pre-packed weight, or the weight-major
product for a few rows, instead of `F.linear` (MKL).

y = x @ Wᵀ for x `[..., K]`, W `[N, K]`. On the 2-core machine here (AMD EPYC, AVX-512, MKL 2024.2) MKL's `F.linear`
costs a verify pass of 2–6 rows 1.4–3.4× the time of the one-row pass over SmolLM2-135M's matrices (it packs the
weight per call), and even its one-row GEMV streams the weight at about half the memory bandwidth (BENCHMARKS.md,
`scripts/smol_cpu_gemm.py`). Two other products:

  "packed"        oneDNN's inner product (`torch.ops.mkldnn._linear_pointwise`, what inductor's CPU freezing uses) on
                  a copy of W reordered once into oneDNN's blocked layout (`_reorder_linear_weight`) and kept per
                  weight tensor (re-packed when the weight changes in place): 1–9 rows cost about one one-row pass,
                  and the one-row pass itself is 0.6–1.0× MKL's. Costs a second copy of every weight it multiplies.
                  A weight made under `torch.inference_mode` has no version counter: its packed copy is keyed by
                  address, shape and strides only, so after changing such a weight in place call `clear_packed()`.
  "onednn"        the same oneDNN inner product on W itself, unpacked: no copy of any weight. On the Qwen2.5-Coder
                  1.5B's matrices (1 thread, `docs/QWEN_PAIR.md`) 1 / 2 / 3 / 5 rows cost 0.86 / 1.15 / 1.09 / 1.20×
                  weight_major's one-row pass (packed: 0.63 / 0.62 / 0.63 / 0.69×; weight_major: 1 / 1.08 / 1.58 /
                  2.63×), and 8–128 rows (prefill) 0.4–0.65× F.linear's time. What a model too large for a second
                  copy should use (the demo's `--pair qwen`, the pair's scripts).
  "weight_major"  (W @ xᵀ)ᵀ with MKL: the rows are the short side of the GEMM and the weight streams once, as in a
                  GEMV; 2..`FEW_ROWS` rows only (it is slower than `F.linear` for more, and for the MLP's down
                  projection). The fallback where torch has no oneDNN.

`MODE` picks: "auto" (packed where torch has oneDNN, else weight-major for 2..FEW_ROWS rows, else `F.linear`),
"packed", "onednn" (as "auto" without oneDNN), "weight_major" or "linear" (always `F.linear`: the comparison arm of `scripts/smol_cpu_gemm.py`). Every
product is the same sum in another order: equal to `F.linear`'s to fp32 rounding, not bit for bit (as MKL's own
1-row and k-row paths already differ). Bitwise mode keeps its own invariant kernel; CUDA, other dtypes and inputs
that require grad keep `F.linear`.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F

__all__ = ["MODE", "MODES", "FEW_ROWS", "product", "linear", "add_linear_", "packed_available", "clear_packed"]

MODES = ("auto", "packed", "onednn", "weight_major", "linear")
MODE = "auto"
PACK_ROWS = 16  # the row count oneDNN's packed layout is chosen for: 2..16 measured alike (1–16 rows ran 0.6–1.0x
# of MKL's one-row pass); 1 picks a GEMV layout that makes 5 rows cost 1.2–1.4x of it
FEW_ROWS = 6  # rows up to which the weight-major product is used (0: never); 8 rows measured no faster than F.linear

_PACKED: dict[int, tuple] = {}  # id(weight) → (weakref to the weight, key, packed); dropped with the weight


@functools.cache
def packed_available() -> bool:
    """Whether this torch has oneDNN's inner product on packed weights (CPU builds with MKLDNN)."""
    try:
        ops = torch.ops.mkldnn
        return bool(torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
                    and hasattr(ops, "_reorder_linear_weight"))
    except (AttributeError, RuntimeError):
        return False


def product(x: torch.Tensor, weight: torch.Tensor) -> str:
    """Which product `x [..., K] @ weight [N, K]ᵀ` takes: "packed", "onednn", "weight_major" or "linear"."""
    if MODE not in MODES:
        raise ValueError(f"cpu_linear.MODE must be one of {MODES}, got {MODE!r}")
    if (MODE == "linear" or x.device.type != "cpu" or weight.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or x.shape[-1] == 0 or weight.dim() != 2 or x.requires_grad
            or weight.requires_grad or x.numel() == 0):
        return "linear"
    if MODE in ("auto", "packed", "onednn") and packed_available():
        return "onednn" if MODE == "onednn" else "packed"
    rows = x.numel() // x.shape[-1]
    return "weight_major" if MODE != "packed" and 2 <= rows <= FEW_ROWS else "linear"


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of `weight [N, K]`, made once and re-made when the weight changes in place."""
    version = None if weight.is_inference() else weight._version  # (an inference tensor has no version counter,
    key = (weight.data_ptr(), weight.shape, weight.stride(), version)  # and asking for it raises: ~80 µs a call)
    hit = _PACKED.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    with torch.inference_mode(False), torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS)
    ident = id(weight)
    _PACKED[ident] = (weakref.ref(weight, lambda _ref, ident=ident: _forget(ident, _ref)), key, packed)
    return packed


def _forget(ident: int, ref) -> None:
    hit = _PACKED.get(ident)
    if hit is not None and hit[0] is ref:
        del _PACKED[ident]


def clear_packed() -> None:
    """Drop every packed copy (they are also dropped with their weights)."""
    _PACKED.clear()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[..., K]` @ weight `[N, K]`ᵀ (+ bias `[N]`) → `[..., N]` (row-major, as `F.linear`'s), by `product`."""
    kind = product(x, weight)
    if kind in ("packed", "onednn"):
        w = _packed_weight(weight) if kind == "packed" else weight
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    if kind == "weight_major":
        out = torch.mm(weight, x.reshape(-1, weight.shape[1]).t()).t().contiguous()  # (row-major: the fused kernels
        if bias is not None:  # downstream need a unit stride; ≤ FEW_ROWS rows, a small copy)
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual `[..., N]` += x `[..., K]` @ weight `[N, K]`ᵀ in place, by `product`; returns residual."""
    kind = product(x, weight)
    if kind in ("packed", "onednn"):
        w = _packed_weight(weight) if kind == "packed" else weight
        out = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return residual.add_(out.reshape(residual.shape))
    if kind == "weight_major":
        return residual.add_(torch.mm(weight, x.reshape(-1, weight.shape[1]).t()).t().reshape(residual.shape))
    flat = residual.view(-1, residual.shape[-1])
    flat.addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return residual
