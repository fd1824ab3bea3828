"""The code pair's Table 3 (specdec.bench.alpha_table.code_pair_table3), cut down to seconds: extra drafters
(`paper_tables.py code --extra-draft`) are measured exactly like the shipped one."""

from __future__ import annotations

import json

import pytest

from specdec.bench.alpha_table import code_pair_table3

SHIPPED_DRAFT = "specdec/assets/demo_pair/draft"


def test_an_extra_drafter_is_measured_like_the_shipped_one():
    result = code_pair_table3(num_prompts=1, new_tokens=8, ngram_tokens=20_000, extra_drafters={"again": SHIPPED_DRAFT})
    alpha = {(r["drafter"], r["temperature"], r["text"]): r["alpha"] for r in result["rows"]}
    ours = {k[1:]: v for k, v in alpha.items() if k[0] == "again"}
    shipped = {k[1:]: v for k, v in alpha.items() if k[0] == "small model (1 layer, distilled)"}
    assert ours and ours == shipped  # the same weights through the same measurement: the same α
    assert result["extra_drafters"] == {"again": SHIPPED_DRAFT}
    json.dumps(result)  # JSON-ready


def test_an_extra_drafter_with_another_vocabulary_is_refused(tmp_path):
    from specdec.zoo.presets import ModelShape
    from specdec.zoo.models import build_model

    build_model(ModelShape("llama", dim=32, layers=1, heads=1, ff=64, max_len=64), 300).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="extra drafter 'small'.*300 tokens"):
        code_pair_table3(num_prompts=1, new_tokens=8, ngram_tokens=20_000, extra_drafters={"small": tmp_path})
