"""Devices and dtypes as users name them, and quiet transformers progress bars."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys

import torch

__all__ = ["DTYPES", "resolve_device", "resolve_dtype", "quiet_progress_bars"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


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
    """Silence transformers' / huggingface_hub's progress bars ("Loading weights", the GGUF conversion) inside
    the block only."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # the GGUF converter's bar ("Converting and de-quantizing GGUF tensors") is a plain tqdm the switch above
    # does not reach: swapped for a disabled one inside the block only
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf_utils is None and importlib.util.find_spec("gguf") is not None:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_enabled:
            hf_logging.enable_progress_bar()
