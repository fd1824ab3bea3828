"""The held-in prompt set: real code prompts of varied lengths, built from local Python sources.

A prompt is a function's signature and docstring (the text from `def` to the docstring's end) taken from
the interpreter's own stdlib, the way a user asks a code model to write a body. Files are read in sorted
order and prompts picked evenly over token lengths [min_tokens, max_tokens], so the set is deterministic
for a given Python installation and tokenizer.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

__all__ = ["code_prompts", "prompt_texts"]


def prompt_texts(limit_files: int = 4000) -> list[str]:
    """Signature + docstring texts from the stdlib (deterministic order)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    for path in files[:limit_files]:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant)
                    and isinstance(doc.value.value, str)):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            text = "\n".join(lines[start : doc.end_lineno]) + "\n"
            indent = len(text) - len(text.lstrip(" "))
            texts.append("\n".join(line[indent:] for line in text.splitlines()) + "\n")
    return texts


def code_prompts(encode, count: int = 160, min_tokens: int = 30, max_tokens: int = 600) -> list[list[int]]:
    """`count` token-id prompts spread evenly over [min_tokens, max_tokens]; `encode(text) -> list[int]`."""
    encoded = []
    for text in prompt_texts():
        ids = encode(text)
        if min_tokens <= len(ids) <= max_tokens:
            encoded.append(ids)
    if not encoded:
        raise ValueError(f"no stdlib function prompt has {min_tokens}..{max_tokens} tokens")
    encoded.sort(key=len)
    if len(encoded) <= count:
        return encoded
    step = len(encoded) / count
    picked = [encoded[int(i * step)] for i in range(count)]
    # interleave short and long prompts so any prefix of the set spans the length range
    return picked[0::2] + picked[1::2][::-1]
