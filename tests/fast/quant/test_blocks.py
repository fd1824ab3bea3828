"""Every GGUF block type specdec keeps quantized, on random tensors: its `QuantWeight` dequantizes to exactly what
gguf's `quants.dequantize` gives (transformers' reference); the layout helpers (join, select_rows) keep it exact; bad
input is refused by name. The kernel's products: tests/fast/quant/test_kernel.py.

Types gguf can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantized from random floats; the K-quants (Q4_K, Q5_K,
Q6_K), which it only dequantizes, are random raw blocks with sane fp16 scales. `within_rounding`: the product of a
float32 path (the chunked fallback) against x @ Wᵀ: |y − y_ref| ≤ 2⁻¹⁶ · (|x| @ |W|ᵀ) + 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

from specdec.fast.quant import kernel as qkernel  # noqa: E402
from specdec.fast.quant.blocks import BLOCK_BYTES, SUPPORTED, from_blocks  # noqa: E402
from specdec.fast.quant.weight import QuantWeight, join  # noqa: E402

QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def raw_tensor(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """A GGUF tensor's raw blocks `uint8 [n, bytes per row]` of type `kind` (seeded)."""
    rng = np.random.default_rng(seed)
    if kind in QUANTIZABLE:
        return quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType[kind])
    per, size = BLOCK_BYTES[kind]
    raw = rng.integers(0, 256, (n, k // per * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    scales = lambda: (rng.random(blocks.shape[0]) * 0.02 + 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)  # noqa: E731
    if kind == "Q6_K":
        blocks[:, 208:210] = scales()
    else:
        blocks[:, 0:2], blocks[:, 2:4] = scales(), scales()  # d, dmin
    return raw


def reference(kind: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]).copy())


def within_rounding(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> bool:
    bound = (x.abs() @ dense.abs().t()) * 2.0**-16 + 1e-6
    return bool(((y - x @ dense.t()).abs() <= bound).all())


def test_the_table_covers_the_issue_types():
    assert set(SUPPORTED) >= {"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"}
    assert set(SUPPORTED) == set(QUANTIZABLE) | set(K_QUANTS)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_dequantize_is_ggufs_bit_for_bit(kind):
    raw = raw_tensor(kind, 24, 512)
    weight = from_blocks(kind, raw, (24, 512))
    assert weight.bits == (4 if kind.startswith("Q4") else 8) and weight.source == kind
    assert torch.equal(weight.dequantize(), reference(kind, raw))
    assert torch.equal(weight.dequantize(5, 9), reference(kind, raw)[5:9])


def test_the_chunked_path_without_the_kernel(monkeypatch):
    """No compiler: every product dequantizes CHUNK_ROWS rows at a time — the same result within rounding."""
    monkeypatch.setattr(qkernel, "kernel_available", lambda: False)
    monkeypatch.setattr(qkernel, "CHUNK_ROWS", 32)
    torch.manual_seed(1)
    raw = raw_tensor("Q4_K", 100, 256)
    weight, dense = from_blocks("Q4_K", raw, (100, 256)), reference("Q4_K", raw)
    x = torch.randn(3, 256)
    assert within_rounding(qkernel.quant_linear(x, weight), x, dense)
    residual = torch.zeros(3, 100)
    assert within_rounding(qkernel.quant_add_linear_(residual, x, weight), x, dense)


def test_a_failed_build_falls_back_with_its_reason(monkeypatch):
    """A host whose compiler fails the extension (other CPU flags, no g++): `_load` answers the reason, the kernel is
    unavailable, and the products take the chunked path — no exception reaches the caller."""
    from torch.utils import cpp_extension

    def broken(**_):
        raise RuntimeError("Error building extension 'specdec_quant_cpu'\nmore lines")

    monkeypatch.setattr(cpp_extension, "load", broken)
    qkernel._load.cache_clear()
    try:
        assert qkernel._load() == "RuntimeError: Error building extension 'specdec_quant_cpu'"
        assert not qkernel.kernel_available() and qkernel.kernel_isa() == 0
        assert "did not build" in qkernel.kernel_name()
        raw = raw_tensor("Q8_0", 8, 64)
        weight, dense = from_blocks("Q8_0", raw, (8, 64)), reference("Q8_0", raw)
        x = torch.randn(5, 64)
        assert within_rounding(qkernel.quant_linear(x, weight), x, dense)
    finally:
        qkernel._load.cache_clear()  # (the next call loads the real extension again: built, so no rebuild)


def test_join_widens_mixed_types_exactly():
    """q|k|v of a Q4_K_M file: Q4_K q and k with a Q6_K v → one 8-bit group-16 matrix, the same weights."""
    parts = [("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)]
    raws = [raw_tensor(kind, n, 256, seed=i) for i, (kind, n) in enumerate(parts)]
    joined = join([from_blocks(kind, raw, (n, 256)) for (kind, n), raw in zip(parts, raws)])
    assert (joined.bits, joined.group, joined.shape, joined.source) == (8, 16, (128, 256), "Q4_K+Q6_K")
    dense = torch.cat([reference(kind, raw) for (kind, _), raw in zip(parts, raws)])
    assert torch.equal(joined.dequantize(), dense)
    same = join([from_blocks("Q4_1", raw_tensor("Q4_1", 32, 256, seed=s), (32, 256)) for s in (1, 2)])
    assert (same.bits, same.group) == (4, 32)


def test_select_rows_keeps_the_rows_quantized():
    raw = raw_tensor("Q8_0", 16, 64)
    weight = from_blocks("Q8_0", raw, (16, 64))
    order = torch.tensor([3, 0, 15, 7])
    assert torch.equal(weight.select_rows(order).dequantize(), reference("Q8_0", raw)[order])


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="Q2_K"):
        from_blocks("Q2_K", np.zeros((2, 84), np.uint8), (2, 256))
    with pytest.raises(ValueError, match="expected raw blocks"):
        from_blocks("Q4_0", np.zeros((2, 17), np.uint8), (2, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantWeight(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1), None, 4, 32, (2, 16), "Q4_0")
    weight = from_blocks("Q4_0", raw_tensor("Q4_0", 4, 64), (4, 64))
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        qkernel.quant_linear(torch.randn(2, 32), weight)
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        qkernel.quant_linear(torch.randn(2, 64, dtype=torch.float64), weight)
