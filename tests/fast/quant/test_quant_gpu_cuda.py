"""FP8 / int4 kernels on CUDA (GPU-marked): the Triton kernel and `torch._scaled_mm` in bf16 against the dequantized
fp32 product, the bitwise mode's row-count invariance, and a tiny quantized `FastLlama` on the engine (CUDA graphs)
giving the dequantized model's greedy tokens in float32.

Tolerances: bf16 output of fp32 sums of exact products: |y − ref| ≤ 2⁻⁷ · (|x| @ |W|ᵀ) + 1e-3 (the output's own
rounding is 2⁻⁸ of |y| ≤ |x| @ |W|ᵀ); `_scaled_mm` also rounds the activations to e4m3 (3 mantissa bits): 2⁻³.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.fast.kernels.quant_linear import run_kernel
from specdec.fast.quant.gpu_attach import quantize_model
from specdec.fast.quant.gpu_attach import quantize_weight as quantize

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FORMATS = ("gptq", "awq", "fp8", "fp8-tensor", "fp8-block")


def bound(x, w, rel):
    return rel * (x.float().abs() @ w.abs().t()) + 1e-3


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5, 16, 40, 100])
def test_kernel_bf16_matches_reference(fmt, rows):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, k = 1536, 2048
    qw = quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02, fmt, 128)
    d = qw.dequantize()
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    ref = x.float() @ d.t()
    y = qw.linear(x, kernel="triton")
    assert y.dtype == torch.bfloat16
    assert ((y.float() - ref).abs() <= bound(x, d, 2**-7)).all()
    auto = qw.linear(x)  # ("auto": the kernel up to TRITON_ROWS rows)
    assert ((auto.float() - ref).abs() <= bound(x, d, 2**-7)).all()
    residual = torch.randn(rows, n, device="cuda", generator=gen).to(torch.bfloat16)
    out = qw.add_linear_(residual.clone(), x, kernel="triton")
    assert ((out.float() - (residual.float() + ref)).abs() <= bound(x, d, 2**-7) + residual.float().abs() / 128).all()


@pytest.mark.parametrize("fmt", ["fp8", "fp8-tensor"])
def test_scaled_mm_matches_reference(fmt):
    from specdec.fast.quant.fp8 import scaled_mm_linear

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")
    gen = torch.Generator(device="cuda").manual_seed(1)
    qw = quantize(torch.randn(1024, 2048, device="cuda", generator=gen) * 0.02, fmt, 128)
    d = qw.dequantize()
    for rows in (1, 5, 33):
        x = torch.randn(rows, 2048, device="cuda", generator=gen).to(torch.bfloat16)
        y = scaled_mm_linear(x, qw)
        assert ((y.float() - x.float() @ d.t()).abs() <= bound(x, d, 2**-3)).all()


def test_wrong_scale_fails_on_cuda():
    gen = torch.Generator(device="cuda").manual_seed(2)
    qw = quantize(torch.randn(512, 1024, device="cuda", generator=gen) * 0.02, "gptq", 128)
    d = qw.dequantize()
    x = torch.randn(4, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    scales = qw.scales.clone()
    scales[:, 3] *= 2
    y = run_kernel(x, "int4", qw.qweight, qw.zeros, scales, 128, 512)
    assert not ((y.float() - x.float() @ d.t()).abs() <= bound(x, d, 2**-7)).all()


@pytest.mark.parametrize("fmt", ["gptq", "fp8", "fp8-block"])
def test_bitwise_rows_invariant(fmt):
    gen = torch.Generator(device="cuda").manual_seed(3)
    qw = quantize(torch.randn(2048, 4096, device="cuda", generator=gen) * 0.02, fmt, 128)
    x = torch.randn(80, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    full = qw.linear(x, kernel="bitwise")
    for rows in (1, 5, 17):
        assert torch.equal(qw.linear(x[:rows], kernel="bitwise"), full[:rows])


@pytest.mark.parametrize("fmt", ["gptq", "fp8", "fp8-block"])
def test_engine_tokens_equal_dequantized_model_fp32(fmt):
    from specdec.engine import Engine, EngineConfig
    from specdec.fast.model import FastLlama, LlamaShape
    from specdec.request import SamplingParams

    shape = LlamaShape(vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                       intermediate_size=512, rope_theta=10000.0, tie_word_embeddings=False, max_positions=512)
    dense = FastLlama.random(shape, device="cuda", dtype=torch.float32, std=0.05, seed=4)
    quant = quantize_model(copy.deepcopy(dense), fmt)
    with torch.no_grad():
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            for i, p in enumerate(getattr(quant, name)):
                getattr(dense, name)[i].copy_(p.specdec_quant.dequantize())
    outs = []
    for model in (quant, dense):
        engine = Engine(model, None, EngineConfig(max_batch_size=2, max_seq_len=96, num_draft_tokens=0))
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=24)) for p in ([5, 6, 7], [9] * 11)]
        tokens = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        outs.append([tokens[i] for i in ids])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("fmt", ["gptq", "fp8-block"])
def test_bitwise_model_verify_pass_equals_single_steps(fmt):
    """bitwise=True on a quantized bf16 model: the logits of 5 tokens in one pass are the bits of 5 one-token passes."""
    from specdec.fast.model import FastLlama, LlamaShape

    shape = LlamaShape(vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                       intermediate_size=512, rope_theta=10000.0, tie_word_embeddings=False, max_positions=512)
    model = quantize_model(FastLlama.random(shape, device="cuda", dtype=torch.bfloat16, std=0.05, seed=6), fmt)
    model.bitwise = True
    prompt = torch.arange(3, 103, device="cuda")[None]
    tokens = torch.tensor([[7, 8, 9, 10, 11]], device="cuda")
    cache = model.new_cache(1, 256)
    model(prompt, cache)
    together = model(tokens, cache, advance=False)
    alone = []
    for j in range(5):
        alone.append(model(tokens[:, j:j + 1], cache))
    assert torch.equal(together, torch.cat(alone, dim=1))


@pytest.mark.parametrize("fmt", ["gptq", "fp8", "fp8-block"])
def test_every_sweep_config_compiles_and_matches(fmt):
    """The configs the device sweep tries (scripts/bench_quant_gpu.py): each compiles and gives the reference."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_quant_gpu", Path(__file__).parents[3] / "scripts" /
                                                  "bench_quant_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    gen = torch.Generator(device="cuda").manual_seed(5)
    qw = quantize(torch.randn(1024, 1024, device="cuda", generator=gen) * 0.02, fmt, 128)
    d = qw.dequantize()
    kind, q, zeros, scales, group = qw.kernel_args()
    configs = [bench.config_of(e, split) for few in (False, True)
               for e in bench.candidates("gptq" if fmt == "gptq" else "fp8", few) for split in (1, 4)
               if not (fmt == "fp8-block" and e[1] > 128)]
    for config in configs:
        for rows in (1, 4, 5):
            x = torch.randn(rows, 1024, device="cuda", generator=gen).to(torch.bfloat16)
            y = run_kernel(x, kind, q, zeros, scales, group, 1024, config=config)
            assert ((y.float() - x.float() @ d.t()).abs() <= bound(x, d, 2**-7)).all(), config
