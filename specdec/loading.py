"""Loading checkpoints from LOCAL directories (never a hub download): models and tokenizers.

An outer-ring helper for the CLI, benchmarks and demos; the core never imports it.
"""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available on this machine")
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


def _check_dir(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {path} (specdec loads local checkpoints only)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{what} directory {path} has no config.json: not a transformers checkpoint")
    return path


def load_model(path: str | Path, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
               what: str = "model") -> torch.nn.Module:
    """`from_pretrained` on a local directory; decoder-only or encoder-decoder, picked from its config."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM
    from transformers.utils import logging as hf_logging

    path = _check_dir(path, what)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    hf_logging.disable_progress_bar()
    try:
        model = auto.from_pretrained(str(path), local_files_only=True, dtype=torch_dtype)
    except TypeError:  # older transformers spell it torch_dtype
        model = auto.from_pretrained(str(path), local_files_only=True, torch_dtype=torch_dtype)
    return model.to(dev).eval()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"no tokenizer in {path} (expected tokenizer.json / tokenizer_config.json): {err}") from err
