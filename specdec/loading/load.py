"""`load_model` / `load_tokenizer`: the one loader behind `specdec.load`, `specdec generate`, `serve` and the rest.

Order: validate the model options → resolve the source (folder, GGUF, hub snapshot) → read the config and
weight headers ourselves (`checks` / `gguf`) → check the attention layout → only then `from_pretrained` with
`local_files_only=True, trust_remote_code=False` → refuse a model whose weights did not fill it (missing or
unexpected tensors reported by transformers) unless `allow_weight_mismatch`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from specdec.loading.checks import check_config, inspect_checkpoint, read_json
from specdec.loading.device import quiet_progress_bars, resolve_device, resolve_dtype
from specdec.loading.gguf import inspect_gguf, require_gguf
from specdec.loading.options import ModelOptions, check_model_options
from specdec.loading.source import ModelSource, resolve_source

logger = logging.getLogger(__name__)

__all__ = ["load_model", "load_tokenizer", "resolve_model_source", "placed_like"]

_SHOWN_KEYS = 4  # tensor names an error message lists before "and N more"


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def resolve_model_source(path, *, what: str = "model", model_kwargs=None) -> ModelSource:
    """Where `path` (a folder, a .gguf file, a hub id) is on this machine, under the model options."""
    return resolve_source(path, check_model_options(model_kwargs), what=what)


def _names(keys, limit: int = _SHOWN_KEYS) -> str:
    keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _check_loading_info(info: dict, source: ModelSource, what: str) -> None:
    """Refuse weights that do not fill the model: missing tensors would stay randomly initialised."""
    missing, unexpected = info.get("missing_keys") or (), info.get("unexpected_keys") or ()
    mismatched = info.get("mismatched_keys") or ()
    hint = "; pass allow_weight_mismatch=True (--allow-weight-mismatch) to load it anyway"
    if missing or mismatched:
        raise ValueError(f"{what}: {source.where} lacks weights the model needs (they would be randomly "
                         f"initialised): {_names([*missing, *mismatched])}{hint}")
    if unexpected:
        raise ValueError(f"{what}: {source.where} holds tensors the config does not use: {_names(unexpected)}{hint}")


def _engine_covers(config) -> bool:
    from specdec.fast.families import LlamaShape

    try:
        LlamaShape.from_hf(config)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _dtype(dtype, options: ModelOptions, device: torch.device, what: str) -> torch.dtype:
    if options.dtype not in (None, "auto") and dtype not in (None, "auto") and resolve_dtype(dtype, device) \
            != resolve_dtype(options.dtype, device):
        raise ValueError(f"{what}: dtype {dtype!r} and model option torch_dtype={options.dtype!r} disagree")
    return resolve_dtype(options.dtype if options.dtype not in (None, "auto") else dtype, device)


def load_model(path: str | Path, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
               what: str = "model", allow_pickle: bool = False, model_kwargs=None,
               allow_weight_mismatch: bool = False) -> torch.nn.Module:
    """An eval-mode transformers model (decoder-only or encoder-decoder, from its config) from this machine.

    path           a checkpoint folder, a .gguf file, or a hub id (`org/name`) in the local Hugging Face cache
    model_kwargs   validated `from_pretrained` options (`specdec.loading.options`): revision, gguf_file,
                   subfolder, cache_dir, torch_dtype, device_map, max_memory, attn_implementation,
                   quantization_config, low_cpu_mem_usage, variant
    allow_pickle   also load pickled .bin weights (unpickling can run code)
    allow_weight_mismatch  load even when the weights do not fill the model or hold tensors it does not use
    Any failure is one line (ValueError / FileNotFoundError / ImportError) naming `what` and the file or folder.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from specdec.models.protocol import check_supported_model

    options = check_model_options(model_kwargs)
    device_map = options.device_map
    dev = resolve_device(device) if device_map is None else resolve_device("auto")
    if device_map is not None and device not in (None, "auto"):
        raise ValueError(f"{what}: device={str(device)!r} and model option device_map both place the model; "
                         "pass one of them")
    torch_dtype = _dtype(dtype, options, dev, what)
    source = resolve_source(path, options, what=what)
    logger.info("%s: loading %s (%s)", what, source.where, source.kind)
    started = time.perf_counter()
    gguf = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if source.gguf_file:
        inspect_gguf(source.folder / source.gguf_file, what=what, allow_weight_mismatch=allow_weight_mismatch)
    else:
        inspect_checkpoint(source.folder, what=what, allow_pickle=allow_pickle,
                           allow_weight_mismatch=allow_weight_mismatch)
    if device_map is not None:
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:
            raise ImportError(f"{what}: model option device_map needs the accelerate package: pip install accelerate")
    try:
        config = AutoConfig.from_pretrained(str(source.folder), local_files_only=True, trust_remote_code=False, **gguf)
    except Exception as err:  # noqa: BLE001 - a bad config is a user error, reported in one line
        raise ValueError(f"{what}: cannot read the config in {source.where}: {_one_line(err)}") from None
    if source.gguf_file:  # the config transformers converted from the GGUF metadata
        check_config(config.to_dict(), source.where, what)
    if not _engine_covers(config):  # the engine rolls sliding windows back; the transformers loop cannot
        check_supported_model(config, what)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    kwargs = {"local_files_only": True, "trust_remote_code": False, **gguf, **options.load}
    if not allow_pickle and not source.gguf_file:
        kwargs["use_safetensors"] = True
    if source.gguf_file:  # the config read above: transformers would parse the GGUF's metadata once more for it
        kwargs["config"] = config
    try:
        with quiet_progress_bars():
            model, info = auto.from_pretrained(str(source.folder), dtype=torch_dtype, output_loading_info=True,
                                               **kwargs)
    except Exception as err:  # noqa: BLE001 - corrupt weights, unsupported class, out of memory: one line
        raise ValueError(f"{what}: cannot load a model from {source.where}: {_one_line(err)}") from None
    if not allow_weight_mismatch:
        _check_loading_info(info, source, what)
    if source.gguf_file:  # (the engine reads its quantized tensors from the file: `fast.quant.attach`)
        from specdec.loading.gguf_tensors import remember_gguf

        remember_gguf(model, source.folder / source.gguf_file)
    logger.info("%s: loaded %s in %.1f s (%s%s): %s, %.1fM parameters, %s", what, source.where,
                time.perf_counter() - started, source.kind, f", commit {source.commit[:12]}" if source.commit else "",
                type(model).__name__, sum(p.numel() for p in model.parameters()) / 1e6,
                str(next(model.parameters()).dtype).removeprefix("torch."))
    return (model if device_map is not None else model.to(dev)).eval()


def placed_like(device, dtype, model_kwargs=None) -> dict:
    """`device` / `dtype` keywords that load a draft next to its target (the target's device and dtype), leaving
    out what the draft's own model options decide (`device_map`, `torch_dtype`)."""
    options = check_model_options(model_kwargs)
    placed = {} if options.device_map is not None else {"device": device}
    if options.dtype in (None, "auto"):
        placed["dtype"] = dtype
    return placed


def load_tokenizer(path: str | Path, *, what: str = "tokenizer", model_kwargs=None):
    """The tokenizer (and chat template) of a folder, a .gguf file or a cached hub id; never custom code."""
    from transformers import AutoTokenizer

    options = check_model_options(model_kwargs)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a directory path, a .gguf file or a hub id, got {type(path).__name__}")
    source = resolve_source(path, options, what=what)
    gguf = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if source.gguf_file:
        require_gguf(what)
    for name in ("tokenizer_config.json", "config.json"):
        if not gguf and (source.folder / name).is_file() and "auto_map" in read_json(source.folder / name, what):
            raise ValueError(f"{what}: {source.folder / name} asks for custom code (auto_map); specdec never runs code "
                             "from a checkpoint")
    logger.info("%s: loading %s (%s)", what, source.where, source.kind)
    started = time.perf_counter()
    try:
        with quiet_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(str(source.folder), local_files_only=True,
                                                      trust_remote_code=False, **gguf)
    except Exception as err:  # noqa: BLE001
        from specdec.loading.tokenizer_files import tokenizer_fault

        fault = None if gguf else tokenizer_fault(source.folder)  # the field at fault, not the library's text
        if fault is not None:
            raise ValueError(f"{what}: {source.where} has a malformed {fault}") from None
        expected = "a GGUF with tokenizer metadata" if gguf else "tokenizer.json / tokenizer_config.json"
        raise FileNotFoundError(f"{what}: no usable tokenizer in {source.where} (expected {expected}): "
                                f"{_one_line(err)}") from None
    logger.info("%s: loaded in %.1f s (%d tokens%s)", what, time.perf_counter() - started, len(tokenizer),
                ", a chat template" if getattr(tokenizer, "chat_template", None) else ", no chat template")
    return tokenizer
