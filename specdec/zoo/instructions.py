"""Chat prompts assembled from text already on the machine (nothing is downloaded).

A drafter for an instruct model learns best on the model's own answers to the kind of requests it will serve
(EAGLE-3, SpecForge: regenerate the responses with the target). This module builds the *requests*: code tasks
and chat-style questions made from

  - the Python standard library's source (functions with docstrings: "write a function that …", "explain this
    code", "write tests for …", "add type hints to …"; modules' docstrings: "what does module X do", "summarize"),
  - the installed distributions' one-line summaries (``importlib.metadata``): "what is package X for",
  - manual pages' NAME lines when ``/usr/share/man`` exists: "what does the command X do".

Every prompt is a plain user message; the target's chat template is applied where the responses are made
(`specdec.zoo.responses`). The result depends only on the files found and the seed (sorted walks, one
`random.Random(seed)`), so the same machine gives the same prompts.
"""

from __future__ import annotations

import ast
import gzip
import importlib.metadata
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Prompt", "build_prompts", "stdlib_functions", "package_summaries", "man_summaries", "DEMO_PROMPTS",
           "GENERAL_PROMPTS"]

# Held out of training: what `specdec demo` asks (chat and code, answered through the chat template). Three are in
# the styles the prompts below are built in (checked absent from the shipped head's training prompts), three are
# general questions.
DEMO_PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function `is_palindrome(text)` that returns True when text reads the same forwards and backwards.",
    "Explain what this Python function does:\n\n```python\ndef mean(values):\n"
    "    \"\"\"Return the arithmetic mean of values.\"\"\"\n    return sum(values) / len(values)\n```",
    "Explain Python's `itertools` module in simple terms.",
    "What are common mistakes people make with Python's `datetime` module?",
    "Write a Python class for a stack with push, pop and peek methods.",
)
# The general questions the demo asked before (the head's α is lower on them: MODEL_CARD.md of smol_head).
GENERAL_PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "What is the difference between a list and a tuple in Python?",
    "Write a Python function that reverses the words in a sentence.",
    "Explain what a hash table is in simple terms.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Give me three tips for writing readable code.",
)


@dataclass(frozen=True)
class Prompt:
    kind: str  # which template made it: "write", "explain", "tests", "hints", "usage", "module", "package", ...
    text: str  # the user message


@dataclass(frozen=True)
class FunctionInfo:
    module: str  # dotted stdlib module name
    name: str
    signature: str  # "name(a, b=1)"
    summary: str  # the docstring's first sentence
    source: str  # the function's source, docstring included
    bare_source: str  # the same without its docstring


def _first_sentence(doc: str, limit: int = 200) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence if len(sentence) <= limit else ""


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _skip(path: Path, root: Path) -> bool:
    rel = path.relative_to(root).parts
    return bool(set(rel) & {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo",
                            "__pycache__", "ensurepip", "pydoc_data"}) or rel[0].startswith(("_", "config-"))


def stdlib_functions(max_lines: int = 30, root: str | Path | None = None) -> tuple[list[FunctionInfo], dict[str, str]]:
    """Public top-level functions and methods with a docstring, at most `max_lines` long, from the stdlib sources
    (parsed with `ast`, never imported), and each module's docstring summary: (functions, {module: summary})."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    functions, modules = [], {}
    for path in sorted(root.rglob("*.py")):
        if _skip(path, root):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        module = _module_name(root, path)
        doc = ast.get_docstring(tree)
        if doc and (summary := _first_sentence(doc)):
            modules[module] = summary
        lines = text.splitlines()
        nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
            nodes += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        for node in nodes:
            doc = ast.get_docstring(node)
            if node.name.startswith("_") or not doc or node.end_lineno - node.lineno + 1 > max_lines:
                continue
            summary = _first_sentence(doc)
            if not summary or len(summary) < 15:
                continue
            source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            indent = len(source) - len(source.lstrip())
            source = "\n".join(line[indent:] for line in source.splitlines())
            body = node.body[0]
            bare = "\n".join(ln[indent:] for i, ln in enumerate(lines[node.lineno - 1 : node.end_lineno], node.lineno)
                             if not body.lineno <= i <= body.end_lineno)
            args = ast.unparse(node.args)
            functions.append(FunctionInfo(module, node.name, f"{node.name}({args})", summary, source, bare))
    return functions, modules


def package_summaries() -> list[tuple[str, str]]:
    """(name, one-line summary) of the installed distributions, sorted by name, duplicates dropped."""
    seen = {}
    for dist in importlib.metadata.distributions():
        name, summary = dist.metadata.get("Name"), dist.metadata.get("Summary")
        if name and summary and summary.strip() not in ("", "UNKNOWN") and name.lower() not in seen:
            seen[name.lower()] = (name, " ".join(summary.split()))
    return [seen[k] for k in sorted(seen)]


def man_summaries(folder: str | Path = "/usr/share/man/man1", limit: int = 5000) -> list[tuple[str, str]]:
    """(command, what it does) from the NAME sections of manual pages (gzipped troff); empty without them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.1*"))[:limit]:
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                head = f.read(4000)
        except (OSError, EOFError):
            continue
        match = re.search(r"^\.SH\s+\"?NAME\"?\s*\n(.+?)\n", head, re.M)
        if not match:
            continue
        line = re.sub(r"\\f[BIRP]|\\-|\\\(em|\\", lambda m: "-" if m.group(0) in ("\\-", "\\(em") else "", match.group(1))
        name, sep, desc = line.partition(" - ")
        name = name.split(",")[0].strip()
        if sep and name and desc and re.fullmatch(r"[\w.+-]+", name):
            out.append((name, desc.strip().rstrip(".")))
    return out


_CODE_TEMPLATES = {
    "write": "Write a Python function `{signature}` that {summary_lc}",
    "explain": "Explain what this Python function does:\n\n```python\n{source}\n```",
    "tests": "Write unit tests with the unittest module for this function:\n\n```python\n{source}\n```",
    "hints": "Add type hints and a docstring to this Python function:\n\n```python\n{bare_source}\n```",
    "usage": "How do I use `{module}.{name}` in Python? Show a short example.",
    "improve": "How could this Python function be improved?\n\n```python\n{bare_source}\n```",
}
_CHAT_TEMPLATES = {
    "module": ("What does the `{module}` module in Python's standard library do?",
               "When would I use Python's `{module}` module? It is described as: \"{summary}\""),
    "summarize": ("Summarize in one sentence: {summary}", "Explain this to a beginner: {summary}"),
    "package": ("What is the Python package `{name}` used for? Its description says: \"{summary}\"",
                "I found a Python package called `{name}` (\"{summary}\"). Should I use it, and how do I install it?"),
    "command": ("What does the `{name}` command do on Linux?",
                "Explain the Unix command `{name}` ({summary}) and give an example of using it.",
                "How do I {summary_lc} on Linux?"),
}
# General questions about a topic named by local text (a stdlib module, a class, a package, a command).
_TOPIC_TEMPLATES = (
    "Explain {topic} in simple terms.",
    "Give me three tips for working with {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a short paragraph about {topic} for a beginner.",
    "What are common mistakes people make with {topic}?",
    "Compare {topic} with {other}. When would I choose each?",
)


def _lc(sentence: str) -> str:
    return sentence[:1].lower() + sentence[1:] if sentence[1:2].islower() else sentence


def build_prompts(count: int, seed: int = 0, *, code_fraction: float = 0.6,
                  stdlib_root: str | Path | None = None, man_folder: str | Path = "/usr/share/man/man1") -> list[Prompt]:
    """`count` distinct prompts (fewer when the machine has too little text), about `code_fraction` code tasks, the
    rest chat questions; never one of `DEMO_PROMPTS`. Deterministic for a given machine and seed."""
    if count < 1:
        raise ValueError(f"count must be ≥ 1, got {count}")
    if not 0.0 <= code_fraction <= 1.0:
        raise ValueError(f"code_fraction must be in [0, 1], got {code_fraction}")
    rng = random.Random(seed)
    functions, modules = stdlib_functions(root=stdlib_root)
    code: list[Prompt] = []
    for info in functions:
        fields = {"signature": info.signature, "summary_lc": _lc(info.summary), "source": info.source,
                  "bare_source": info.bare_source, "module": info.module, "name": info.name}
        for kind, template in _CODE_TEMPLATES.items():
            code.append(Prompt(kind, template.format(**fields)))
    chat: list[Prompt] = []
    for module, summary in sorted(modules.items()):
        for template in _CHAT_TEMPLATES["module"]:
            chat.append(Prompt("module", template.format(module=module, summary=summary)))
        for template in _CHAT_TEMPLATES["summarize"]:
            chat.append(Prompt("summarize", template.format(summary=summary)))
    packages, commands = package_summaries(), man_summaries(man_folder)
    for kind, rows in (("package", packages), ("command", commands)):
        for name, summary in rows:
            for template in _CHAT_TEMPLATES[kind]:
                chat.append(Prompt(kind, template.format(name=name, summary=summary, summary_lc=_lc(summary))))
    topics = sorted({f"Python's `{m}` module" for m in modules if "." not in m}
                    | {f"the Python package `{name}`" for name, _ in packages}
                    | {f"the `{name}` command" for name, _ in commands})
    for topic in topics:
        for template in _TOPIC_TEMPLATES:
            chat.append(Prompt("topic", template.format(topic=topic, other=rng.choice(topics))))
    held_out = set(DEMO_PROMPTS) | set(GENERAL_PROMPTS)
    pools = []
    for pool in (code, chat):
        unique = list({p.text: p for p in pool if p.text not in held_out}.values())
        rng.shuffle(unique)
        pools.append(unique)
    n_code = min(len(pools[0]), round(code_fraction * count))
    n_chat = min(len(pools[1]), count - n_code)
    n_code = min(len(pools[0]), count - n_chat)  # top up with code when chat runs short
    prompts = pools[0][:n_code] + pools[1][:n_chat]
    rng.shuffle(prompts)
    return prompts
