"""The decode-shape quantized GEMV (`fast.kernels.quant_gemv`) on CUDA (GPU-marked): every format and word layout in
bf16 against the dequantized fp32 product for M = 1, 3, 5, 8 on odd shapes, each table config, a CUDA graph replay,
the negative controls (a wrong scale, the nibbles reversed), and the model path under SPECDEC_QUANT_KERNEL=gemv: a
tiny quantized `FastLlama` on the engine (CUDA graphs; plain and speculative) giving the dequantized model's greedy
tokens in float32, with the GEMV launched.

Tolerance: bf16 output of fp32 sums of exact products: |y − ref| ≤ 2⁻⁷ · (|x| @ |W|ᵀ) + 1e-3 (the output's own
rounding is 2⁻⁸ of |y| ≤ |x| @ |W|ᵀ), as `test_quant_gpu_cuda.py`.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.fast.kernels import quant_gemv
from specdec.fast.kernels.quant_gemv import GEMV_CONFIGS, GemvConfig, gemv
from specdec.fast.quant.fp8 import Fp8Weight
from specdec.fast.quant.gpu_attach import quantize_model
from specdec.fast.quant.gpu_attach import quantize_weight as quantize
from specdec.fast.quant.int4 import Int4Weight, pack_rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FORMATS = ("gptq", "awq", "fp8", "fp8-tensor", "fp8-block")
SHAPES = {"int4": (1544, 2048), "fp8": (1000, 2000)}  # (N, K): no tile's multiple; FP8's K not one of 16
VARIANTS = {"fma": GemvConfig(block_n=32, variant="fma"), "dot": GemvConfig(block_n=64, variant="dot", prefetch=False,
                                                                              num_stages=3)}


def weight(fmt, seed=0):
    n, k = SHAPES["fp8" if fmt.startswith("fp8") else "int4"]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02, fmt, 128)


def xs(m, k, seed=1):
    return torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)).bfloat16()


def close(y, x, d, rel=2**-7) -> bool:
    ref = x.float() @ d.t()
    return bool(((y.float() - ref).abs() <= rel * (x.float().abs() @ d.abs().t()) + 1e-3).all())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 5, 8])
def test_gemv_bf16_matches_reference(fmt, m):
    qw = weight(fmt)
    d = qw.dequantize()
    x = xs(m, qw.shape[1], seed=m)
    for layout in (("nk", "kn") if fmt in ("gptq", "awq") else ("nk",)):
        for name, config in VARIANTS.items():
            y = gemv(x, qw, config=config, layout=layout)
            assert y.dtype == torch.bfloat16 and close(y, x, d), (name, layout)
        assert close(gemv(x, qw, layout=layout), x, d), layout
    residual = xs(m, qw.shape[0], seed=9)
    out = gemv(x, qw, None, residual.clone(), config=GemvConfig(split_k=4, reduce="fused"))
    assert close(out.float() - residual.float(), x, d, rel=2**-6)


@pytest.mark.parametrize("fmt", ["gptq", "fp8", "fp8-block"])
def test_every_table_config_on_the_8b_square(fmt):
    gen = torch.Generator(device="cuda").manual_seed(2)
    qw = quantize(torch.randn(4096, 4096, device="cuda", generator=gen) * 0.02, fmt, 128)
    d = qw.dequantize()
    for config in set(GEMV_CONFIGS.values()):
        for m in (1, 4, 8):
            x = xs(m, 4096, seed=m)
            assert close(gemv(x, qw, config=config), x, d), (config, m)


def test_graph_replay_equals_eager():
    qw = weight("gptq", seed=3)
    x = xs(5, qw.shape[1], seed=4)
    eager = gemv(x, qw, layout="kn")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemv(x, qw, layout="kn")  # (warm: compiled, the kn copy made)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, qw, layout="kn")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_wrong_scale_and_reversed_nibbles_fail_on_cuda():
    qw = weight("gptq", seed=5)
    d = qw.dequantize()
    x = xs(3, qw.shape[1], seed=6)
    assert close(gemv(x, qw), x, d)
    scales = qw.scales.clone()
    scales[2, 7] *= 2
    assert not close(gemv(x, Int4Weight(qw.qweight, qw.zeros, scales, qw.group, qw.shape, qw.source)), x, d)
    n, k = qw.shape
    nibbles = (qw.qweight[:, :, None] >> torch.arange(0, 32, 4, dtype=torch.int32, device="cuda")) & 0xF
    flipped = pack_rows(nibbles.flip(-1).reshape(n, k).t().to(torch.uint8)).t().contiguous()
    swapped = Int4Weight(flipped, qw.zeros, qw.scales, qw.group, qw.shape, qw.source)
    for layout in ("nk", "kn"):
        assert not close(gemv(x, swapped, layout=layout), x, d), layout
    fw = weight("fp8-block", seed=7)
    bad = fw.scale.clone()
    bad[0, 1] *= 2
    x8 = xs(3, fw.shape[1], seed=8)
    assert close(gemv(x8, fw), x8, fw.dequantize())
    assert not close(gemv(x8, Fp8Weight(fw.weight, bad, "block")), x8, fw.dequantize())


@pytest.mark.parametrize("fmt,layout", [("gptq", "nk"), ("gptq", "kn"), ("fp8-block", "nk")])
def test_engine_tokens_through_the_gemv_equal_dequantized_model_fp32(fmt, layout, monkeypatch):
    from specdec.engine import Engine, EngineConfig
    from specdec.fast.kernels.select import kernel_module
    from specdec.fast.model import FastLlama, LlamaShape
    from specdec.request import SamplingParams

    monkeypatch.setenv(quant_gemv.ENV_KERNEL, "gemv")
    monkeypatch.setenv(quant_gemv.ENV_LAYOUT, layout)
    module = kernel_module("quant_gemv_triton")
    launched = []
    real = module.launch
    monkeypatch.setattr(module, "launch", lambda *a: launched.append(a[0].shape[0]) or real(*a))
    shape = LlamaShape(vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                       intermediate_size=512, rope_theta=10000.0, tie_word_embeddings=False, max_positions=512)
    dense = FastLlama.random(shape, device="cuda", dtype=torch.float32, std=0.05, seed=4)
    quant = quantize_model(copy.deepcopy(dense), fmt)
    with torch.no_grad():
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            for i, p in enumerate(getattr(quant, name)):
                getattr(dense, name)[i].copy_(p.specdec_quant.dequantize())
    outs = []
    for model, drafter, gamma in ((quant, None, 0), (dense, None, 0), (quant, dense, 4)):
        engine = Engine(model, drafter, EngineConfig(max_batch_size=2, max_seq_len=96, num_draft_tokens=gamma))
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=24)) for p in ([5, 6, 7], [9] * 11)]
        tokens = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        outs.append([tokens[i] for i in ids])
    assert outs[0] == outs[1] == outs[2]
    assert launched and max(launched) <= quant_gemv.GEMV_ROWS  # (the plain steps' rows, and verify passes ≤ 8 rows)
