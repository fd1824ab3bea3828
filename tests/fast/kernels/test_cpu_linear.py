"""The CPU products of `specdec.fast.kernels.cpu_linear`: which inputs take which product (oneDNN on a packed weight
or on the weight itself, the weight-major product, `F.linear`), that each is F.linear's product to fp32 rounding (bias, residual in place,
leading dimensions), that a packed weight follows in-place changes of its weight, and that FastLlama's CPU forwards
with each product match each other and transformers' logits."""

import gc

import pytest
import torch
import torch.nn.functional as F

from specdec.fast import FastLlama
from specdec.fast.kernels import cpu_linear

needs_onednn = pytest.mark.skipif(not cpu_linear.packed_available(), reason="this torch has no oneDNN (MKLDNN)")


@pytest.mark.parametrize("mode, rows, dtype, expected", [
    ("weight_major", 1, torch.float32, "linear"), ("weight_major", 2, torch.float32, "weight_major"),
    ("weight_major", 6, torch.float32, "weight_major"), ("weight_major", 7, torch.float32, "linear"),
    ("weight_major", 4, torch.bfloat16, "linear"), ("weight_major", 4, torch.float64, "linear"),
    ("linear", 4, torch.float32, "linear"), ("auto", 4, torch.bfloat16, "linear")])
def test_which_inputs_take_which_product(monkeypatch, mode, rows, dtype, expected):
    monkeypatch.setattr(cpu_linear, "MODE", mode)
    assert cpu_linear.product(torch.zeros(rows, 8, dtype=dtype), torch.zeros(16, 8, dtype=dtype)) == expected


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_auto_packs_every_row_count(monkeypatch, rows):
    monkeypatch.setattr(cpu_linear, "MODE", "auto")
    assert cpu_linear.product(torch.zeros(rows, 8), torch.zeros(16, 8)) == "packed"
    assert cpu_linear.product(torch.zeros(rows, 8, requires_grad=True), torch.zeros(16, 8)) == "linear"


def test_weight_major_off_switch_and_bad_mode(monkeypatch):
    monkeypatch.setattr(cpu_linear, "MODE", "weight_major")
    monkeypatch.setattr(cpu_linear, "FEW_ROWS", 0)
    assert cpu_linear.product(torch.zeros(3, 8), torch.zeros(16, 8)) == "linear"
    monkeypatch.setattr(cpu_linear, "MODE", "fast")
    with pytest.raises(ValueError, match="cpu_linear.MODE must be one of"):
        cpu_linear.product(torch.zeros(3, 8), torch.zeros(16, 8))


@pytest.mark.parametrize("mode", ["weight_major", pytest.param("packed", marks=needs_onednn),
                                  pytest.param("onednn", marks=needs_onednn)])
def test_same_product_as_f_linear(monkeypatch, mode):
    monkeypatch.setattr(cpu_linear, "MODE", mode)
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 5, 96, generator=g), torch.randn(200, 96, generator=g), torch.randn(200, generator=g)
    assert cpu_linear.product(x, w) == mode
    got, ref = cpu_linear.linear(x, w, b), F.linear(x, w, b)
    assert got.shape == ref.shape == (1, 5, 200) and got.is_contiguous()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    residual = torch.randn(5, 200, generator=g)
    expected = residual + F.linear(x[0], w)
    out = cpu_linear.add_linear_(residual, x[0], w)
    assert out is residual
    torch.testing.assert_close(residual, expected, atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_onednn_multiplies_the_weight_itself_with_no_copy(monkeypatch, rows):
    """"onednn" keeps no packed copy of any weight, for every row count; "packed" (the control) keeps one."""
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(48, 24, generator=g), torch.randn(rows, 24, generator=g)
    for mode, copies in (("onednn", 0), ("packed", 1)):
        cpu_linear.clear_packed()
        monkeypatch.setattr(cpu_linear, "MODE", mode)
        assert cpu_linear.product(x, w) == mode
        torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
        assert len(cpu_linear._PACKED) == copies
    cpu_linear.clear_packed()


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_the_qwen_pairs_mode_keeps_no_second_copy(monkeypatch, rows):
    """The pair's documented mode (`bench.demo_pair.QWEN_CPU_LINEAR`) never takes the packed (copying) product."""
    from specdec.bench.demo_pair import QWEN_CPU_LINEAR

    monkeypatch.setattr(cpu_linear, "MODE", QWEN_CPU_LINEAR)
    assert cpu_linear.product(torch.zeros(rows, 8), torch.zeros(16, 8)) in ("onednn", "weight_major", "linear")


def test_onednn_without_onednn_falls_back_as_auto(monkeypatch):
    monkeypatch.setattr(cpu_linear, "MODE", "onednn")
    monkeypatch.setattr(cpu_linear, "packed_available", lambda: False)
    assert cpu_linear.product(torch.zeros(3, 8), torch.zeros(16, 8)) == "weight_major"
    assert cpu_linear.product(torch.zeros(1, 8), torch.zeros(16, 8)) == "linear"


@needs_onednn
def test_packed_weight_follows_in_place_changes_and_is_dropped_with_it(monkeypatch):
    monkeypatch.setattr(cpu_linear, "MODE", "packed")
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(32, 16, generator=g), torch.randn(3, 16, generator=g)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        w.mul_(-2.0)  # the packed copy must not be reused for the changed values
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
    assert id(w) in cpu_linear._PACKED
    ident = id(w)
    del w
    gc.collect()
    assert ident not in cpu_linear._PACKED


@pytest.mark.parametrize("mode", ["weight_major", pytest.param("packed", marks=needs_onednn),
                                  pytest.param("onednn", marks=needs_onednn)])
def test_fast_model_cpu_forwards_match_f_linear_and_transformers(make_llama, monkeypatch, mode):
    hf = make_llama(3, layers=3)
    fast = FastLlama.from_hf(hf)
    prompt, block = [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]  # a 5-row "verify" block after a prompt
    outs = []
    for m in (mode, "linear"):
        monkeypatch.setattr(cpu_linear, "MODE", m)
        cache = fast.new_cache(1, 32)
        with torch.inference_mode():
            first = fast(torch.tensor([prompt]), cache)[0]
            outs.append(torch.cat([first, fast(torch.tensor([block]), cache)[0], fast(torch.tensor([[15]]), cache)[0]]))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0)
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt + block + [15]])).logits[0]
    torch.testing.assert_close(outs[0], ref, atol=1e-4, rtol=0)
