from __future__ import annotations

import json

import pytest

from specdec.cli import main


def test_train_prepare_empty_corpus_is_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["train", "prepare", "--corpus", "code", "--out", str(tmp_path / "out"), "--roots",
                 str(tmp_path / "empty"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("specdec train: error: code corpus is empty")
    code = main(["train", "prepare", "--corpus", "ende", "--out", str(tmp_path / "out"), "--mo-files",
                 str(tmp_path / "missing.mo")])
    assert code == 2 and "no such catalog" in capsys.readouterr().err


def test_train_pair_cli_on_tiny(code_data, tmp_path, capsys):
    code = main(["train", "pair", "--preset", "tiny", "--data", str(code_data), "--out", str(tmp_path / "run"),
                 "--device", "cpu", "--no-progress"])
    assert code == 0
    brief = json.loads(capsys.readouterr().out)
    assert brief["preset"] == "tiny" and brief["target"]["skipped_steps"] == 0
    assert set(brief["drafts"][0]["alpha_after"]) == {"0.0", "1.0"}
    assert (tmp_path / "run" / "summary.json").is_file()
    code = main(["train", "pair", "--preset", "nope", "--data", str(code_data), "--out", str(tmp_path / "x")])
    assert code == 2 and "unknown preset 'nope'" in capsys.readouterr().err


def test_demo_json_on_the_shipped_pair(capsys):
    pytest.importorskip("specdec.decoding")
    from specdec.cli.demo import DEMO_PAIR

    if not (DEMO_PAIR / "target" / "config.json").is_file():
        pytest.skip("demo pair not shipped")
    code = main(["demo", "--pair", str(DEMO_PAIR), "--json", "--max-new-tokens", "12", "--prompt",
                 "def add(a, b):\n    return"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("speedup", "alpha", "mean_accepted_length", "identical"):
        assert key in summary
    assert summary["identical"] is True


def test_train_prepare_code_with_a_pairs_tokenizer(code_tree, tmp_path, capsys):
    """`--tokenizer DIR` encodes the corpus with an existing pair's tokenizer (to train more drafters for it)."""
    from specdec.loading import load_tokenizer
    from specdec.zoo.data import TokenData

    shipped = "specdec/assets/demo_pair/target"
    code = main(["train", "prepare", "--corpus", "code", "--out", str(tmp_path / "out"), "--roots", str(code_tree),
                 "--val-fraction", "0.2", "--tokenizer", shipped, "--no-progress"])
    assert code == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["vocab_size"] == 8192 and meta["tokenizer_from"] == shipped
    data = TokenData.load(tmp_path / "out")
    theirs = load_tokenizer(shipped)
    text = theirs.decode(data.train[:200].tolist())
    assert theirs(text, add_special_tokens=False).input_ids[:50] == data.train[:50].tolist()
    code = main(["train", "prepare", "--corpus", "code", "--out", str(tmp_path / "x"), "--roots", str(code_tree),
                 "--tokenizer", str(tmp_path)])
    assert code == 2 and "--tokenizer" in capsys.readouterr().err
    code = main(["train", "prepare", "--corpus", "ende", "--out", str(tmp_path / "x"), "--tokenizer", shipped])
    assert code == 2 and "--tokenizer" in capsys.readouterr().err


def test_train_image_cli_prints_its_summary(tmp_path, capsys):
    pytest.importorskip("sklearn")
    code = main(["train", "image", "--preset", "digits-tiny", "--out", str(tmp_path / "img"), "--device", "cpu",
                 "--no-progress"])
    assert code == 0
    brief = json.loads(capsys.readouterr().out)
    assert brief["preset"] == "digits-tiny" and brief["device"] == "cpu" and brief["target"]["skipped_steps"] == 0
    assert (tmp_path / "img" / "summary.json").is_file()
