"""Model options (`model_kwargs=` / `--model-option KEY=VALUE`): the `from_pretrained` keywords specdec passes on.

Only known keys with typed values get through; everything else is refused in one line naming the key. The keys
that would undo the safety rules (`trust_remote_code`, `local_files_only`, `use_safetensors`, `token`,
`force_download`, ...) are refused outright: specdec sets them itself.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ModelOptions", "check_model_options", "parse_model_option", "source_options", "ATTN_IMPLEMENTATIONS",
           "MODEL_OPTION_KEYS"]

#: attention implementations transformers ships (the "kernels-community/..." hub kernels would be a download)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
_DEVICE_MAP_NAMES = ("auto", "balanced", "balanced_low_0", "sequential", "cpu", "cuda")
_DEVICE = re.compile(r"^(cpu|disk|meta|cuda(:\d{1,3})?|\d{1,3})$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_FORBIDDEN = {
    "trust_remote_code": "specdec never runs code from a checkpoint (trust_remote_code is always False)",
    "local_files_only": "specdec always loads local files only (never a download)",
    "use_safetensors": "safetensors are the default; pickled weights need allow_pickle=True (--allow-pickle)",
    "token": "specdec never downloads, so it needs no hub token",
    "force_download": "specdec never downloads",
    "proxies": "specdec never downloads",
    "code_revision": "specdec never runs code from a checkpoint",
}

#: key → what it must be (for the error message)
MODEL_OPTION_KEYS = {
    "revision": "a branch, tag or commit of a hub id in the local cache",
    "gguf_file": "a .gguf file name inside the folder or hub snapshot",
    "subfolder": "a relative folder inside the checkpoint",
    "cache_dir": "the Hugging Face hub cache directory to resolve hub ids in",
    "torch_dtype": "float32, bfloat16, float16 or auto (alias: dtype)",
    "dtype": "float32, bfloat16, float16 or auto",
    "device_map": f"one of {', '.join(_DEVICE_MAP_NAMES)}, cuda:N, or an object {{module name: device}}",
    "max_memory": "an object {device: size}, e.g. {\"0\": \"20GiB\", \"cpu\": \"60GiB\"}",
    "attn_implementation": f"one of {', '.join(ATTN_IMPLEMENTATIONS)}",
    "quantization_config": "an object with a quant_method, e.g. {\"quant_method\": \"bitsandbytes\", ...}",
    "low_cpu_mem_usage": "true or false",
    "variant": "a weights file variant such as fp16",
}


_STRING_KEYS = ("revision", "gguf_file", "subfolder", "cache_dir", "torch_dtype", "dtype", "attn_implementation",
                "variant")


@dataclass(frozen=True)
class ModelOptions:
    """Validated model options. `source` keys say where the checkpoint is; `load` keys go to `from_pretrained`."""

    revision: str | None = None
    gguf_file: str | None = None
    subfolder: str | None = None
    cache_dir: str | None = None
    dtype: str | None = None
    load: Mapping = field(default_factory=dict)  # device_map, max_memory, attn_implementation, ...

    @property
    def device_map(self):
        return self.load.get("device_map")


def _relative_name(key: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"model option {key} must be a non-empty string, got {value!r}")
    norm = os.path.normpath(value)
    if os.path.isabs(value) or norm == ".." or norm.startswith(".." + os.sep) or "\x00" in value:
        raise ValueError(f"model option {key} must be a name inside the checkpoint folder, got {value!r}")
    return value


def _device_map(value):
    if isinstance(value, str):
        if value in _DEVICE_MAP_NAMES or _DEVICE.match(value):
            return value
    elif isinstance(value, Mapping) and value:
        for name, device in value.items():
            if not isinstance(name, str) or not (isinstance(device, int) and not isinstance(device, bool)
                                                 or isinstance(device, str) and _DEVICE.match(device)):
                raise ValueError(f"model option device_map: entry {name!r}: {device!r} is not a device "
                                 "(cpu, disk, cuda:N or a GPU index)")
        return dict(value)
    raise ValueError(f"model option device_map must be {MODEL_OPTION_KEYS['device_map']}, got {value!r}")


def _max_memory(value):
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"model option max_memory must be {MODEL_OPTION_KEYS['max_memory']}, got {value!r}")
    out = {}
    for device, size in value.items():
        if not (isinstance(size, str) and re.match(r"^\d+(\.\d+)?\s*[KMGT]i?B$", size, re.I)
                or isinstance(size, int) and not isinstance(size, bool) and size > 0):
            raise ValueError(f"model option max_memory[{device!r}] must be a size such as '20GiB', got {size!r}")
        out[int(device) if isinstance(device, str) and device.isdigit() else device] = size
    return out


def _quantization_config(value):
    if hasattr(value, "quant_method") and hasattr(value, "to_dict"):  # a transformers QuantizationConfig object
        return value
    if not isinstance(value, Mapping) or not isinstance(value.get("quant_method"), str):
        raise ValueError(f"model option quantization_config must be {MODEL_OPTION_KEYS['quantization_config']}, "
                         f"got {value!r}")
    if value["quant_method"] == "gguf":
        raise ValueError("model option quantization_config: a GGUF file is loaded by naming it (a .gguf path, or "
                         "gguf_file=NAME), not through quantization_config")
    return dict(value)


def check_model_options(options: Mapping | None) -> ModelOptions:
    """Validate `model_kwargs`; ValueError (one line, naming the key) on an unknown key or a wrong value."""
    if options is None:
        return ModelOptions()
    if isinstance(options, ModelOptions):
        return options
    if not isinstance(options, Mapping):
        raise TypeError(f"model options must be a dict of from_pretrained keywords, got {type(options).__name__}")
    source: dict = {}
    load: dict = {}
    for key, value in options.items():
        if key in _FORBIDDEN:
            raise ValueError(f"model option {key} is refused: {_FORBIDDEN[key]}")
        if key not in MODEL_OPTION_KEYS:
            raise ValueError(f"unknown model option {key!r}; known: {', '.join(MODEL_OPTION_KEYS)}")
        if key == "revision":
            if not isinstance(value, str) or not _REVISION.match(value) or ".." in value:
                raise ValueError(f"model option revision must be {MODEL_OPTION_KEYS[key]}, got {value!r}")
            source[key] = value
        elif key in ("gguf_file", "subfolder"):
            source[key] = _relative_name(key, value)
        elif key == "cache_dir":
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                raise ValueError(f"model option cache_dir must be a directory path, got {value!r}")
            source[key] = str(value)
        elif key in ("torch_dtype", "dtype"):
            from specdec.loading.device import DTYPES

            if value not in ("auto", *DTYPES):
                raise ValueError(f"model option {key} must be {MODEL_OPTION_KEYS['dtype']}, got {value!r}")
            if source.get("dtype", value) != value:
                raise ValueError(f"model options dtype and torch_dtype disagree ({source['dtype']!r} vs {value!r})")
            source["dtype"] = value
        elif key == "device_map":
            load[key] = _device_map(value)
        elif key == "max_memory":
            load[key] = _max_memory(value)
        elif key == "attn_implementation":
            if value not in ATTN_IMPLEMENTATIONS:
                raise ValueError(f"model option attn_implementation must be {MODEL_OPTION_KEYS[key]}, got {value!r}")
            load[key] = value
        elif key == "quantization_config":
            load[key] = _quantization_config(value)
        elif key == "low_cpu_mem_usage":
            if not isinstance(value, bool):
                raise ValueError(f"model option low_cpu_mem_usage must be true or false, got {value!r}")
            load[key] = value
        elif key == "variant":
            if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9_-]{1,32}$", value):
                raise ValueError(f"model option variant must be a short name such as fp16, got {value!r}")
            load[key] = value
    if "max_memory" in load and "device_map" not in load:
        raise ValueError("model option max_memory needs a device_map (e.g. device_map=auto)")
    return ModelOptions(load=load, **source)


SOURCE_KEYS = ("revision", "gguf_file", "subfolder", "cache_dir")


def source_options(options: Mapping | None) -> dict | None:
    """The model options that say where a checkpoint is (what a tokenizer from the same checkpoint needs)."""
    if not options:
        return None
    check_model_options(options)  # an unknown key fails here too, naming it
    return {k: v for k, v in options.items() if k in SOURCE_KEYS} or None


def parse_model_option(text: str) -> tuple[str, object]:
    """`KEY=VALUE` from the command line: VALUE is read as JSON when it parses (true, 3, {"a": 1}), else a string."""
    if not isinstance(text, str) or "=" not in text:
        raise ValueError(f"a model option is KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip().replace("-", "_")
    if not key:
        raise ValueError(f"a model option is KEY=VALUE, got {text!r}")
    if key in _STRING_KEYS:  # `revision=1234` is a branch name, not a number
        return key, raw
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "device_map":
        value = raw  # device_map=0: GPU 0
    return key, value
