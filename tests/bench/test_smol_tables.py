"""The SmolLM2 paper tables (`specdec.bench.smol_tables`) on a tiny random target, CPU: every drafter kind gets its
rows (n-gram tables and the draft model teacher-forced, the feature head from the engine's γ = 1 runs), Table 4
pairs them with Table 2's runs, the Markdown names every row, held-out prompts never repeat a training prompt,
and the script's --merge replaces only the text between its markers."""

import importlib.util
from pathlib import Path

import pytest
import torch

from specdec.bench.smol_tables import SmolTablesConfig, held_out_prompts, run_smol_tables, smol_markdown
from specdec.zoo.instructions import DEMO_PROMPTS


class ChatStub:
    """A tokenizer with a 'chat template': a message becomes [1] + one id per character class, ends with [3]."""

    chat_template = "stub"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = messages[0]["content"]
        return [1] + [4 + (ord(ch) % 40) for ch in text[:12]] + [3]


@pytest.fixture(scope="module")
def result(make_llama):
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead
    from specdec.zoo.small_draft import SmallDraftShape, build_small_draft

    target = make_llama(0)
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    draft = build_small_draft(target, SmallDraftShape(dim=16, layers=1, heads=2, kv_heads=2, ff=32))
    fit = [[1, 5, 6, 7, 5, 6, 2], [1, 8, 9, 8, 9, 2]]
    cfg = SmolTablesConfig(alpha_prompts=3, alpha_new_tokens=10, speed_prompts=2, speed_new_tokens=8, gammas=(1, 2))
    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)  # as the zoo's trainer starts: drafts well enough on a tiny target to accept some
    out = run_smol_tables(target, ChatStub(), [2], {"head": head.to_feature_head(), "draft": draft}, fit,
                          ["a prompt", "another one", "third"], cfg)
    out["drafter_notes"] = {"head": "h", "draft": "d"}
    return out


def test_table3_has_every_drafter_at_both_temperatures(result):
    got = {(r["drafter"], r["temperature"], r["how"]) for r in result["table3"]}
    for t in (0.0, 1.0):
        for name in ("unigram", "bigram", "draft"):
            assert (name, t, "teacher-forced") in got
        assert ("head", t, "engine, γ = 1") in got
    assert all(0.0 <= r["alpha"] <= 1.0 and r["positions"] > 0 for r in result["table3"])
    assert result["ngram_fit_tokens"] == 13


def test_table2_and_table4_pair_up(result):
    spec = [r for r in result["table2"] if r["drafter"] != "plain"]
    assert {(r["drafter"], r["temperature"], r["gamma"]) for r in spec} == {
        (d, t, g) for d in ("head", "draft") for t in (0.0, 1.0) for g in (1, 2)}
    assert all(r["speedup"] > 0 and r["tau"] >= 1.0 for r in spec)
    assert [r for r in result["table2"] if r["drafter"] == "plain"]
    # Table 4 only for drafters that ran in Table 2 (the n-gram tables have no speed rows here)
    assert {(r["drafter"], r["temperature"]) for r in result["table4"]} == {
        (d, t) for d in ("head", "draft") for t in (0.0, 1.0)}
    markdown = smol_markdown(result | {"device_name": "CPU", "torch": torch.__version__})
    for name in ("unigram", "bigram", "draft", "head", "plain"):
        assert f"| {name} |" in markdown


def test_held_out_prompts_skip_training_prompts():
    exclude = {DEMO_PROMPTS[0], DEMO_PROMPTS[2]}
    got = held_out_prompts(8, exclude)
    assert len(got) == 8 and len(set(got)) == 8 and not exclude & set(got)
    assert got[0] == DEMO_PROMPTS[1]


def test_config_is_validated():
    with pytest.raises(ValueError, match="gammas"):
        SmolTablesConfig(gammas=(0,))
    with pytest.raises(ValueError, match="speed_prompts"):
        SmolTablesConfig(speed_prompts=0)


def test_merge_replaces_only_the_marked_text(tmp_path, monkeypatch, result):
    import json

    spec = importlib.util.spec_from_file_location("smol_tables_script",
                                                  Path(__file__).resolve().parents[2] / "scripts" / "smol_tables.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = tmp_path / "PAPER_TABLES.md"
    doc.write_text(f"before\n{script.BEGIN}\nold\n{script.END}\nafter\n")
    monkeypatch.setattr(script, "DOC", doc)
    (tmp_path / "r.json").write_text(json.dumps(result))
    script.merge(tmp_path / "r.json")
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith(f"{script.END}\nafter\n") and "old" not in text
    assert "| bigram |" in text
