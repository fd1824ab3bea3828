"""The quantized kernel (`fast/quant/q8_cpu.cpp`): x's rows quantized to 8 bits per block of 32, integer dot products
against every GGUF block type, on random tensors and on SmolLM2-135M's real ones (skipped without the file).

Three checks per type:
  exact arithmetic  y equals x̂ @ Wᵀ to float32 rounding, where x̂ = d · round(x / d) per block of 32 (d = max|x| / 127)
                    is the activation the kernel multiplies and W the exact dequantized weight; a scale 1% off in one
                    group (the negative control) fails the same check
  error bound       |y − x @ Wᵀ| ≤ Σ_blocks (d / 2) · ‖W's block‖₁ (+ rounding): the rounding of x to 8 bits, and no
                    more; the relative error ‖y − x @ Wᵀ‖ / ‖x @ Wᵀ‖ below 1% on Gaussian x
  invariance        every row's output is the same bits whatever the rows beside it (1..40 rows), and the same on
                    every instruction set this CPU runs (AVX-512 VNNI, AVX2, portable C++)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fast.quant.test_blocks import raw_tensor, reference  # noqa: E402
from gguf_helpers import smollm2_gguf  # noqa: E402

from specdec.fast.quant import kernel as qkernel  # noqa: E402
from specdec.fast.quant.blocks import SUPPORTED, from_blocks  # noqa: E402
from specdec.fast.quant.weight import QuantWeight, join  # noqa: E402

pytestmark = pytest.mark.skipif(not qkernel.kernel_available(), reason="the quantized kernel did not build here")


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x̂ `[M, K]`, d `[M, K/32]`): the kernel's activations, emulated in float32 (round half to even)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inv) * d).reshape(x.shape), d[..., 0]


def exact_arithmetic(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> bool:
    xh, _ = quantized_activations(x)
    bound = (xh.abs() @ dense.abs().t()) * 2.0**-16 + 1e-6
    return bool(((y - xh @ dense.t()).abs() <= bound).all())


def within_the_bound(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> bool:
    _, d = quantized_activations(x)
    l1 = dense.abs().reshape(dense.shape[0], -1, 32).sum(-1)  # [N, K/32]
    bound = (d / 2) @ l1.t() + (x.abs() @ dense.abs().t()) * 2.0**-15 + 1e-6
    return bool(((y - x @ dense.t()).abs() <= bound).all())


def relative_error(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> float:
    ref = x @ dense.t()
    return float((y - ref).norm() / ref.norm())


def isas() -> list[int]:
    return list(range(1, qkernel.kernel_isa() + 1))


@pytest.mark.parametrize("kind", SUPPORTED)
@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_every_block_type_against_the_dequantized_product(kind, rows):
    torch.manual_seed(rows)
    k = 512 if kind.endswith("_K") else 544  # (544: an odd number of blocks of 32; the K-quants' blocks are 256)
    raw = raw_tensor(kind, 80, k, seed=rows)
    weight, dense = from_blocks(kind, raw, (80, k)), reference(kind, raw)
    x = torch.randn(rows, k)
    y = qkernel.quant_linear(x, weight)
    assert y.shape == (rows, 80)
    assert exact_arithmetic(y, x, dense)
    assert within_the_bound(y, x, dense)
    assert relative_error(y, x, dense) < 0.01
    # the negative control: one group's scale 1% off (row 3's largest) fails the exact check
    bad = QuantWeight(weight.qs, weight.scale.clone(), weight.offset, weight.bits, weight.group, weight.shape, kind)
    bad.scale[3, bad.scale[3].abs().argmax()] *= 1.01
    assert not exact_arithmetic(qkernel.quant_linear(x, bad), x, dense)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_a_rows_output_is_the_same_bits_whatever_the_call(kind):
    """Row-count invariance (greedy plain == speculative rests on it) and one result on every instruction set."""
    torch.manual_seed(3)
    k = 512
    raw = raw_tensor(kind, 70, k, seed=3)
    weight = from_blocks(kind, raw, (70, k))
    x = torch.randn(40, k) * torch.rand(40, 1) * 4
    alone = torch.cat([qkernel.quant_linear(x[i:i + 1], weight) for i in range(40)])
    for rows in (2, 5, 8, 9, 16, 17, 40):
        assert torch.equal(qkernel.quant_linear(x[:rows], weight), alone[:rows]), rows
    for isa in isas():
        assert torch.equal(qkernel.quant_linear(x, weight, isa=isa), alone), qkernel.ISAS[isa]
    bias, residual = torch.randn(70), torch.randn(40, 70)
    assert torch.equal(qkernel.quant_linear(x, weight, bias), alone + bias)
    assert torch.equal(qkernel.quant_add_linear_(residual.clone(), x, weight), residual + alone)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("k", [544, 576, 1536])
def test_a_row_among_5_or_8_rows_is_the_row_alone(kind, k):
    """The register tiles over rows (up to 8 a pass over a weight block, 4- and 8-bit blocks alike) at SmolLM2's K
    (576: a partial last chunk of 8 groups; 1536: whole chunks) and at 544 (17 blocks: a last block pair without its
    odd block): a row gives the same bits alone and at every place among 5 or 8 rows, on every instruction set this
    CPU runs."""
    if kind.endswith("_K") and k % 256:
        k = 768 if k == 576 else 1280
    torch.manual_seed(6)
    weight = from_blocks(kind, raw_tensor(kind, 24, k, seed=6), (24, k))
    x = torch.randn(8, k) * torch.rand(8, 1) * 3
    alone = torch.cat([qkernel.quant_linear(x[i:i + 1], weight) for i in range(8)])
    for rows in (5, 8):
        for shift in range(rows):
            order = (torch.arange(rows) + shift) % rows
            for isa in isas():
                assert torch.equal(qkernel.quant_linear(x[order], weight, isa=isa), alone[order]), (rows, shift, isa)


@pytest.mark.parametrize("group", [32, 16])
def test_8_bit_extremes_are_exact_on_every_path(group):
    """Full-range 8-bit values (−128 and 127 included: Q8_0's int8 holds them) against activations at ±127: the
    integer dots neither saturate nor wrap on any path (AVX2's |w| · sign(qx, w) pairs, VNNI's (qx + 128) · w less
    128 · Σw), so every instruction set gives the same bits and the exact arithmetic; a scale 1% off fails it."""
    gen = torch.Generator().manual_seed(7)
    n, k = 24, 544
    qs = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    qs[:, :64] = -128
    qs[:, 64:96] = 127
    scale = torch.rand(n, k // group, generator=gen) * 0.01 + 1e-3
    weight = QuantWeight(qs, scale, None, 8, group, (n, k), "Q8_0" if group == 32 else "Q6_K")
    dense = weight.dequantize()
    x = torch.randn(6, k, generator=gen)
    x[:, :96] = torch.where(torch.rand(6, 96, generator=gen) < 0.5, -1.0, 1.0) * 5  # qx = ±127 there
    ys = [qkernel.quant_linear(x, weight, isa=isa) for isa in isas()]
    assert all(torch.equal(y, ys[0]) for y in ys)
    assert exact_arithmetic(ys[-1], x, dense)
    bad = QuantWeight(qs, scale.clone(), None, 8, group, (n, k), weight.source)
    bad.scale[2, 0] *= 1.01
    assert not exact_arithmetic(qkernel.quant_linear(x, bad), x, dense)


def test_the_invariance_check_can_fail():
    """The negative control of the test above: a call whose rows' activations share one scale (a whole-call
    quantization, as a kernel that quantized the batch together would) gives another row's bits."""
    torch.manual_seed(4)
    weight = from_blocks("Q4_1", raw_tensor("Q4_1", 16, 256, seed=4), (16, 256))
    x = torch.randn(3, 256)
    x[1] *= 50  # a loud row beside quiet ones
    shared = x.abs().amax() / x[0].abs().amax()  # row 0 scaled to share row 1's range, then back
    y0 = qkernel.quant_linear(x[:1], weight)
    skewed = qkernel.quant_linear(x[:1] * shared, weight) / shared
    assert not torch.equal(skewed, y0)


def test_mixed_types_joined_and_zero_rows():
    parts = [("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)]
    raws = [raw_tensor(kind, n, 256, seed=i) for i, (kind, n) in enumerate(parts)]
    joined = join([from_blocks(kind, raw, (n, 256)) for (kind, n), raw in zip(parts, raws)])
    dense = torch.cat([reference(kind, raw) for (kind, _), raw in zip(parts, raws)])
    x = torch.randn(4, 256)
    assert exact_arithmetic(qkernel.quant_linear(x, joined), x, dense)
    assert qkernel.quant_linear(torch.randn(0, 256), joined).shape == (0, 128)
    assert torch.equal(qkernel.quant_linear(torch.zeros(2, 256), joined), torch.zeros(2, 128))


def test_an_isa_the_cpu_lacks_is_refused():
    weight = from_blocks("Q8_0", raw_tensor("Q8_0", 4, 64), (4, 64))
    if qkernel.kernel_isa() < 3:
        with pytest.raises(RuntimeError, match="does not run isa"):
            qkernel.quant_linear(torch.randn(1, 64), weight, isa=3)
    with pytest.raises(RuntimeError, match="isa 0..3"):
        qkernel.quant_linear(torch.randn(1, 64), weight, isa=7)


@pytest.mark.skipif(smollm2_gguf() is None, reason="SmolLM2-135M-Instruct Q4_1 GGUF not installed")
def test_smollm2s_real_tensors():
    """Layer 0's and the last layer's matrices and the tied head (Q8_0) as the file has them, on activations scaled
    like the model's: the exact arithmetic, the bound, and a relative error below 1%."""
    from specdec.loading.gguf_tensors import read_quantized

    wanted = {("wqkv", 0), ("wo", 0), ("w_gate_up", 0), ("w_down", 0), ("w_down", 29), ("lm_head", None),
              ("embed", None)}
    found = {(name, layer): qw for name, layer, qw in read_quantized(smollm2_gguf(), 9, 3) if (name, layer) in wanted}
    assert found, "no tensor of the file was read"
    torch.manual_seed(5)
    for (name, layer), weight in found.items():
        rows = torch.linspace(0, weight.shape[0] - 1, min(weight.shape[0], 1024)).long()
        part = weight.select_rows(rows)
        dense = part.dequantize()
        x = torch.randn(5, weight.shape[1]) * (1 + 3 * torch.rand(weight.shape[1]))  # uneven channels
        y = qkernel.quant_linear(x, part)
        assert exact_arithmetic(y, x, dense), (name, layer)
        assert within_the_bound(y, x, dense), (name, layer)
        assert relative_error(y, x, dense) < 0.01, (name, layer, relative_error(y, x, dense))
