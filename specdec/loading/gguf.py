"""GGUF files (llama.cpp's format) checked before transformers dequantizes them.

transformers reads a GGUF through the `gguf` package (and needs `accelerate` for it): the weights are
dequantized to the chosen dtype, the config, tokenizer and chat template come from the file's metadata. The
checks here read the header and the tensor table only: the magic and version, every tensor's data inside the
file (a truncated download is refused by name), an architecture transformers converts, the config bounds, and
the layer count against the `blk.N.` tensors.
"""

from __future__ import annotations

import importlib.util
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from specdec.loading.checks import check_bounds, check_layer_count

__all__ = ["require_gguf", "inspect_gguf", "read_gguf_header", "GGUFHeader"]

GGUF_MAGIC = b"GGUF"
_RENAMED = ("gpt-oss", "minimax-m2")  # llama.cpp names transformers maps to other model types


def require_gguf(what: str) -> None:
    """The optional packages a GGUF needs, or one line saying how to install them."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{what}: loading a GGUF file needs the {' and '.join(missing)} package"
                          f"{'s' if len(missing) > 1 else ''}: pip install 'specdec[gguf]' (or pip install gguf "
                          "accelerate)")


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_ITEMS = 1 << 24  # keys, tensors or array elements: more than any real file (a 256K vocabulary is 1 << 18)


@dataclass(frozen=True)
class GGUFHeader:
    """What specdec reads of a GGUF before transformers does: scalar metadata, and each tensor's name and extent."""

    version: int
    metadata: dict  # scalar and string values only (arrays are skipped, their extent checked)
    tensors: tuple  # (name, number of elements, ggml type, offset from the data start)
    data_start: int
    dims: tuple = ()  # each tensor's dimensions in ggml's order (the fast-moving one first), as `tensors`


class _Cursor:
    """Bounded little-endian reads from a memory map: running past the end raises ValueError ("truncated")."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"truncated: {n} bytes needed at offset {self.pos} of {self.size}")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def count(self, what: str) -> int:
        n = self.scalar("<Q")
        if n > _MAX_ITEMS:
            raise ValueError(f"{what} count {n} is not a real file's")
        return n

    def value(self, kind: int, depth: int = 0):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY and depth < 2:
            inner, n = self.scalar("<I"), self.count("array")
            if inner in _SCALARS:  # skipped in one step, bounds checked
                self.take(n * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(n):
                    self.value(inner, depth + 1)
            return None
        raise ValueError(f"unknown metadata value type {kind}")


def read_gguf_header(file: Path) -> GGUFHeader:
    """Parse a GGUF's header, metadata and tensor table (never its tensor data); ValueError on anything malformed."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with file.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, len(buf))
        if cur.take(4) != GGUF_MAGIC:
            raise ValueError("it does not start with the GGUF magic")
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (specdec reads versions 2 and 3)")
        num_tensors, num_keys = cur.count("tensor"), cur.count("metadata key")
        metadata = {}
        for _ in range(num_keys):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"))
        tensors = []
        for _ in range(num_tensors):
            name = cur.string()
            num_dims = cur.scalar("<I")
            if num_dims > 8:
                raise ValueError(f"tensor {name!r} has {num_dims} dimensions")
            dims = [cur.scalar("<Q") for _ in range(num_dims)]
            kind, offset = cur.scalar("<I"), cur.scalar("<Q")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise ValueError(f"tensor {name!r} has an unknown ggml type {kind}") from None
            elements = math.prod(dims)
            tensors.append((name, elements, kind, offset, elements // block * type_size, tuple(dims)))
        alignment = metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment < 1 or alignment > 1 << 16:
            raise ValueError(f"general.alignment {alignment!r}")
        start = -(-cur.pos // alignment) * alignment
        end = max((start + t[3] + t[4] for t in tensors), default=start)
        if end > len(buf):
            raise ValueError(f"truncated: its tensors need {end} bytes, the file has {len(buf)}")
    return GGUFHeader(version, metadata, tuple(t[:4] for t in tensors), start, tuple(t[5] for t in tensors))


def inspect_gguf(file: Path, *, what: str = "model", allow_weight_mismatch: bool = False) -> str:
    """Check a GGUF file; returns its architecture (llama.cpp's name). The converted config is checked by the
    loader (`checks.check_config`) once transformers has read it.

    Refuses (ValueError naming `what` and the file): not a GGUF (magic), a truncated or corrupt file (the
    tensor table or a tensor's data past the end), an architecture transformers does not convert, a block
    count past the bounds, and (unless `allow_weight_mismatch`) a block count the tensors do not hold.
    """
    require_gguf(what)
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        header = read_gguf_header(file)
    except OSError as err:
        raise ValueError(f"{what}: cannot read {file}: {type(err).__name__}: {err}") from None
    except (ValueError, struct.error, OverflowError) as err:
        kind = "not a GGUF file" if "magic" in str(err) else "not a valid GGUF file"
        raise ValueError(f"{what}: {file} is {kind} ({str(err).splitlines()[0]})") from None
    if not header.tensors:
        raise ValueError(f"{what}: {file} is not a valid GGUF file (it holds no tensors)")
    architecture = header.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(f"{what}: {file} is not a valid GGUF file (no general.architecture in its metadata)")
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and architecture.replace("moe", "_moe") not in \
            GGUF_SUPPORTED_ARCHITECTURES and architecture not in _RENAMED:
        raise ValueError(f"{what}: {file} holds a GGUF of architecture {architecture!r}, which transformers does "
                         f"not convert (it converts {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})")
    blocks = header.metadata.get(f"{architecture}.block_count")
    if isinstance(blocks, int):
        check_bounds({"num_hidden_layers": blocks}, str(file), what)
        if not allow_weight_mismatch:
            # llama.cpp names layer tensors blk.N.*; the same check as for safetensors names
            names = [name.replace("blk.", "layers.", 1) for name, *_ in header.tensors]
            check_layer_count({"num_hidden_layers": blocks}, names, str(file), what)
    return architecture
