"""Benchmark workloads: named prompt sets (token ids) with their own acceptance profile, from local files only.

`code_workload`: held-out stdlib sources (the files the zoo's code corpus leaves out, `heldout_stdlib_files`);
`text_workload`: sentences from the system's gettext catalogs (see `specdec.zoo.corpus`), with a fallback prose;
`repetitive_workload`: repeated blocks (a drafter's best case); `build_workloads` by name (`WORKLOAD_NAMES`).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Workload", "WORKLOAD_NAMES", "build_workloads", "code_workload", "text_workload", "repetitive_workload",
           "heldout_stdlib_files"]


@dataclass(frozen=True)
class Workload:
    """Prompts with one acceptance profile. `sources` says where each prompt came from."""

    name: str
    description: str
    prompts: tuple[tuple[int, ...], ...]
    sources: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.prompts or any(len(p) == 0 for p in self.prompts):
            raise ValueError(f"workload {self.name!r} needs at least one prompt and no empty prompt")

    def summary(self) -> dict:
        lengths = [len(p) for p in self.prompts]
        return {"name": self.name, "description": self.description, "num_prompts": len(self.prompts),
                "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths), "sources": list(self.sources)}



WORKLOAD_NAMES = ("code", "text", "repetitive")


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _document_start(tokenizer) -> list[int]:
    # The zoo's training streams put EOS between documents, so a document start follows EOS.
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else []


def _cut(tokenizer, text: str, prompt_tokens: int) -> list[int] | None:
    ids = _encode(tokenizer, text[: 16 * prompt_tokens])  # a token is rarely over 16 characters
    if len(ids) < prompt_tokens:
        return None
    return _document_start(tokenizer) + ids[:prompt_tokens]


def heldout_stdlib_files(val_fraction: float = 0.01, min_bytes: int = 3000) -> list[Path]:
    """Standard-library sources in the zoo's validation split (by content hash, as `code_documents` splits
    them), so a model trained by `specdec train prepare --corpus code` never saw them. Sorted by hash;
    codec tables (`encodings/`) are skipped."""
    from specdec.zoo.corpus import iter_python_files, split_of

    root = sysconfig.get_paths()["stdlib"]
    found = []
    for path in iter_python_files([root]):
        if "encodings" in path.parts or path.is_symlink():
            continue
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        if len(raw) < min_bytes:
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if split_of(digest, val_fraction) == "val":
            found.append((digest, path))
    return [p for _, p in sorted(found)]


def code_workload(tokenizer, num_prompts: int = 4, prompt_tokens: int = 128, *, val_fraction: float = 0.01) -> Workload:
    """Held-out Python: each prompt starts at the first top-level `def`/`class` of a held-out stdlib file."""
    prompts, sources = [], []
    for path in heldout_stdlib_files(val_fraction):
        lines = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").split("\n")
        start = next((i for i, line in enumerate(lines) if line.startswith(("def ", "class "))), None)
        if start is None:
            continue
        ids = _cut(tokenizer, "\n".join(lines[start:]), prompt_tokens)
        if ids is None:
            continue
        prompts.append(tuple(ids))
        sources.append(f"{Path(*path.parts[-2:])}:{start + 1}")
        if len(prompts) == num_prompts:
            break
    if not prompts:
        raise ValueError("code workload: no held-out stdlib file long enough for a prompt")
    return Workload("code", f"held-out stdlib Python from the first def/class, {prompt_tokens} tokens",
                    tuple(prompts), tuple(sources))


_FALLBACK_PROSE = (
    "The library keeps a small cache of recently opened files so that a second request for the same file does "
    "not have to wait for the disk. When the cache is full, the file that was used least recently is closed. "
    "This works well for most programs, but a program that opens thousands of files once each gains nothing.",
    "Before you change the settings of the system, make a copy of the current configuration. If the new settings "
    "do not work as expected, you can restore the copy and start again. Most problems come from a single wrong "
    "value, so change one thing at a time and check the result after every change.",
    "A good report describes what you did, what you expected to happen and what happened instead. Include the "
    "exact version of the program and the steps that lead to the problem. Reports that others can reproduce are "
    "fixed much sooner than reports that only say that something is broken.",
    "The window manager decides where new windows appear and how they are arranged on the screen. Some users "
    "prefer windows that open in the center, others like them next to the window that opened them. The choice "
    "can be changed at any time and takes effect for the next window that opens.",
)


def text_workload(tokenizer, num_prompts: int = 4, prompt_tokens: int = 128) -> Workload:
    """English prose: full-sentence English messages of the held-out gettext catalogs (the zoo's EnDe
    out-of-domain split), joined into paragraphs; a fixed list of English paragraphs if no catalog exists."""
    sentences: list[str] = []
    origin = "gettext"
    try:
        from specdec.zoo.corpus import EmptyCorpusError, ende_pairs

        sentences = [p.en for p in ende_pairs() if p.split == "ood" and _is_sentence(p.en)]
    except (EmptyCorpusError, OSError):
        sentences = []
    prompts, sources = [], []
    if sentences:
        paragraph: list[str] = []
        for sentence in sentences:
            paragraph.append(sentence)
            ids = _cut(tokenizer, " ".join(paragraph), prompt_tokens)
            if ids is not None:
                prompts.append(tuple(ids))
                sources.append(f"gettext val sentences: {paragraph[0][:40]!r}…")
                paragraph = []
                if len(prompts) == num_prompts:
                    break
    if not prompts:
        origin = "built-in"
        for i, text in enumerate(_FALLBACK_PROSE[:num_prompts]):
            ids = _document_start(tokenizer) + _encode(tokenizer, text)[:prompt_tokens]
            prompts.append(tuple(ids))
            sources.append(f"built-in paragraph {i}")
    return Workload("text", f"English prose ({origin}), {prompt_tokens} tokens", tuple(prompts), tuple(sources))


def _is_sentence(text: str) -> bool:
    return (len(text) >= 60 and text[0].isupper() and text.rstrip().endswith(".") and "%" not in text
            and "\n" not in text and "{" not in text)


# Verbatim repetition: the continuation is one more copy of the block. These blocks are ones the
# shipped demo target keeps copying (a weak target breaks out of many other repetitions), so the
# workload measures copying: prompt lookup drafts it perfectly, a one-layer model drafter does not.
_REPETITIVE_BLOCKS = (
    "ERROR_CODE = 15\n",
    "assert table[8] == 8 * 8, \"row 8\"\n",
    "for i in range(10):\n    total += values[i] * weights[i]\n    count += 1\n",
    "result = client.get(url, timeout=30)\nresult.raise_for_status()\n",
)


def repetitive_workload(tokenizer, num_prompts: int = 4, prompt_tokens: int = 128) -> Workload:
    """Highly repetitive code: a block of code repeated verbatim (whole copies, at least `prompt_tokens`
    tokens); the target's continuation is more copies, which prompt lookup predicts exactly."""
    prompts, sources = [], []
    for k in range(num_prompts):
        block = _REPETITIVE_BLOCKS[k % len(_REPETITIVE_BLOCKS)]
        copies = 1
        while len(_encode(tokenizer, block * copies)) < prompt_tokens:
            copies += 1
        prompts.append(tuple(_document_start(tokenizer) + _encode(tokenizer, block * copies)))
        sources.append(f"block {k % len(_REPETITIVE_BLOCKS)} × {copies}")
    return Workload("repetitive", "a code block repeated verbatim", tuple(prompts), tuple(sources))


def build_workloads(tokenizer, names: Sequence[str], num_prompts: int = 4, prompt_tokens: int = 128) -> list[Workload]:
    builders = {"code": code_workload, "text": text_workload, "repetitive": repetitive_workload}
    out = []
    for name in names:
        if name not in builders:
            raise ValueError(f"unknown workload {name!r}: use {', '.join(WORKLOAD_NAMES)}")
        out.append(builders[name](tokenizer, num_prompts, prompt_tokens))
    return out
