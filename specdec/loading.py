"""Loading checkpoints from LOCAL directories, safely: models and tokenizers.

Every load is `local_files_only=True` (never a hub download) and `trust_remote_code=False` (never code from
a checkpoint). Before transformers sees a folder, `inspect_checkpoint` reads its config and weight files
itself and refuses, with one clear line: a config asking for custom code (`auto_map`) or naming a
`model_type` transformers does not know, an attention layout no runner can roll back (recurrent layers; sliding
windows outside the families the fast engine runs), pickled weights unless `allow_pickle=True` (unpickling runs
code from the file), shard names that leave the folder, and truncated or corrupt safetensors files.

An outer-ring helper for the CLI, benchmarks, demos and the zoo; the core never imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path

import torch

__all__ = ["DTYPES", "resolve_device", "resolve_dtype", "inspect_checkpoint", "load_model", "load_tokenizer",
           "quiet_progress_bars"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
_MAX_JSON_BYTES = 64 << 20  # a config or shard index larger than this is not a checkpoint


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`auto` (or None) = cuda if available, else cpu; otherwise cpu, cuda or cuda:N (checked to exist)."""
    if isinstance(device, torch.device):
        dev = device
    elif device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', got {type(device).__name__}")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {str(device)!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for but CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`auto` (or None) = bfloat16 on CUDA, float32 on CPU; else one of DTYPES' names."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16; got {dtype}")
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


@contextlib.contextmanager
def quiet_progress_bars():
    """Silence transformers' / huggingface_hub's progress bars ("Loading weights") inside the block only."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------------
# Reading a folder before transformers does.


def _read_json(path: Path, what: str) -> dict:
    try:
        if path.stat().st_size > _MAX_JSON_BYTES:
            raise ValueError(f"{what}: {path.name} is larger than {_MAX_JSON_BYTES >> 20} MiB: not a checkpoint file")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{what}: cannot read {path}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_dir(path: str | Path, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a directory path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {path} (specdec loads local checkpoints only)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{what} directory {path} has no config.json: not a transformers checkpoint")
    return path


def _check_config(config: dict, path: Path, what: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if "auto_map" in config:
        raise ValueError(f"{what}: {path / 'config.json'} asks for custom code (auto_map); specdec never runs code "
                         "from a checkpoint (trust_remote_code is always False)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"{what}: {path / 'config.json'} has model_type {model_type!r}, which this transformers "
                         "does not know; specdec loads only architectures built into transformers")
    vocab = config.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise ValueError(f"{what}: {path / 'config.json'} has vocab_size {vocab!r}; it must be an integer >= 1")


def _check_safetensors_file(file: Path, what: str) -> None:
    """Header sanity: 8-byte length, a JSON header, and data that ends exactly at the end of the file."""
    try:
        size = file.stat().st_size
        with file.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(size - 8, 100 << 20):
                raise ValueError(f"header length {header_len} does not fit the file ({size} bytes)")
            header = json.loads(fh.read(header_len))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + header_len + end != size:
            raise ValueError(f"the tensors need {8 + header_len + end} bytes, the file has {size} (truncated?)")
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError) as err:
        raise ValueError(f"{what}: {file} is not a valid safetensors file: {str(err).splitlines()[0]}") from None


def _shard_files(folder: Path, index_name: str, what: str) -> list[Path]:
    """The files a shard index names, each confined to `folder` (no absolute paths, no `..`)."""
    index = _read_json(folder / index_name, what)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{what}: {folder / index_name} has no weight_map")
    root = os.path.normpath(os.path.abspath(folder))
    files = []
    for name in sorted(set(weight_map.values()), key=str):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: {folder / index_name} names a shard {name!r} that is not a file name")
        target = os.path.normpath(os.path.join(root, name))
        if os.path.isabs(name) or os.path.commonpath([root, target]) != root or target == root:
            raise ValueError(f"{what}: {folder / index_name} names a shard outside the checkpoint folder: {name!r}")
        if not os.path.isfile(target):
            raise FileNotFoundError(f"{what}: shard {name!r} named in {index_name} is missing from {folder}")
        files.append(Path(target))
    return files


def inspect_checkpoint(path: str | Path, *, what: str = "model", allow_pickle: bool = False) -> dict:
    """Check a local checkpoint folder before anything is loaded or run; returns its config.json.

    Refuses (ValueError / FileNotFoundError, naming `what`): a missing folder or config.json, an `auto_map`
    (custom code), an unknown `model_type`, vocab_size < 1, no safetensors weights (pickled `.bin` weights
    only with `allow_pickle=True`), shard index entries outside the folder or missing, and safetensors files
    whose header does not match their size.
    """
    folder = _check_dir(path, what)
    config = _read_json(folder / "config.json", what)
    _check_config(config, folder, what)
    if (folder / SAFETENSORS_INDEX).is_file():
        files = _shard_files(folder, SAFETENSORS_INDEX, what)
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / PICKLE_INDEX).is_file() or (folder / "pytorch_model.bin").is_file():
        if not allow_pickle:
            raise ValueError(f"{what}: {folder} has only pickled weights (pytorch_model.bin); unpickling can run code "
                             "hidden in the file, so specdec loads safetensors only unless you opt in with "
                             "allow_pickle=True (CLI: --allow-pickle) for a checkpoint you trust")
        if (folder / PICKLE_INDEX).is_file():
            _shard_files(folder, PICKLE_INDEX, what)
        files = []
    else:
        raise FileNotFoundError(f"{what}: {folder} has no weights (model.safetensors or {SAFETENSORS_INDEX})")
    for file in files:
        _check_safetensors_file(file, what)
    return config


def _hub_free_kwargs(allow_pickle: bool) -> dict:
    kwargs = {"local_files_only": True, "trust_remote_code": False}
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    return kwargs


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def _engine_covers(config) -> bool:
    from specdec.fast.families import LlamaShape

    try:
        LlamaShape.from_hf(config)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def load_model(path: str | Path, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
               what: str = "model", allow_pickle: bool = False) -> torch.nn.Module:
    """A local checkpoint as an eval-mode transformers model; decoder-only or encoder-decoder, from its config.

    `inspect_checkpoint` runs first, then the attention layout is checked (`check_supported_model`), all
    before any weight is read. Any failure is a ValueError / FileNotFoundError naming `what` and the folder.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from specdec.request import check_supported_model

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    inspect_checkpoint(path, what=what, allow_pickle=allow_pickle)
    folder = str(Path(path))
    kwargs = _hub_free_kwargs(allow_pickle)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - a bad config is a user error, reported in one line
        raise ValueError(f"{what}: cannot read the config in {folder}: {_one_line(err)}") from None
    if not _engine_covers(config):  # the engine rolls sliding windows back; the transformers loop cannot
        check_supported_model(config, what)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    try:
        with quiet_progress_bars():
            model = auto.from_pretrained(folder, dtype=torch_dtype, **kwargs)
        return model.to(dev).eval()
    except Exception as err:  # noqa: BLE001 - corrupt weights, unsupported class, out of memory: one line
        raise ValueError(f"{what}: cannot load a model from {folder}: {_one_line(err)}") from None


def load_tokenizer(path: str | Path, *, what: str = "tokenizer"):
    """The tokenizer saved in a local folder (tokenizer.json / tokenizer_config.json); never custom code."""
    from transformers import AutoTokenizer

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a directory path, got {type(path).__name__}")
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {folder}")
    for name in ("tokenizer_config.json", "config.json"):
        if (folder / name).is_file() and "auto_map" in _read_json(folder / name, what):
            raise ValueError(f"{what}: {folder / name} asks for custom code (auto_map); specdec never runs code "
                             "from a checkpoint")
    try:
        with quiet_progress_bars():
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001
        raise FileNotFoundError(f"no usable tokenizer in {folder} (expected tokenizer.json / tokenizer_config.json): "
                                f"{_one_line(err)}") from None
