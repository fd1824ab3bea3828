"""The zoo's feature-head trainer: the loss falls, α beats an untrained head's (teacher-forced and in the
engine), the folder loads and drafts, a head for another target is refused, and the CLI step runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import specdec
from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.zoo.data import TokenData
from specdec.zoo.feature_head import HeadTrainConfig, TrainableHead, head_alpha, train_head
from specdec.zoo.presets import PRESETS
from specdec.zoo.models import build_model, save_model
from specdec.zoo.train import train_model

TINY = PRESETS["tiny"]
HEAD_TRAIN = replace(TINY.target_train, steps=60, lr=3e-3, warmup_steps=5, weight_decay=0.0, z_loss=0.0)


@pytest.fixture(scope="module")
def trained(code_data, tmp_path_factory):
    """A tiny target trained for a few seconds (also saved, for the CLI), and a head trained on it."""
    torch.set_num_threads(1)
    data = TokenData.load(code_data)
    target, _ = train_model(TINY.target, data, replace(TINY.target_train, steps=30), vocab_size=data.meta["vocab_size"],
                            device="cpu", progress=False)
    folder = save_model(target, tmp_path_factory.mktemp("tiny") / "target", data.tokenizer_dir)
    head, result = train_head(target, data, HeadTrainConfig(HEAD_TRAIN, alpha_batches=2), device="cpu")
    return data, target, head, result, folder


def test_training_lowers_the_loss_and_raises_alpha(trained):
    data, target, head, result, _ = trained
    assert result.steps == HEAD_TRAIN.steps
    assert sum(result.losses[-5:]) / 5 < 0.5 * sum(result.losses[:5]) / 5
    assert result.alpha_after[0.0] > result.alpha_before[0.0] + 0.2
    assert result.alpha_after[1.0] > result.alpha_before[1.0]
    assert not any(p.requires_grad for p in target.parameters())  # the target stayed frozen
    untrained = TrainableHead(head.config, seed=5)  # random layer and fc
    held_out = data.val_batches(8, 64, 2)
    assert head_alpha(target, head, held_out, device="cpu")[0.0] > head_alpha(target, untrained, held_out,
                                                                             device="cpu")[0.0] + 0.3


def test_training_from_the_feature_cache_reaches_the_same_alpha(trained):
    """The same recipe from cached features (the target ran once over 64 windows) trains as well."""
    data, target, _, result, _ = trained
    cfg = HeadTrainConfig(HEAD_TRAIN, alpha_batches=2, feature_cache_tokens=64 * (HEAD_TRAIN.seq_len + 1))
    _, cached = train_head(target, data, cfg, device="cpu")
    assert cached.steps == HEAD_TRAIN.steps and cached.cache_seconds > 0
    assert cached.alpha_after[0.0] > cached.alpha_before[0.0] + 0.2
    assert cached.alpha_after[0.0] > result.alpha_after[0.0] - 0.1


def test_trained_head_drafts_better_than_an_untrained_one_in_the_engine(trained):
    data, target, head, _, _ = trained
    prompts = [row[: 16 + 5 * i].tolist() for i, row in enumerate(data.val_batches(6, 64, 1)[0])]

    def engine_alpha(feature_head):
        res = specdec.generate(target, prompts, drafter=feature_head, max_new_tokens=24, temperature=0.0,
                               num_draft_tokens=4, eos_token_id=[], engine="fast", seed=0)
        return res.stats.alpha

    random_head = TrainableHead(head.config, seed=5).to_feature_head()
    assert engine_alpha(head.to_feature_head()) > engine_alpha(random_head) + 0.1


def test_conversion_saves_and_loads_the_same_function(trained, tmp_path):
    data, target, head, _, _ = trained
    fast = FastLlama.from_hf(target)
    batch = data.val_batches(2, 24, 1)[0]
    with torch.no_grad():
        features = target.model(input_ids=batch).last_hidden_state
        expected = head(features[:, :-1], batch[:, 1:], target.get_input_embeddings().weight)
        head.to_feature_head().save(tmp_path / "head")
        loaded = FeatureHead.load(tmp_path / "head", target=fast)
        got = loaded(features[:, :-1], batch[:, 1:], loaded.layer.new_cache(2, 32))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == ["feature_head.json", "model.safetensors"]
    other = FastLlama.from_hf(build_model(replace(TINY.target, dim=96, heads=3), data.meta["vocab_size"]))
    with pytest.raises(ValueError, match="target: the feature head was trained for a target of dim 64"):
        FeatureHead.load(tmp_path / "head", target=other)
    with pytest.raises(ValueError, match="no feature_head.json"):
        FeatureHead.load(tmp_path)
    config = HeadConfig.for_target(LlamaShape.from_hf(target.config))
    assert json.loads((tmp_path / "head" / "feature_head.json").read_text())["dim"] == config.dim


def test_cli_trains_a_head_folder(trained, code_data, tmp_path, capsys):
    from specdec.cli import main

    _, target, _, _, folder = trained
    code = main(["train", "head", "--target", str(folder), "--data", str(code_data), "--out",
                 str(tmp_path / "head"), "--steps", "4", "--batch-size", "4", "--seq-len", "32", "--device", "cpu",
                 "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and set(summary["alpha_after"]) == {"0.0", "1.0"}
    assert (tmp_path / "head" / "head.csv").is_file()
    FeatureHead.load(tmp_path / "head", target=FastLlama.from_hf(target))
    texts = []
    for draft in ([], ["--draft", str(tmp_path / "head")]):  # `specdec generate --draft HEAD`: the greedy text
        code = main(["generate", "--target", str(folder), *draft, "--prompt", "def func_1(x, y):", "--temperature",
                     "0", "--max-new-tokens", "12", "--quiet"])
        assert code == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].strip()
    code = main(["train", "head", "--target", str(folder), "--data", str(code_data), "--out", str(tmp_path / "x"),
                 "--generated-fraction", "0.5", "--quiet"])
    assert code == 2 and "--generated-fraction needs --generate" in capsys.readouterr().err


def test_unrolled_training_steps_are_the_engines_draft_chain(make_llama):
    """Step s of `TrainableHead.unrolled` (one block-masked pass) = the head drafting s steps from origin t in a
    KV cache holding the true entries 0..t (teacher tokens, its own predicted features)."""
    target = make_llama(0)
    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1).eval()
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = target.model(input_ids=tokens).last_hidden_state
        steps = head.unrolled(features, tokens, target.get_input_embeddings().weight, 3)
        assert [s.shape[1] for s in steps] == [11, 10, 9]
        bound = head.to_feature_head().bind(FastLlama.from_hf(target))
        for t in (0, 4, 8):
            cache = bound.layer.new_cache(2, 32)
            predicted = bound(features[:, : t + 1], tokens[:, 1 : t + 2], cache)[:, -1:]
            for s in range(3):
                if s:
                    predicted = bound(predicted, tokens[:, t + s + 1 : t + s + 2], cache)
                torch.testing.assert_close(predicted[:, 0], steps[s][:, t], atol=1e-5, rtol=1e-5)
