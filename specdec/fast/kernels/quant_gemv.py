"""The decode-shape GEMV for quantized weights: y = x @ Wᵀ (+ bias) (+ residual) for M = 1–8 rows (a plain step, a
verify pass of γ + 1 rows), W an `Int4Weight` (GPTQ / AWQ) or an `Fp8Weight` (per-tensor / per-channel / 128 × 128
block scales), read by `quant_gemv_triton.py` (each weight tile read once for all M rows, K split into slices
summed without atomics by a second small launch, fp32 accumulation).

Opt-in: `SPECDEC_QUANT_KERNEL` = "splitk" (`DEFAULT_KERNEL`: today's `quant_triton` for every row count) | "gemv"
(this kernel for ≤ `GEMV_ROWS` rows on CUDA, `quant_triton` above); `quant_linear.weight_only` reads it on each
call (kernel="bitwise" never takes the GEMV: its contract is one summation order per shape for every row count).
`SPECDEC_INT4_LAYOUT` = "nk" (default: `Int4Weight.qweight` `[N, K/8]` as it is) | "kn" (GPTQ's own `[K/8, N]`,
each load contiguous along N: a transposed copy of the words made on the first call outside graph capture and
kept beside the weight — the int4 words held twice, the same bytes read per call). A bad value of either is a
ValueError naming the variable and its values.

Configs: `GEMV_CONFIGS`, keyed by (format "int4" | "fp8", shape class of (N, K) — `shape_class` —, row bucket
1 | 4 | 8); unmeasured defaults until a device sweep (`scripts/bench_quant_gpu.py --gemv-ab --gemv-sweep`)
replaces them. No autotuning at run time: a call inside CUDA-graph capture launches what its warm-up launched.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from dataclasses import dataclass

import torch

from specdec.fast.kernels.select import NUM_SMS, interpreting, kernel_module, sm_count

__all__ = ["GemvConfig", "GEMV_CONFIGS", "DEFAULT_KERNEL", "GEMV_ROWS", "ENV_KERNEL", "ENV_LAYOUT", "quant_kernel",
           "int4_layout", "shape_class", "row_bucket", "pick_gemv_config", "plan_split", "gemv_ok", "gemv"]

DEFAULT_KERNEL = "splitk"
KERNELS = ("splitk", "gemv")
ENV_KERNEL = "SPECDEC_QUANT_KERNEL"
LAYOUTS = ("nk", "kn")
ENV_LAYOUT = "SPECDEC_INT4_LAYOUT"
GEMV_ROWS = 8  # rows up to which "gemv" serves a call (decode, and a verify pass of γ + 1 ≤ 8)


def _env(name: str, values: tuple[str, ...], default: str) -> str:
    value = os.environ.get(name, "") or default
    if value not in values:
        raise ValueError(f"{name} must be one of {', '.join(values)}, got {value!r}")
    return value


def quant_kernel() -> str:
    """`SPECDEC_QUANT_KERNEL`: "splitk" (unset or empty) or "gemv"; anything else a ValueError naming it."""
    return _env(ENV_KERNEL, KERNELS, DEFAULT_KERNEL)


def int4_layout() -> str:
    """`SPECDEC_INT4_LAYOUT`: "nk" (unset or empty) or "kn"; anything else a ValueError naming it."""
    return _env(ENV_LAYOUT, LAYOUTS, "nk")


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape (`quant_gemv_triton`'s module doc): output columns and K per tile (block_k: a power of two;
    fitted to divide the int4 group / the FP8 block, `pick_gemv_config`), K slices (0: `plan_split`'s choice),
    warps, pipeline stages, the product ("fma" | "dot"), the int4 unpacking ("shift" | "magic"), whether the next
    tile is fetched by hand, and the split-K sum ("kernel": a second launch, no atomics | "fused": the last slice
    to arrive, an arrival counter)."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 0
    num_warps: int = 4
    num_stages: int = 2
    variant: str = "fma"
    unpack: str = "magic"
    prefetch: bool = True
    reduce: str = "kernel"

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemvConfig.{name} must be a power of two ≥ 16, got {v}")
        choices = {"variant": ("fma", "dot"), "unpack": ("shift", "magic"), "reduce": ("kernel", "fused")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GemvConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.split_k < 0 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"GemvConfig: split_k ≥ 0, num_warps ≥ 1, num_stages ≥ 1, got {self}")


def shape_class(n: int, k: int) -> str:
    """(N, K) → "head" (N ≥ 8K: an LM head), "wide" (N ≥ 2K: gate|up), "deep" (K ≥ 2N: down), else "square"."""
    if n >= 8 * k:
        return "head"
    if n >= 2 * k:
        return "wide"
    if k >= 2 * n:
        return "deep"
    return "square"


def row_bucket(m: int) -> int:
    """1 (a plain step), 4 (2–4 rows) or 8 (5–8 rows)."""
    return 1 if m <= 1 else (4 if m <= 4 else 8)


# (format, shape class, row bucket) → config. Unmeasured defaults, sized by ptxas's sm_90 output for this kernel
# (registers a thread, SASS instructions a weight element in the loop — the budget for streaming at the H200's
# bandwidth is about 3.5 an int4 element, 7 an e4m3 one): one int4 row through FMAs (≈ 7 an element at 64 columns,
# 80 registers; the split-K kernel's FMA variant ≈ 21, its tensor-core one ≈ 12); int4 above one row (≈ 9) and every
# FP8 count (≈ 5, as the split-K kernel) through tensor cores with the compiler's 3-stage pipeline. A device sweep
# (`scripts/bench_quant_gpu.py --gemv-ab --gemv-sweep`) prints the measured table.
_INT4_ONE = GemvConfig(block_n=64, block_k=128, variant="fma", prefetch=False, num_stages=2)
_DOT = GemvConfig(block_n=64, block_k=128, variant="dot", prefetch=False, num_stages=3)
GEMV_CONFIGS: dict[tuple[str, str, int], GemvConfig] = {
    (fmt, cls, bucket): (_INT4_ONE if (fmt, bucket) == ("int4", 1) else _DOT)
    for fmt in ("int4", "fp8") for cls in ("square", "wide", "deep", "head") for bucket in (1, 4, 8)}


def pick_gemv_config(fmt: str, n: int, k: int, m: int, *, group: int = 128) -> GemvConfig:
    """`GEMV_CONFIGS`' entry for (format, shape class, row bucket) — fmt "int4", "fp8" or "fp8_block" (the "fp8"
    entries) — with block_k fitted: at most the int4 group, at most 128 for 128-block scales, at most K's next power
    of two (and ≥ 16)."""
    key = ("int4" if fmt == "int4" else "fp8", shape_class(n, k), row_bucket(m))
    config = GEMV_CONFIGS.get(key) or (_INT4_ONE if (key[0], key[2]) == ("int4", 1) else _DOT)
    limit = group if fmt == "int4" else (128 if fmt == "fp8_block" else 1 << max(4, (k - 1).bit_length()))
    block_k = max(16, min(config.block_k, limit))
    return config if block_k == config.block_k else dataclasses.replace(config, block_k=block_k)


def plan_split(config: GemvConfig, n: int, k: int, m: int, weight_bytes: int, num_sms: int = NUM_SMS) -> int:
    """K slices: config.split_k, or (0) doubled while the programs number < 4 per SM, each slice keeps ≥ 2 tiles
    and the fp32 partials `[S, M, N]` stay ≤ 1/8 of the weight's bytes (they are written once and read once)."""
    if config.split_k:
        return config.split_k
    programs = -(-n // config.block_n)
    tiles = -(-k // config.block_k)
    split = 1
    while (programs * split < 4 * num_sms and tiles // (2 * split) >= 2
           and 2 * split * m * n * 4 <= weight_bytes / 8):
        split *= 2
    return split


def _triton():
    return kernel_module("quant_gemv_triton")


def gemv_ok(x: torch.Tensor, rows: int) -> bool:
    """Whether "gemv" may serve this input: 1–`GEMV_ROWS` rows, CUDA (or the interpreter) with Triton, 16/32-bit
    floats."""
    return (0 < rows <= GEMV_ROWS and (x.is_cuda or interpreting()) and _triton() is not None
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32))


_KN_WORDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Int4Weight → its words `[K/8, N]`


def _int4_words(weight, layout: str):
    """(words, stride along N, stride along K/8) of an `Int4Weight` in `layout`; "kn" falls back to "nk" while its
    copy is not made yet and a CUDA graph is being captured (an allocation there is filled only on replay)."""
    q = weight.qweight
    if layout == "kn":
        kn = _KN_WORDS.get(weight)
        if kn is None and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
            kn = _KN_WORDS[weight] = q.t().contiguous()
        if kn is not None:
            return kn, 1, kn.stride(0)
    return q, q.stride(0), 1


def gemv(x: torch.Tensor, weight, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         config: GemvConfig | None = None, layout: str | None = None) -> torch.Tensor:
    """x `[..., K]` (1–8 rows) @ Wᵀ (+ bias `[N]`) (+ residual `[..., N]`, written in place and returned when
    given) → `[..., N]` in x's dtype, for an `Int4Weight` or `Fp8Weight` (their `kernel_args()`). config: the
    table's when None; layout: the int4 words' ("nk" | "kn"; None: `SPECDEC_INT4_LAYOUT`). No host sync: capturable
    once warm."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal the weight's K ({k})")
    if _triton() is None or not (x.is_cuda or interpreting()):
        raise ValueError("the quantized GEMV needs Triton and CUDA tensors (or TRITON_INTERPRET=1)")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1 or x2.stride(0) != k:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if not 0 < m <= GEMV_ROWS:
        raise ValueError(f"the quantized GEMV covers 1–{GEMV_ROWS} rows, got {m}")
    fmt, q, zeros, scales, group = weight.kernel_args()
    if config is None:
        config = pick_gemv_config(fmt, n, k, m, group=group)
    limit = group if fmt == "int4" else 128 if fmt == "fp8_block" else None
    if limit is not None and limit % config.block_k:
        raise ValueError(f"GemvConfig.block_k {config.block_k} must divide {limit} for {fmt!r} weights")
    layout = layout or int4_layout()  # (read for every format: a bad value fails on FP8 models too)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if fmt == "int4":
        q, stride_qn, stride_qk = _int4_words(weight, layout)
    else:
        stride_qn, stride_qk = q.stride(0), 1
    res2 = None if residual is None else residual.reshape(-1, n)
    if res2 is not None and (res2.stride(-1) != 1 or res2.stride(0) != n):
        raise ValueError("the residual must be row-contiguous `[..., N]`")
    out2 = torch.empty(m, n, device=x.device, dtype=x.dtype) if residual is None else res2
    split = plan_split(config, n, k, m, weight.nbytes, sm_count(x.device))
    code = {"int4": 0, "fp8": 1, "fp8_block": 2}[fmt]
    _triton().launch(x2, code, q, stride_qn, stride_qk, zeros, scales, group, n, bias, res2, out2, config, split)
    return out2.view(*x.shape[:-1], n) if residual is None else residual
