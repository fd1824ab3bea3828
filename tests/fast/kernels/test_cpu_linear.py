"""The CPU weight-major product for few rows (`specdec.fast.kernels.cpu_linear`): which shapes take it, that it is
F.linear's product to fp32 rounding (bias, residual in place, leading dimensions), and that FastLlama's verify-sized
CPU forwards with it match the forwards without it and transformers' logits."""

import pytest
import torch
import torch.nn.functional as F

from specdec.fast import FastLlama
from specdec.fast.kernels import cpu_linear
from specdec.fast.kernels.cpu_linear import add_linear_weight_major_, linear_weight_major, weight_major


@pytest.mark.parametrize("rows, dtype, expected", [(1, torch.float32, False), (2, torch.float32, True),
                                                   (6, torch.float32, True), (7, torch.float32, False),
                                                   (4, torch.bfloat16, False), (4, torch.float64, False)])
def test_which_shapes_take_it(rows, dtype, expected):
    assert weight_major(torch.zeros(rows, 8, dtype=dtype), torch.zeros(16, 8, dtype=dtype)) is expected


def test_off_switch(monkeypatch):
    monkeypatch.setattr(cpu_linear, "FEW_ROWS", 0)
    assert not weight_major(torch.zeros(3, 8), torch.zeros(16, 8))


def test_same_product_as_f_linear():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 5, 96, generator=g), torch.randn(200, 96, generator=g), torch.randn(200, generator=g)
    got, ref = linear_weight_major(x, w, b), F.linear(x, w, b)
    assert got.shape == ref.shape == (1, 5, 200)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    residual = torch.randn(5, 200, generator=g)
    expected = residual + F.linear(x[0], w)
    out = add_linear_weight_major_(residual, x[0], w)
    assert out is residual
    torch.testing.assert_close(residual, expected, atol=1e-5, rtol=1e-5)


def test_fast_model_verify_forward_matches_with_and_without(make_llama, monkeypatch):
    hf = make_llama(3, layers=3)
    fast = FastLlama.from_hf(hf)
    prompt, block = [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]  # a 5-row "verify" block after a prompt
    outs = []
    for few in (6, 0):
        monkeypatch.setattr(cpu_linear, "FEW_ROWS", few)
        cache = fast.new_cache(1, 32)
        with torch.inference_mode():
            fast(torch.tensor([prompt]), cache)
            outs.append(fast(torch.tensor([block]), cache)[0])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0)
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt + block])).logits[0, len(prompt):]
    torch.testing.assert_close(outs[0], ref, atol=1e-4, rtol=0)
