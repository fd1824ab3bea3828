"""The products over a `QuantWeight`: y = x @ Wᵀ (+ bias), or residual += x @ Wᵀ, without a dense copy of W.

Every row count runs `q8_cpu.cpp` (a C++ extension built once per host with `torch.utils.cpp_extension`: g++ and
ninja, no download, into torch's extension cache): each row of x quantized to 8 bits per block of 32 (a scale and
the sums of its halves), integer dot products against W's 4- or 8-bit blocks (AVX-512 VNNI `vpdpbusd` or AVX2
`maddubs`, chosen at run time from the CPU's flags; portable C++ elsewhere — all three give the same bits), float
accumulation in a fixed order, output columns across torch's threads. A row's output does not depend on how many
rows are in the call, so a verify pass of γ + 1 rows gives each row what a one-row decode step gives it.

The activation quantization makes the product differ from the dequantized float32 one (W is exact; x is rounded to
8 bits per block): relative error ~0.3–1% of the output's scale on random tensors, bounded per block type in
`tests/fast/quant/test_kernel.py`. Where the extension cannot be built (`kernel_available()` False, the reason logged
once) every product dequantizes `CHUNK_ROWS` weight rows at a time and calls the BLAS: the exact float32 product,
slower, and not row-count invariant.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.fast.quant.weight import QuantWeight

logger = logging.getLogger(__name__)

__all__ = ["CHUNK_ROWS", "ISAS", "kernel_available", "kernel_name", "kernel_isa", "quant_linear",
           "quant_add_linear_"]

CHUNK_ROWS = 4096  # weight rows dequantized at once on the fallback path (a vocabulary-sized head: 12 chunks)
ISAS = {0: "auto", 1: "C++", 2: "AVX2", 3: "AVX-512 VNNI"}  # the kernel's `isa` argument
_SOURCES = [str(Path(__file__).with_name(name)) for name in ("q8_cpu.cpp", "attn_cpu.cpp")]  # (+ the attention)


@functools.cache
def _load() -> str | None:
    """Build / load the extension; None when it is there, else why not (one line)."""
    try:
        from torch.utils import cpp_extension

        # (one build folder per source version: checkouts of other versions never rebuild each other's)
        digest = hashlib.sha256(b"".join(Path(p).read_bytes() for p in _SOURCES)).hexdigest()[:12]
        cpp_extension.load(name=f"specdec_quant_cpu_{digest}", sources=_SOURCES,
                           extra_cflags=["-O3", "-ffp-contract=off"], is_python_module=False, verbose=False)
        torch.ops.specdec_q8.q8_mm, torch.ops.specdec_attn.attn_decode  # noqa: B018 - registered by the load
    except Exception as err:  # noqa: BLE001 - no compiler, no ninja, a failed build: the chunked path instead
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        logger.warning("specdec's quantized CPU kernel is unavailable (%s); quantized weights run dequantized in "
                       "chunks", reason)
        return reason
    return None


def kernel_available() -> bool:
    """Whether the quantized kernel (`q8_cpu.cpp`) is built and loaded on this host (builds it on first call)."""
    return _load() is None


def kernel_isa() -> int:
    """The best `isa` this CPU runs (3 AVX-512 VNNI, 2 AVX2, 1 portable C++); 0 without the kernel."""
    return int(torch.ops.specdec_q8.q8_isa()) if kernel_available() else 0


def kernel_name() -> str:
    """The kernel's name for log lines: "specdec q8_mm (…)" or the chunked fallback."""
    if kernel_available():
        return f"specdec q8_mm (8-bit activations × quantized weights, {ISAS[kernel_isa()]})"
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


_NO_OFFSET = torch.empty(0)  # (the op's "no offset": one shared empty tensor, not one made per call)


def _product(x2: torch.Tensor, weight: QuantWeight, out: torch.Tensor, bias: torch.Tensor | None,
             accumulate: bool, isa: int = 0) -> None:
    if kernel_available():
        torch.ops.specdec_q8.q8_mm(x2, weight.qs, weight.scale, _NO_OFFSET if weight.offset is None else weight.offset,
                                   weight.bits, weight.group, None if bias is None else bias.contiguous(), out,
                                   accumulate, isa)
    else:
        _chunked(x2, weight, out, bias, accumulate)


def _check(x: torch.Tensor, weight: QuantWeight) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"a quantized product takes float32 CPU inputs [..., {weight.shape[1]}], got "
                         f"{x.dtype} {x.device.type} {tuple(x.shape)}")


def quant_linear(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None, *,
                 isa: int = 0) -> torch.Tensor:
    """x `[..., K]` @ Wᵀ (+ bias `[N]`) → `[..., N]` float32, W the quantized `[N, K]`; `isa` (tests) forces a path
    of the kernel (`ISAS`), 0 the best this CPU runs."""
    _check(x, weight)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = x2.new_empty(x2.shape[0], weight.shape[0])
    if x2.shape[0]:
        _product(x2, weight, out, bias, False, isa)
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
