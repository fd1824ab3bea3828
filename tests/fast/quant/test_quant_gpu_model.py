"""A tiny `FastLlama` with FP8 / int4 weights kept quantized, on the CPU engine (the reference path: each weight
dequantized, then F.linear): its greedy tokens are the dequantized dense model's, and the quantized model holds the
packed bytes, not the dense ones. Negative control: a model quantized with a wrong zero point drifts off them."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.fast.quant.gpu_attach import LINEAR_NAMES, describe, quant_bytes, quantize_model
from specdec.fast.quant.int4 import Int4Weight
from specdec.request import SamplingParams

SHAPE = LlamaShape(vocab_size=256, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, intermediate_size=256,
                   rope_theta=10000.0, tie_word_embeddings=False, max_positions=512)
PROMPTS = ([5, 6, 7, 8], [9, 10])


def greedy(model) -> list:
    engine = Engine(model, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0))
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=16)) for p in PROMPTS]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[i] for i in ids]


def dequantized(quant) -> FastLlama:
    dense = FastLlama(SHAPE, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for name, p in dense.named_parameters():
            src = dict(quant.named_parameters())[name]
            p.copy_(src.specdec_quant.dequantize() if src.is_meta else src)
    return dense.eval()


@pytest.mark.parametrize("fmt", ["gptq", "awq", "fp8", "fp8-block"])
def test_quantized_tokens_equal_dequantized(fmt):
    base = FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.05, seed=1)
    quant = quantize_model(copy.deepcopy(base), fmt, lm_head=True)
    assert all(p.is_meta for name in LINEAR_NAMES for p in getattr(quant, name)) and quant.lm_head.is_meta
    assert str(len(LINEAR_NAMES) * SHAPE.n_layers + 1) in describe(quant) or "," in describe(quant)
    dense_bytes = sum(p.numel() * 4 for p in base.parameters()) - base.embed.numel() * 4
    assert quant_bytes(quant) < (0.3 if fmt in ("gptq", "awq") else 0.5) * dense_bytes
    assert greedy(quant) == greedy(dequantized(quant))


def test_wrong_zero_point_drifts():
    base = FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.05, seed=1)
    quant = quantize_model(copy.deepcopy(base), "gptq", lm_head=True)
    want = greedy(dequantized(quant))
    for name in LINEAR_NAMES:
        for i, p in enumerate(getattr(quant, name)):
            qw = p.specdec_quant
            bad = Int4Weight(qw.qweight, (qw.zeros.to(torch.int16) - 1).clamp(0, 15).to(torch.uint8).contiguous(),
                             qw.scales, qw.group, qw.shape, qw.source)  # GPTQ v1's stored z − 1 taken as the zero
            p.specdec_quant = bad
    assert greedy(quant) != want


def test_speculative_greedy_equals_plain_on_quantized_target():
    """A quantized target with a dense drafter: speculative greedy tokens are the target's plain ones."""
    quant = quantize_model(FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.05, seed=2), "gptq")
    drafter = FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.05, seed=3)
    plain = greedy(quant)
    engine = Engine(quant, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3))
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=16)) for p in PROMPTS]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert [tokens[i] for i in ids] == plain
