"""The shipped toy code pair (`specdec/assets/demo_pair`: target/ and draft/ folders) and its six prompts,
shared by `specdec demo --pair`, `specdec check`, the benchmarks and the scripts."""

from __future__ import annotations

from pathlib import Path

import os

__all__ = ["DEMO_PAIR", "PAIR_PROMPTS", "load_pair", "QWEN_TARGET", "QWEN_DRAFT", "QWEN_CPU_LINEAR",
           "qwen_pair_folder"]

DEMO_PAIR = Path(__file__).resolve().parent.parent / "assets" / "demo_pair"
#: the real pair `scripts/fetch_qwen_pair.py` makes (docs/QWEN_PAIR.md): two safetensors folders in one directory
QWEN_TARGET, QWEN_DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
#: the pair's CPU GEMMs (`fast.kernels.cpu_linear.MODE`): oneDNN on the weights themselves — no packed copy of the
#: 9.6 GB of fp32 weights, and a verify pass of 2–5 tokens ≈ 1.4–1.5 one-token passes (weight_major: up to 2.6;
#: docs/QWEN_PAIR.md, "Which GEMMs the pair should use")
QWEN_CPU_LINEAR = "onednn"


def qwen_pair_folder() -> Path:
    """Where the Qwen2.5-Coder pair is: $SPECDEC_QWEN_PAIR, else the fetch script's default destination."""
    return Path(os.environ.get("SPECDEC_QWEN_PAIR", "~/.cache/specdec/qwen2.5-coder")).expanduser()

# Each prompt ends inside a line: a prompt ending in "\n" would cut the byte-level BPE's usual
# "newline + indentation" token in two, and the model would read it as a return to column 0.
PAIR_PROMPTS = (
    'import os\nimport sys\n\n\ndef main(argv=None):\n    """Parse the command line and run."""\n    parser =',
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self.',
    'def read_lines(path, encoding="utf-8"):\n    """Return the lines of a text file."""\n    with open(',
    "import unittest\n\n\nclass TestSplit(unittest.TestCase):\n\n    def test_split(self):\n        self.",
    "import json\n\n\ndef load_config(path):\n    with open(path",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if',
)


def load_pair(folder: Path = DEMO_PAIR, device: str = "cpu", dtype: str = "float32", allow_pickle: bool = False,
              names: tuple[str, str] = ("target", "draft")):
    """(target, draft, tokenizer) from a pair folder with target/ and draft/ (or the two `names`; default fp32 on
    CPU), eval mode; local files only."""
    from specdec.loading import load_model, load_tokenizer

    folder = Path(folder)
    for name in names:
        if not (folder / name / "config.json").is_file():
            raise FileNotFoundError(f"{folder / name} is not a model folder (no config.json)")
    target = load_model(folder / names[0], device=device, dtype=dtype, what="target", allow_pickle=allow_pickle)
    draft = load_model(folder / names[1], device=device, dtype=dtype, what="draft", allow_pickle=allow_pickle)
    tokenizer = load_tokenizer(folder / names[0])
    return target, draft, tokenizer
