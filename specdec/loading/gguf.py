"""GGUF files (llama.cpp's format) checked before transformers dequantizes them.

transformers reads a GGUF through the `gguf` package (and needs `accelerate` for it): the weights are
dequantized to the chosen dtype, the config, tokenizer and chat template come from the file's metadata. The
checks here read the header and the tensor table only: the magic and version, every tensor's data inside the
file (a truncated download is refused by name), an architecture transformers converts, the config bounds, and
the layer count against the `blk.N.` tensors.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from specdec.loading.checks import check_bounds, check_layer_count

__all__ = ["require_gguf", "inspect_gguf"]

GGUF_MAGIC = b"GGUF"
_RENAMED = ("gpt-oss", "minimax-m2")  # llama.cpp names transformers maps to other model types


def require_gguf(what: str) -> None:
    """The optional packages a GGUF needs, or one line saying how to install them."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{what}: loading a GGUF file needs the {' and '.join(missing)} package"
                          f"{'s' if len(missing) > 1 else ''}: pip install 'specdec[gguf]' (or pip install gguf "
                          "accelerate)")


def _architecture(reader) -> str:
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError("no general.architecture in its metadata")
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _int_field(reader, key: str) -> int | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    return int(value[0]) if len(value) == 1 else None


def inspect_gguf(file: Path, *, what: str = "model", allow_weight_mismatch: bool = False) -> str:
    """Check a GGUF file; returns its architecture (llama.cpp's name). The converted config is checked by the
    loader (`checks.check_config`) once transformers has read it.

    Refuses (ValueError naming `what` and the file): not a GGUF (magic), a truncated or corrupt file (the
    tensor table or a tensor's data past the end), an architecture transformers does not convert, a block
    count past the bounds, and (unless `allow_weight_mismatch`) a block count the tensors do not hold.
    """
    require_gguf(what)
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        with file.open("rb") as fh:
            magic = fh.read(4)
        size = file.stat().st_size
    except OSError as err:
        raise ValueError(f"{what}: cannot read {file}: {type(err).__name__}: {err}") from None
    if magic != GGUF_MAGIC:
        raise ValueError(f"{what}: {file} is not a GGUF file (it does not start with the GGUF magic)")
    try:
        reader = GGUFReader(str(file))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
        architecture = _architecture(reader)
    except Exception as err:  # noqa: BLE001 - the reader fails in many ways on a cut file: one line
        raise ValueError(f"{what}: {file} is not a valid GGUF file (truncated or corrupt: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'unreadable'})") from None
    if end > size or not reader.tensors:
        raise ValueError(f"{what}: {file} is not a valid GGUF file (truncated: its tensors need {end} bytes, the file "
                         f"has {size})")
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and architecture.replace("moe", "_moe") not in \
            GGUF_SUPPORTED_ARCHITECTURES and architecture not in _RENAMED:
        raise ValueError(f"{what}: {file} holds a GGUF of architecture {architecture!r}, which transformers does "
                         f"not convert (it converts {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})")
    blocks = _int_field(reader, f"{architecture}.block_count")
    if blocks is not None:
        check_bounds({"num_hidden_layers": blocks}, str(file), what)
    if not allow_weight_mismatch and blocks is not None:
        # llama.cpp names layer tensors blk.N.*; the same check as for safetensors names
        names = [t.name.replace("blk.", "layers.", 1) for t in reader.tensors]
        check_layer_count({"num_hidden_layers": blocks}, names, str(file), what)
    return architecture
