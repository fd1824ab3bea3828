"""cli/common.py: the helpers every subcommand shares."""

from __future__ import annotations

import pytest

from specdec.cli import CLIError
from specdec.cli.common import encode_prompts


class _Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text.strip()]


def test_encode_prompts_names_an_empty_prompt_one_based() -> None:
    assert encode_prompts(_Tokenizer(), ["ab", "c"]) == [[97, 98], [99]]
    with pytest.raises(CLIError, match=r"^--prompt 2 is empty after tokenization$"):
        encode_prompts(_Tokenizer(), ["ab", "  "])
