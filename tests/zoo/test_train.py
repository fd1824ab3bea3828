from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from specdec.zoo.data import TokenData
from specdec.zoo.presets import PRESETS, get_preset
from specdec.zoo.models import build_model, save_model
from specdec.zoo.train import run_training, train_model
from specdec.zoo.train_steps import lr_at

TINY = PRESETS["tiny"]


def test_tiny_preset_trains_with_decreasing_loss_and_logs(code_data, tmp_path):
    data = TokenData.load(code_data)
    cfg = replace(TINY.target_train, steps=30, eval_every=15)
    model, result = train_model(TINY.target, data, cfg, vocab_size=data.meta["vocab_size"],
                                log_path=tmp_path / "log.csv", device="cpu", progress=False)
    assert result.steps == 30 and result.skipped_steps == 0
    first_val, last_val = result.val_curve[0][1], result.val_curve[-1][1]
    assert first_val == pytest.approx(math.log(data.meta["vocab_size"]), rel=0.1)  # ~uniform at init
    assert last_val < first_val - 1.0
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert rows[0].split(",")[:6] == ["step", "tokens", "loss", "ce", "lr", "grad_norm"]
    assert len(rows) == 1 + 1 + 30  # header, step-0 evaluation, 30 steps
    assert json.loads((tmp_path / "log.json").read_text())["steps"] == 30


def test_save_and_load_like_a_user_checkpoint(code_data, tmp_path):
    data = TokenData.load(code_data)
    model = build_model(TINY.target, data.meta["vocab_size"])
    save_model(model, tmp_path / "fp32", data.tokenizer_dir)
    save_model(model, tmp_path / "fp16", data.tokenizer_dir, dtype="float16", max_shard_size="100KB")
    ids = torch.tensor(data.val[:20].astype("int64"))[None]
    with torch.no_grad():
        ref = model.eval()(ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32")
        assert loaded.config._attn_implementation == "sdpa"
        assert torch.allclose(loaded(ids).logits, ref, atol=1e-5)
        half = AutoModelForCausalLM.from_pretrained(tmp_path / "fp16")  # stored fp16, computes fp32
        assert half.dtype == torch.float32
        assert torch.allclose(half(ids).logits, ref, atol=2e-2)
    assert len(list((tmp_path / "fp16").glob("*.safetensors"))) > 1  # sharded
    assert (tmp_path / "fp16" / "tokenizer.json").is_file()


def test_non_finite_step_is_skipped_not_applied(code_data):
    data = TokenData.load(code_data)
    model = build_model(TINY.drafts[0].shape, data.meta["vocab_size"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = {"n": 0}

    def nan_loss(m, batch):
        calls["n"] += 1
        out = m(input_ids=batch[:, :-1]).logits.float().mean() * float("nan")
        return out, out.detach()

    cfg = replace(TINY.target_train, steps=3, eval_every=100)
    result = run_training(model, data, cfg, loss_fn=nan_loss, device="cpu", progress=False)
    assert result.skipped_steps == 3 and calls["n"] == 3
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_lr_schedule_warmup_then_cosine():
    cfg = replace(TINY.target_train, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


def test_tiny_t5_trains_and_loads(locale_root, tmp_path):
    from specdec.zoo.data import PairData, prepare_ende_data

    prepare_ende_data(tmp_path / "ende", locale_roots=[locale_root], vocab_size=300, val_fraction=0.3)
    data = PairData.load(tmp_path / "ende")
    preset = get_preset("tiny-ende")
    cfg = replace(preset.target_train, steps=20, eval_every=10)
    model, result = train_model(preset.target, data, cfg, vocab_size=data.meta["vocab_size"], device="cpu",
                                progress=False)
    assert result.val_curve[-1][1] < result.val_curve[0][1]
    save_model(model, tmp_path / "t5", data.tokenizer_dir)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "t5")
    assert loaded.config.decoder_start_token_id == 0 and loaded.config.is_encoder_decoder


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_preset("huge")


def test_gpu_preset_sizes_match_the_issue():
    preset = get_preset("gpu")
    target = build_model(replace(preset.target, layers=1), 8192)  # one layer: count without the memory
    per_layer = sum(p.numel() for p in target.model.layers[0].parameters())
    emb = target.model.embed_tokens.weight.numel()
    total = emb + per_layer * preset.target.layers
    draft = sum(p.numel() for p in build_model(preset.drafts[0].shape, 8192).parameters())
    assert total >= 300e6 and preset.target.layers >= 24
    assert 70 <= total / draft <= 130 and preset.drafts[0].shape.layers <= 2


def _budget(preset) -> float:
    seconds = preset.target_train.max_seconds + (preset.pool.max_seconds if preset.pool else 0.0)
    for r in preset.drafts:
        seconds += (r.pretrain.max_seconds if r.pretrain else 0.0) + (r.distill.train.max_seconds if r.distill else 0.0)
    return seconds


def test_device_recipes_fit_one_ten_minute_command():
    """At budget scale 1: the gpu pair trains in ~7 minutes (leaving room for loading, saving and α), the EnDe
    tables train in ~6.5 (the tables take ~2 more); the gpu drafter distils on the target's own text."""
    from specdec.bench.ende_tables import ENDE_TABLES_PRESET

    gpu = get_preset("gpu")
    assert _budget(gpu) <= 400 and gpu.target_train.max_seconds >= 300
    assert gpu.pool is not None and gpu.drafts[0].distill.generated_fraction > 0
    assert _budget(ENDE_TABLES_PRESET) <= 390
    assert ENDE_TABLES_PRESET.target == get_preset("gpu-ende").target
