"""`specdec bench --target MODEL --draft DIR`: a real model (a GGUF file or a transformers folder) with the drafter
trained for it in the traffic table. Here on the CPU with tiny random checkpoints (the structure, not speed): the
options are checked before anything loads, and a draft model folder or a feature head folder becomes its arm."""

import json

import pytest
import torch

from specdec.cli import main

BASE = ["bench", "--device", "cpu", "--slots", "1", "2", "--arrival", "closed", "--policy", "auto", "--new-tokens", "2",
        "5", "--prompt-tokens", "8", "40", "--requests-per-slot", "1", "--json"]


@pytest.fixture(scope="module")
def head_dir(ckpt, tmp_path_factory):
    """A feature head (untrained: the target's last layer) for the tiny target of `ckpt`."""
    from transformers import AutoModelForCausalLM

    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    target = AutoModelForCausalLM.from_pretrained(ckpt / "target")
    trainable = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    trainable.init_from(target)
    return trainable.to_feature_head().save(tmp_path_factory.mktemp("head") / "head")


@pytest.mark.parametrize("draft, arm", [("draft", "model"), ("head", "head")])
def test_bench_target_runs_the_given_drafter_lookup_and_bigram(ckpt, head_dir, tmp_path, capsys, draft, arm):
    folder = ckpt / "draft" if draft == "draft" else head_dir
    argv = BASE + ["--target", str(ckpt / "target"), "--draft", str(folder), "--out", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = json.loads((tmp_path / "traffic.json").read_text())
    rows = result["rows"]
    assert summary["rows"] == len(rows) == 2 * 4  # slots × (plain + the drafter + lookup + ngram)
    assert {r["drafter"] for r in rows} == {"plain", arm, "lookup", "ngram"}
    assert all(r["tokens"] > 0 and r["requests"] == 3 for r in rows)  # (the CPU: a few requests per cell)
    assert result["device"] == "cpu" and any("target target" in n and f"({arm})" in n for n in result["notes"])


@pytest.mark.parametrize("extra, message", [
    (["--draft", "{draft}"], "--draft belongs to --target"),
    (["--target", "{missing}"], "neither a .gguf file nor a model folder"),
    (["--target", "{target}", "--draft", "{missing}"], "neither a feature head folder"),
    (["--target", "{target}", "--draft", "{draft}", "--drafters", "head"], "--drafters head: needs --draft DIR"),
    (["--target", "{target}", "--draft", "{draft}", "--drafters", "lookup"], "'model' is not in --drafters"),
    (["--target", "{target}", "--drafters", "model"], "--drafters model: needs --draft DIR"),
    (["--target", "{target}", "--pair", "{target}"], "--pair: --target runs a real model"),
    (["--target", "{target}", "--quick"], "--quick: --target runs a real model"),
    (["--target", "{target}", "--head", "{draft}"], "--head: --target runs a real model"),
    (["--target", "{target}", "--device", "mps"], "--device"),
])
def test_bench_target_refuses_bad_options_before_loading(ckpt, tmp_path, capsys, monkeypatch, extra, message):
    import specdec.bench.traffic_setup as setup

    monkeypatch.setattr(setup, "target_setup", lambda *a, **k: pytest.fail("loaded models before checking"))
    names = {"target": ckpt / "target", "draft": ckpt / "draft", "missing": tmp_path / "nothing"}
    argv = BASE + ["--out", str(tmp_path)] + [e.format(**names) for e in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_chat_pool_uses_the_chat_template_when_there_is_one():
    from specdec.bench.traffic_setup import chat_pool

    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and tokenize
            return [1, 2] + [len(messages[0]["content"]) % 7]

    pool = chat_pool(Tok(), count=3, max_tokens=2)
    assert pool == [[1, 2]] * 3
    assert torch.tensor(pool).shape == (3, 2)
