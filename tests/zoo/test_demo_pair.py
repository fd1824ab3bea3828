"""The shipped demo pair (specdec/assets/demo_pair): size limits, loading, and exact greedy speculation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

PAIR = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair"
MiB = 2**20

pytestmark = pytest.mark.skipif(not (PAIR / "target" / "config.json").is_file(), reason="demo pair not shipped yet")


def test_shards_and_total_size():
    shards = sorted(PAIR.glob("*/*.safetensors"))
    assert {p.parent.name for p in shards} == {"target", "draft"}
    assert all(p.stat().st_size <= 16 * MiB for p in shards), [(p.name, p.stat().st_size) for p in shards]
    assert sum(p.stat().st_size for p in shards) <= 40 * MiB
    assert (PAIR / "MODEL_CARD.md").is_file()


def test_loads_as_fp32_and_shares_the_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(PAIR / "target")
    draft = AutoModelForCausalLM.from_pretrained(PAIR / "draft")
    assert target.dtype == draft.dtype == torch.float32  # stored fp16, config says float32
    assert target.config.vocab_size == draft.config.vocab_size
    tok_t = AutoTokenizer.from_pretrained(PAIR / "target")
    tok_d = AutoTokenizer.from_pretrained(PAIR / "draft")
    text = "def add(a, b):\n    return a + b\n"
    assert tok_t(text)["input_ids"] == tok_d(text)["input_ids"]
    assert tok_t.decode(tok_t(text)["input_ids"]) == text
    cfg_t = json.loads((PAIR / "target" / "config.json").read_text())
    assert cfg_t["num_hidden_layers"] > json.loads((PAIR / "draft" / "config.json").read_text())["num_hidden_layers"]


def test_greedy_speculation_is_exact_on_the_demo_pair():
    specdec = pytest.importorskip("specdec")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(PAIR / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(PAIR / "draft").eval()
    tok = AutoTokenizer.from_pretrained(PAIR / "target")
    ids = tok("import os\n\n\ndef walk(path):\n")["input_ids"]
    plain = specdec.generate(target, [ids], drafter=None, max_new_tokens=24, temperature=0)
    spec = specdec.generate(target, [ids], drafter=draft, max_new_tokens=24, temperature=0, num_draft_tokens=4)
    assert spec.sequences == plain.sequences
    assert spec.stats.alpha is not None and spec.stats.alpha > 0.3
