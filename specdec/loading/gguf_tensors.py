"""A GGUF's quantized tensors as they are in the file (memory-mapped, its header read by `loading.gguf`), named by
`FastLlama`'s fused weights — and which GGUF a loaded transformers model came from.

`remember_gguf(model, file)` is called by `load_model` for a model it read from a GGUF; `gguf_origin(model)` gives the
file back (a weak map: nothing is kept alive). `read_quantized(file, n_heads, n_kv_heads)` yields
(fast name, layer, `QuantWeight`) for the linear weights of the Llama-body architectures it knows (`ARCHITECTURES`):
q|k|v and gate|up joined by rows, and llama's q/k rows un-permuted as transformers does (llama.cpp's converter
interleaves each head's rotary halves; the rows move, the blocks along K do not). Tensors of a plain type (F32, F16)
are not yielded: the caller copies those from the transformers model as before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["ARCHITECTURES", "remember_gguf", "gguf_origin", "read_quantized", "tensor_types"]

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # the GGUF architectures whose tensors map one to one
_ORIGINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def remember_gguf(model, file: str | Path) -> None:
    """Record that `model` (a transformers module) was loaded from the GGUF `file`."""
    try:
        _ORIGINS[model] = Path(file)
    except TypeError:  # (not weak-referenceable: nothing to remember it by)
        pass


def gguf_origin(model) -> Path | None:
    """The GGUF `model` was loaded from (`remember_gguf`), or None."""
    try:
        return _ORIGINS.get(model)
    except TypeError:
        return None


@dataclass(frozen=True)
class _Tensor:
    name: str
    kind: str  # the GGML type's name: "Q4_1", "F32", …
    dims: tuple  # ggml's order: the fast-moving dimension first
    data: np.ndarray  # its bytes, uint8, memory-mapped


def _tensors(file: Path) -> dict[str, _Tensor]:
    """{name: tensor} read with specdec's bounded header reader (`loading.gguf`: the gguf package's `GGUFReader`
    parses every metadata array — a vocabulary of 49k strings took seconds), data memory-mapped."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # dependency at the edge (specdec[gguf])

    from specdec.loading.gguf import read_gguf_header

    header = read_gguf_header(file)
    data = np.memmap(file, dtype=np.uint8, mode="r")
    found = {}
    for (name, elements, kind, offset), dims in zip(header.tensors, header.dims):
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        start = header.data_start + offset
        found[name] = _Tensor(name, GGMLQuantizationType(kind).name, dims,
                              data[start:start + elements // block * size])
    return found


def tensor_types(file: str | Path) -> dict[str, int]:
    """{GGUF type name: number of tensors} of a file (e.g. {"Q4_1": 210, "F32": 61, "Q8_0": 1})."""
    counts: dict[str, int] = {}
    for t in _tensors(Path(file)).values():
        counts[t.kind] = counts.get(t.kind, 0) + 1
    return counts


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order transformers' `LlamaTensorProcessor` gives llama.cpp's q/k: new row h·2d + j·d + i = old row
    h·2d + 2i + j (d = head_dim / 2)."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(-1)


def read_quantized(file: str | Path, n_heads: int, n_kv_heads: int):
    """Yield (FastLlama parameter name, layer or None, QuantWeight) for every linear weight the GGUF holds in a block
    type of `specdec.fast.quant.SUPPORTED`, plus ("embed", None, …) for a quantized token embedding. ValueError for an
    architecture outside `ARCHITECTURES`, and for a fused group (q|k|v, gate|up) only part of which is quantized."""
    from specdec.fast.quant.blocks import SUPPORTED, from_blocks
    from specdec.fast.quant.weight import join

    from specdec.loading.gguf import read_gguf_header

    arch = read_gguf_header(Path(file)).metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{Path(file).name}: architecture {arch!r} is not one whose tensors specdec maps quantized "
                         f"({', '.join(ARCHITECTURES)})")
    tensors = _tensors(Path(file))

    def quant(name: str):
        t = tensors.get(name)
        if t is None or t.kind not in SUPPORTED:
            return None
        if len(t.dims) != 2:
            raise ValueError(f"{Path(file).name}: {name} has {len(t.dims)} dimensions, a linear weight 2")
        k, n = (int(d) for d in t.dims)  # (ggml lists the fast-moving dimension first)
        weight = from_blocks(t.kind, t.data.reshape(n, -1), (n, k))
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            weight = weight.select_rows(_unpermute(n, n_heads if ".attn_q." in name else n_kv_heads))
        return weight

    def group(fast: str, layer: int | None, names: list[str]):
        parts = [quant(n) for n in names]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise ValueError(f"{Path(file).name}: {', '.join(names)} are partly quantized, partly not")
        return fast, layer, parts[0] if len(parts) == 1 else join(parts)

    layers = 0
    while f"blk.{layers}.attn_q.weight" in tensors:
        layers += 1
    for i in range(layers):
        pre = f"blk.{i}."
        for fast, names in (("wqkv", ["attn_q", "attn_k", "attn_v"]), ("wo", ["attn_output"]),
                            ("w_gate_up", ["ffn_gate", "ffn_up"]), ("w_down", ["ffn_down"])):
            found = group(fast, i, [pre + n + ".weight" for n in names])
            if found is not None:
                yield found
    for fast, name in (("embed", "token_embd.weight"), ("lm_head", "output.weight")):
        found = group(fast, None, [name])
        if found is not None:
            yield found
