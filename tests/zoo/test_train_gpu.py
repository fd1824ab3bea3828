"""CUDA-only checks of the training fast path (the lead runs them on an H200): compiled training with causal
SDPA and on-device skipping trains a small Llama, and its logits equal eager HF SDPA's in bf16 tolerance."""

from dataclasses import replace

import pytest
import torch

from specdec.zoo.data import TokenData
from specdec.zoo.presets import PRESETS, ModelShape
from specdec.zoo.speed import causal_attention
from specdec.zoo.models import build_model
from specdec.zoo.train import run_training

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_compiled_fast_training_on_cuda(code_data):
    data = TokenData.load(code_data)
    shape = ModelShape("llama", dim=128, layers=2, heads=2, ff=256, max_len=256)
    cfg = replace(PRESETS["tiny"].target_train, steps=60, eval_every=30, batch_size=16, seq_len=128)
    model = build_model(shape, data.meta["vocab_size"])
    result = run_training(model, data, cfg, device="cuda", progress=False)
    print(result.to_dict())
    assert result.fast and result.compiled and result.causal_attention and result.skipped_steps == 0
    assert result.val_curve[-1][1] < result.val_curve[0][1] - 1.0
    assert result.first_step_seconds is not None and result.steady_tokens_per_s > 0
    assert model.config._attn_implementation == "sdpa"


def test_causal_attention_equals_hf_sdpa_on_cuda():
    model = build_model(ModelShape("llama", dim=128, layers=2, heads=2, ff=256, kv_heads=1, max_len=256), 512).cuda()
    ids = torch.randint(3, 512, (4, 200), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ref = model(input_ids=ids).logits.float()
        with causal_attention(model):
            out = model(input_ids=ids).logits.float()
    assert (out - ref).abs().max() < 5e-2 * ref.abs().max()
