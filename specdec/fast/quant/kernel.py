"""The products over a `QuantWeight`: y = x @ Wᵀ (+ bias), or residual += x @ Wᵀ, without a dense copy of W.

Up to `KERNEL_ROWS` rows (a decode step, a verify pass, a prefill chunk) run `quant_cpu.cpp`, which reads the
weight quantized (torch's
own weight-only CPU ops, `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm`, ran 8–50x slower than oneDNN's fp32
product on this machine's AVX-512 EPYC at these shapes, so they are not used; `scripts/bench_quant_cpu.py`). More rows
dequantize `CHUNK_ROWS` weight rows at a time and call the BLAS: one chunk's fp32 at a time, never
the whole matrix. The extension is built once per host with `torch.utils.cpp_extension` (g++ and ninja, no
download) into torch's extension cache; where it cannot be built (`kernel_available()` False, the reason logged once)
every product takes the chunked path — correct, slower.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.fast.quant.weight import QuantWeight

logger = logging.getLogger(__name__)

__all__ = ["KERNEL_ROWS", "CHUNK_ROWS", "kernel_available", "kernel_name", "quant_linear", "quant_add_linear_"]

KERNEL_ROWS = 512  # rows up to which the quantized kernel runs (in row tiles of 8, each re-reading the weight: a
# 3072 x 576 Q4_1 product of 128 rows took 36-47 ms against 150-290 ms dequantized + BLAS, on the loaded 2-core host)
CHUNK_ROWS = 4096  # weight rows dequantized at once on the chunked path (a vocabulary-sized head: 12 chunks)
_SOURCE = Path(__file__).with_name("quant_cpu.cpp")


@functools.cache
def _load() -> str | None:
    """Build / load the extension; None when it is there, else why not (one line)."""
    try:
        from torch.utils import cpp_extension

        capability = torch.backends.cpu.get_cpu_capability().lower()
        name = f"specdec_quant_cpu_{capability}"  # (-march=native: one build per kind of host)
        cpp_extension.load(name=name, sources=[str(_SOURCE)], extra_cflags=["-O3", "-march=native"],
                           is_python_module=False, verbose=False)
        torch.ops.specdec_quant.quant_mm  # noqa: B018 - registered by the library's load
    except Exception as err:  # noqa: BLE001 - no compiler, no ninja, a failed build: the chunked path instead
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        logger.warning("specdec's quantized CPU kernel is unavailable (%s); quantized weights run dequantized in "
                       "chunks", reason)
        return reason
    return None


def kernel_available() -> bool:
    """Whether the quantized kernel (`quant_cpu.cpp`) is built and loaded on this host (builds it on first call)."""
    return _load() is None


def kernel_name() -> str:
    """The kernel's name for log lines: "specdec quant_mm (…)" or the chunked fallback."""
    if kernel_available():
        return f"specdec quant_mm ({torch.backends.cpu.get_cpu_capability()}, ≤ {KERNEL_ROWS} rows; BLAS on " \
               f"{CHUNK_ROWS}-row dequantized chunks above)"
    return "dequantized chunks + BLAS (the quantized kernel did not build)"


def _chunked(x2: torch.Tensor, weight: QuantWeight, out: torch.Tensor, bias: torch.Tensor | None,
             accumulate: bool) -> None:
    for start in range(0, weight.shape[0], CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, weight.shape[0])
        part = F.linear(x2, weight.dequantize(start, stop), None if bias is None else bias[start:stop])
        if accumulate:
            out[:, start:stop] += part
        else:
            out[:, start:stop] = part


def _product(x2: torch.Tensor, weight: QuantWeight, out: torch.Tensor, bias: torch.Tensor | None,
             accumulate: bool) -> None:
    if x2.shape[0] <= KERNEL_ROWS and kernel_available():
        offset = weight.offset if weight.offset is not None else weight.scale.new_empty(0)
        torch.ops.specdec_quant.quant_mm(x2, weight.qs, weight.scale, offset, weight.bits, weight.group,
                                         None if bias is None else bias.contiguous(), out, accumulate)
    else:
        _chunked(x2, weight, out, bias, accumulate)


def _check(x: torch.Tensor, weight: QuantWeight) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"a quantized product takes float32 CPU inputs [..., {weight.shape[1]}], got "
                         f"{x.dtype} {x.device.type} {tuple(x.shape)}")


def quant_linear(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[..., K]` @ Wᵀ (+ bias `[N]`) → `[..., N]` float32, W the quantized `[N, K]`."""
    _check(x, weight)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = x2.new_empty(x2.shape[0], weight.shape[0])
    if x2.shape[0]:
        _product(x2, weight, out, bias, accumulate=False)
    return out.view(*x.shape[:-1], weight.shape[0])


def quant_add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """residual `[..., N]` += x `[..., K]` @ Wᵀ in place; returns residual."""
    _check(x, weight)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    flat = residual.view(-1, residual.shape[-1])
    if flat.is_contiguous() and flat.dtype == torch.float32:
        if x2.shape[0]:
            _product(x2, weight, flat, None, accumulate=True)
        return residual
    return residual.add_(quant_linear(x2, weight).view(residual.shape))
