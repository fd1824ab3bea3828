"""A tokenizer folder's files, read as JSON to say which field is wrong when transformers / tokenizers cannot load
them (their own errors are internal: a malformed BPE `tokenizer.json` surfaced as `KeyError: 'added_tokens'`).

`tokenizer_fault(folder)` reads `tokenizer.json` and `tokenizer_config.json` and returns the first fault as one
line naming the file and the field (None when their structure looks right); `load.load_tokenizer` calls it when
loading fails, so a working tokenizer pays nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["tokenizer_fault", "MODEL_TYPES"]

MODEL_TYPES = ("BPE", "WordPiece", "WordLevel", "Unigram")  # tokenizers' models
_MAX_BYTES = 1 << 30


def tokenizer_fault(folder: Path) -> str | None:
    """The first structural fault of the tokenizer files in `folder` (file: field: what is wrong), or None."""
    for name, check in (("tokenizer.json", _tokenizer_json), ("tokenizer_config.json", _tokenizer_config)):
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            if path.stat().st_size > _MAX_BYTES:
                return f"{name}: larger than {_MAX_BYTES >> 30} GiB"
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"{name}: not valid JSON ({type(err).__name__} at {getattr(err, 'pos', '?')})"
        if not isinstance(data, dict):
            return f"{name}: must hold a JSON object, got {type(data).__name__}"
        fault = check(data)
        if fault is not None:
            return f"{name}: {fault}"
    return None


def _tokenizer_json(data: dict) -> str | None:
    added = data.get("added_tokens")
    if not isinstance(added, list):
        return f"added_tokens must be a list (of {{id, content, ...}}), got {_kind(added)}"
    for i, token in enumerate(added):
        if not isinstance(token, dict) or not _is_int(token.get("id")) or not isinstance(token.get("content"), str):
            return f"added_tokens[{i}] must be an object with an integer id and a string content"
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"{key} must be an object or null, got {_kind(data[key])}"
    model = data.get("model")
    if not isinstance(model, dict):
        return f"model must be an object, got {_kind(model)}"
    kind = model.get("type", "BPE")
    if kind not in MODEL_TYPES:
        return f"model.type {kind!r:.40} is not one of {', '.join(MODEL_TYPES)}"
    vocab = model.get("vocab")
    if kind == "Unigram":
        if not isinstance(vocab, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
                                                  and isinstance(e[1], (int, float)) for e in vocab):
            return "model.vocab must be a list of [piece, score] pairs (Unigram)"
        return None
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and _is_int(v) and v >= 0 for k, v in vocab.items()):
        return f"model.vocab must be an object of token → id >= 0 ({kind})"
    if kind == "BPE":
        merges = model.get("merges")
        if not isinstance(merges, list) or not all(
                (isinstance(m, str) and len(m.split(" ")) == 2) or (isinstance(m, list) and len(m) == 2
                                                                    and all(isinstance(p, str) for p in m))
                for m in merges):
            return "model.merges must be a list of 'a b' strings or [a, b] pairs (BPE)"
    return None


def _tokenizer_config(data: dict) -> str | None:
    template = data.get("chat_template")
    if template is not None and not isinstance(template, (str, list)):
        return f"chat_template must be a string (or a list of named templates), got {_kind(template)}"
    decoder = data.get("added_tokens_decoder")
    if decoder is not None and not isinstance(decoder, dict):
        return f"added_tokens_decoder must be an object of id → token, got {_kind(decoder)}"
    length = data.get("model_max_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, float)) or length < 1):
        return f"model_max_length must be a number >= 1, got {length!r:.40}"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
    return "nothing" if value is None else type(value).__name__
