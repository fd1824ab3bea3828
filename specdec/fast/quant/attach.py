"""A `FastLlama` whose linear weights stay GGUF-quantized: `quantized_from_hf(model)` for a transformers model that
`load_model` read from a GGUF, on the CPU in float32.

The plain tensors (norms, biases; a token embedding of a float type) are copied from the transformers model as
`FastLlama.from_hf` does; each linear weight (q|k|v, o, gate|up, down, the LM head) is read from the file
(`loading.gguf_tensors.read_quantized`), checked equal, bit for bit, to the transformers model's dequantized tensor
(so a mapping or decoding slip can never run), and put in place as a "meta" parameter of the right shape carrying
the `QuantWeight` (`quantized(weight)`), which `FastLlama`'s GEMM helpers send to `fast.quant.kernel`. The dense
float32 copy of those weights is never made in the `FastLlama` (the transformers model keeps its own until released).
A quantized token embedding is held so too: its rows are dequantized when gathered (`weight.embedding`: the layers'
input, the feature heads' next-token rows), the same float32 as the dense table's; a tied LM head is the same
parameter, multiplied by the quantized kernel.

Which weights a GGUF gets (`resolve_weights`): `EngineConfig(gguf_weights=...)` when not "auto", else the process
default (`specdec ... --gguf-weights`, `set_default`; `SPECDEC_GGUF_WEIGHTS` in the environment is an alias of it),
else `DEFAULT` ("quantized" where the CPU kernels build, else "dequantized"). "quantized" keeps the file's blocks
(this module; its decode attention `fast.quant.attention`); "dequantized" keeps every weight dense float32
(transformers' dequantization, oneDNN's packed product: the model transformers' `generate` runs, so the reference
that greedy equality with transformers is tested against). Bitwise mode under "auto" runs dequantized (its invariant
GEMMs are the dense ones; "quantized" is covered too when asked for).

Why quantized by default: on the chat demo (SmolLM2-135M-Instruct Q4_1 with its shipped head, this 2-core CPU) it
is several times faster than the dense path in one interleaved run, and its greedy text is the same with and
without speculation (every product and the decode attention are row-count invariant) — BENCHMARKS.md and
docs/benchmarks/quantized_cpu.md have the runs. Its tokens are not transformers' dequantized model's: the
activations are rounded to 8 bits per block of 32, as llama.cpp's CPU path rounds them.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

import torch

from specdec.fast.quant.weight import put_quantized, quantized, quantized_weights

logger = logging.getLogger(__name__)

__all__ = ["quantized", "quantized_from_hf", "quantized_bytes", "resolve_weights", "set_default", "ENV", "WEIGHTS",
           "DEFAULT"]

ENV = "SPECDEC_GGUF_WEIGHTS"  # an alias of `set_default` / --gguf-weights: "quantized" | "dequantized"
WEIGHTS = ("auto", "quantized", "dequantized")
DEFAULT = "quantized"  # (measured faster on the demo and greedy-identical: the module doc; "dequantized" without the kernel)
_default: list[str] = []  # the process default (`set_default`), at most one


def _checked(value, name: str) -> str:
    if value not in WEIGHTS:
        raise ValueError(f"{name} must be one of {', '.join(WEIGHTS)}, got {value!r}")
    return value


def set_default(value: str) -> None:
    """The process default of `gguf_weights` (the CLI's --gguf-weights); "auto" clears it."""
    _default[:] = [] if _checked(value, "gguf_weights") == "auto" else [value]


def resolve_weights(value: str | None = "auto", bitwise: bool = False) -> str:
    """"quantized" or "dequantized" for a GGUF model: `value` unless "auto" (or None), then the process default, the
    environment's alias, and `DEFAULT` (under bitwise, "auto" means "dequantized"; without the CPU kernels too)."""
    value = _checked("auto" if value is None else value, "gguf_weights")
    if value != "auto":
        return value
    if _default:
        return _default[0]
    env = os.environ.get(ENV)
    if env and env != "auto":
        return _checked(env, ENV)
    if bitwise or DEFAULT == "dequantized":
        return "dequantized"
    from specdec.fast.quant import kernel

    return DEFAULT if kernel.kernel_available() else "dequantized"  # (no compiler: the dense path is the faster)


def quantized_bytes(fast) -> int:
    """Bytes of the quantized weights a `FastLlama` holds."""
    return sum(q.nbytes for q in quantized_weights(fast))


def _why_not(model, weights: str) -> str | None:
    from specdec.fast.families import LlamaShape

    if weights == "dequantized":
        return "gguf_weights='dequantized'"
    ref = model.get_input_embeddings().weight
    if ref.device.type != "cpu" or ref.dtype != torch.float32:
        return f"the model is {ref.dtype} on {ref.device.type} (quantized weights run on the CPU in float32)"
    shape = LlamaShape.from_hf(model.config)
    a = shape.arch
    if a.sandwich_norms or a.parallel_residual or model.config.model_type in ("granite", "phi3", "gpt2",
                                                                             "gpt_neox", "starcoder2"):
        return f"model_type {model.config.model_type!r} (its weights are reshaped or scaled on the way in)"
    return None


def _same(qw, tensor: torch.Tensor, rows: int = 256) -> bool:
    """Whether `rows` rows spread over the matrix dequantize to `tensor`'s, bit for bit (a mapping or head-order slip
    changes nearly every row; each block type's decoding is tested whole in tests/fast/quant)."""
    if tuple(tensor.shape) != qw.shape:
        return False
    picked = torch.linspace(0, qw.shape[0] - 1, min(rows, qw.shape[0])).long().unique()
    return torch.equal(qw.select_rows(picked).dequantize(), tensor.index_select(0, picked))


def quantized_from_hf(model, kernels: str = "auto", weights: str | None = "auto", bitwise: bool = False):
    """A `FastLlama` with the GGUF's linear weights kept quantized, or None when `model` did not come from a GGUF, or
    `weights` (`resolve_weights`) says "dequantized", or its weights cannot stay quantized here (the reason logged
    once). ValueError when the file's weights are not the model's (never silently)."""
    from specdec.fast.model import FastLlama
    from specdec.fast.quant.kernel import kernel_available, kernel_name
    from specdec.fast.weights import hf_ropes, hf_weights
    from specdec.loading.gguf_tensors import gguf_origin, read_quantized

    file = gguf_origin(model)
    if file is None:
        return None
    reason = _why_not(model, resolve_weights(weights, bitwise))
    if reason is not None:
        logger.info("%s: weights dequantized to float32 (%s)", file.name, reason)
        return None
    from specdec.fast.families import LlamaShape

    shape = LlamaShape.from_hf(model.config)
    try:
        quant = {(name, layer): qw for name, layer, qw in read_quantized(file, shape.n_heads, shape.n_kv_heads)}
    except ValueError as err:
        logger.info("weights dequantized to float32 (%s)", err)
        return None
    if not quant:  # (a float GGUF: nothing to keep)
        return None
    fast = FastLlama(shape, ropes=hf_ropes(model, shape), device="cpu", dtype=torch.float32, kernels=kernels)
    with torch.no_grad():
        for name, layer, tensor in hf_weights(model, shape):
            qw = quant.get((name, layer))
            if qw is not None and not _same(qw, tensor.detach()):
                raise ValueError(f"{file.name}: the quantized {name}{'' if layer is None else f'[{layer}]'} does not "
                                 "dequantize to the transformers model's tensor")
            if qw is not None:
                put_quantized(fast, name, layer, qw)  # (the embedding too: its rows dequantized on gather)
                if name == "embed" and shape.tie_word_embeddings:  # the tied LM head: the same quantized table
                    fast.lm_head = fast.embed
                continue
            target = getattr(fast, name) if layer is None else getattr(fast, name)[layer]
            target.copy_(tensor.detach())
    fast.config = model.config
    fast.generation_config = getattr(model, "generation_config", None)
    fast.cpu_attention = kernel_available()  # (decode / verify attention row-count invariant: `fast.quant.attention`)
    kinds = Counter(q.source for q in quantized_weights(fast))
    logger.info("%s: %s kept quantized (%.1f MiB) on %s%s", file.name,
                ", ".join(f"{n} × {k}" for k, n in sorted(kinds.items())), quantized_bytes(fast) / 2**20, kernel_name(),
                "; decode attention: specdec attn_decode (row-count invariant)" if fast.cpu_attention else "")
    return fast.eval()
