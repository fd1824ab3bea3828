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
    code = main(["demo", "--json", "--max-new-tokens", "12", "--prompt", "def add(a, b):\n    return"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("speedup", "alpha", "mean_accepted_length", "identical"):
        assert key in summary
    assert summary["identical"] is True
