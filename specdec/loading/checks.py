"""Reading a checkpoint folder before transformers does: config, shard index, safetensors headers.

Everything here reads JSON and file headers only, never a weight and never code. The refusals: custom code
(`auto_map`), a `model_type` transformers does not know, numbers no real model has (the bounds below: a
`num_hidden_layers: 1000000` is refused here, before anything allocates), pickled weights unless opted in,
shard names that leave the folder, truncated or corrupt safetensors, and a config whose layer count does not
match the layers the weights hold (the missing layers would be randomly initialised).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

__all__ = ["inspect_checkpoint", "check_config", "check_bounds", "check_layer_count", "read_json",
           "SAFETENSORS_INDEX", "PICKLE_INDEX", "MAX_LAYERS", "MAX_PARAMETERS"]

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
_MAX_JSON_BYTES = 64 << 20  # a config or shard index larger than this is not a checkpoint

#: Bounds on what a config may declare (each far above any released model: Llama 3.1 405B has 126 layers,
#: hidden size 16384, 128K vocabulary): checked before anything is allocated.
MAX_LAYERS = 1024
MAX_PARAMETERS = 4 * 10**12
_BOUNDS = {  # config field (and its aliases in other families) → largest accepted value
    "num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_layers": MAX_LAYERS, "n_layers": MAX_LAYERS,
    "decoder_layers": MAX_LAYERS, "encoder_layers": MAX_LAYERS, "num_decoder_layers": MAX_LAYERS,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "d_model": 1 << 17,
    "intermediate_size": 1 << 20, "n_inner": 1 << 20, "d_ff": 1 << 20, "ffn_dim": 1 << 20,
    "num_attention_heads": 4096, "n_head": 4096, "num_heads": 4096, "num_key_value_heads": 4096,
    "head_dim": 1 << 14, "vocab_size": 1 << 24, "max_position_embeddings": 1 << 25, "n_positions": 1 << 25,
    "num_local_experts": 4096, "num_experts": 4096,
}
# a layer index in a tensor name: model.layers.3., transformer.h.3., gpt_neox.layers.3., model.decoder.layers.3.
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")


def read_json(path: Path, what: str) -> dict:
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
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        more = f" and {len(ggufs) - 3} more" if len(ggufs) > 3 else ""
        hint = f"; it holds GGUF files ({', '.join(ggufs[:3])}{more}): pass one's path, or model option " \
            "gguf_file=NAME" if ggufs else ""
        raise FileNotFoundError(f"{what} directory {path} has no config.json: not a transformers checkpoint{hint}")
    return path


def _bounded_int(config: dict, key: str, where: str, what: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "num_key_value_heads" else 1):
        raise ValueError(f"{what}: {where} has {key} {value!r}; it must be an integer >= 1")
    if value > _BOUNDS[key]:
        raise ValueError(f"{what}: {where} has {key} {value}, more than specdec accepts ({_BOUNDS[key]}): "
                         "not a real checkpoint")
    return value


def _first(config: dict, *keys: str) -> int:
    return next((config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)), 0)


def estimated_parameters(config: dict) -> int:
    """A rough parameter count from the config (dense layers; MoE experts counted when declared)."""
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
    inner = _first(config, "intermediate_size", "n_inner", "d_ff", "ffn_dim") or 4 * hidden
    experts = max(1, _first(config, "num_local_experts", "num_experts"))
    vocab = _first(config, "vocab_size")
    heads = 1 if config.get("tie_word_embeddings", True) else 2
    return layers * (4 * hidden * hidden + 3 * hidden * inner * experts) + heads * vocab * hidden


def check_config(config: dict, where: str, what: str) -> None:
    """No custom code, a model_type transformers knows, every size bounded and every value the runners read
    checked (`config_values`), before anything allocates."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if "auto_map" in config:
        raise ValueError(f"{what}: {where} asks for custom code (auto_map); specdec never runs code "
                         "from a checkpoint (trust_remote_code is always False)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"{what}: {where} has model_type {model_type!r}, which this transformers "
                         "does not know; specdec loads only architectures built into transformers")
    check_bounds(config, where, what)
    from specdec.loading.config_values import check_values

    check_values(config, where, what)  # finite, positive, known names, head arithmetic


def check_bounds(config: dict, where: str, what: str) -> None:
    """Every size a config declares is an integer within `_BOUNDS`, and the parameter estimate within bounds."""
    for part in (config, config.get("text_config")):
        if isinstance(part, dict):
            for key in _BOUNDS:
                _bounded_int(part, key, where, what)
    params = estimated_parameters(config)
    if params > MAX_PARAMETERS:
        raise ValueError(f"{what}: {where} declares about {params:.3g} parameters, more than specdec accepts "
                         f"({MAX_PARAMETERS:.0e})")


def check_layer_count(config: dict, tensor_names, where: str, what: str) -> None:
    """Refuse a decoder-only config that declares more (or fewer) layers than the weights hold.

    A config with more layers than its weights loads with those layers randomly initialised (transformers only
    warns); fewer layers silently drops the weights of the rest. Tensor names without a `layers.N.` / `h.N.`
    index (encoder-decoders, other layouts) are left to the check after loading (missing / unexpected tensors).
    """
    declared = config.get("num_hidden_layers", config.get("n_layer"))
    if config.get("is_encoder_decoder") or not isinstance(declared, int):
        return
    held = {int(m.group(1)) for name in tensor_names if (m := _LAYER_INDEX.search(name))}
    if not held:
        return
    count = max(held) + 1
    gaps = sorted(set(range(count)) - held)
    if declared > count or gaps:
        first = gaps[0] if gaps else count
        raise ValueError(f"{what}: the config declares {declared} layers but {where} holds weights for "
                         f"{len(held)} (layer {first} missing: it would be randomly initialised); pass "
                         "allow_weight_mismatch=True (--allow-weight-mismatch) to load it anyway")
    if declared < count:
        raise ValueError(f"{what}: {where} holds weights for {count} layers but the config uses {declared} "
                         f"(unexpected tensors of layers {declared}..{count - 1}); pass allow_weight_mismatch=True "
                         "(--allow-weight-mismatch) to load it anyway")


def _safetensors_names(file: Path, what: str) -> list[str]:
    """Header sanity (8-byte length, a JSON header, data ending exactly at the end of the file); tensor names."""
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
    return [k for k in header if k != "__metadata__"]


def _shard_files(folder: Path, index_name: str, what: str) -> list[Path]:
    """The files a shard index names, each confined to `folder` (no absolute paths, no `..`)."""
    index = read_json(folder / index_name, what)
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


def inspect_checkpoint(path: str | Path, *, what: str = "model", allow_pickle: bool = False,
                       allow_weight_mismatch: bool = False) -> dict:
    """Check a local checkpoint folder before anything is loaded or run; returns its config.json.

    Refuses (ValueError / FileNotFoundError, naming `what`): a missing folder or config.json, an `auto_map`
    (custom code), an unknown `model_type`, sizes past the bounds (`check_config`), no safetensors weights
    (pickled `.bin` weights only with `allow_pickle=True`), shard index entries outside the folder or missing,
    safetensors files whose header does not match their size, and (unless `allow_weight_mismatch`) a layer
    count the weights do not hold (`check_layer_count`).
    """
    folder = _check_dir(path, what)
    config = read_json(folder / "config.json", what)
    check_config(config, str(folder / "config.json"), what)
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
    names = [name for file in files for name in _safetensors_names(file, what)]
    if names and not allow_weight_mismatch:
        check_layer_count(config, names, str(folder), what)
    return config
