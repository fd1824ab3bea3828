"""FP8 / int4 weights put in a `FastLlama`: the same hook as the GGUF weights (`fast.quant.attach`): each linear
weight becomes a "meta" parameter of its shape carrying the quantized matrix under `weight.ATTRIBUTE`, and
`FastLlama`'s GEMM helpers (`fast.layers`) send it to its own product (`Int4Weight.linear`, `Fp8Weight.linear`).

`attach(fast, weights)`: put given quantized matrices in place (the loader, `loading.quantized`).
`quantize_model(fast, fmt)`: quantize a dense `FastLlama`'s linear weights in place with the reference packers
(`fast.quant.pack`): tests and the random-weight benchmark (`scripts/bench_quant_gpu.py`).
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from specdec.fast.quant.weight import put_quantized, quantized_weights

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "LINEAR_NAMES", "attach", "quantize_model", "quantize_weight", "quantized_weights", "quant_bytes", "describe"]

FORMATS = ("gptq", "awq", "fp8", "fp8-tensor", "fp8-block")
LINEAR_NAMES = ("wqkv", "wo", "w_gate_up", "w_down")  # per layer; "lm_head" once


def attach(fast, weights: dict) -> None:
    """weights: {(name, layer or None): Int4Weight | Fp8Weight} → those parameters of `fast` replaced in place
    (shape-checked: a ValueError names the weight)."""
    for (name, layer), qw in weights.items():
        current = getattr(fast, name) if layer is None else getattr(fast, name)[layer]
        if tuple(current.shape) != tuple(qw.shape):
            where = name if layer is None else f"{name}[{layer}]"
            raise ValueError(f"{where}: the quantized weight is {tuple(qw.shape)}, the model's {tuple(current.shape)}")
        put_quantized(fast, name, layer, qw)


def quant_bytes(fast) -> int:
    """Bytes a decode step reads: the quantized matrices plus every dense weight but the gathered embedding
    (`FastLlama.weight_bytes`, which counts a quantized weight as its quantized matrix)."""
    return fast.weight_bytes


def describe(fast) -> str:
    """"N × format" for the log line."""
    kinds = Counter(q.format for q in quantized_weights(fast))
    return ", ".join(f"{n} × {k}" for k, n in sorted(kinds.items()))


def quantize_weight(weight: torch.Tensor, fmt: str, group: int):
    from specdec.fast.quant import pack
    from specdec.fast.quant.fp8 import Fp8Weight
    from specdec.fast.quant.int4 import from_awq, from_gptq

    if fmt in ("gptq", "awq"):
        q, z, s = pack.quantize_int4(weight, group, scale_dtype=torch.float16)
        if fmt == "gptq":
            return from_gptq(*pack.pack_gptq(q, z, s))
        return from_awq(*pack.pack_awq(q, z, s))
    scheme = {"fp8": "channel", "fp8-tensor": "tensor", "fp8-block": "block"}[fmt]
    return Fp8Weight.from_checkpoint(*pack.quantize_fp8(weight, scheme))


def quantize_model(fast, fmt: str, *, group: int = 128, lm_head: bool = False):
    """`fast` with its linear weights (q|k|v, o, gate|up, down; the LM head too when `lm_head` and untied)
    quantized in place by the reference packers to `fmt` (one of `FORMATS`); returns `fast`."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    weights = {}
    with torch.no_grad():
        for name in LINEAR_NAMES:
            for i, p in enumerate(getattr(fast, name)):
                weights[(name, i)] = quantize_weight(p, fmt, group)
                attach(fast, {(name, i): weights.pop((name, i))})  # one at a time: the dense copy is freed as it goes
        if lm_head and not fast.shape.tie_word_embeddings:
            attach(fast, {("lm_head", None): quantize_weight(fast.lm_head, fmt, group)})
    logger.info("weights quantized to %s: %s", fmt, describe(fast))
    return fast
