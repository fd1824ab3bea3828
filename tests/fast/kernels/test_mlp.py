"""Fused silu(gate)·up equals its eager reference (Triton interpreter on CPU; bf16 on CUDA)."""

import pytest
import torch

from specdec.fast.kernels.mlp import silu_mul, silu_mul_reference

pytest.importorskip("triton")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CASES = [pytest.param("cpu", torch.float32, 1e-5, id="cpu-fp32"),
         pytest.param("cuda", torch.bfloat16, 2e-2, id="cuda-bf16", marks=[pytest.mark.gpu, CUDA])]


@pytest.mark.parametrize("device, dtype, tol", CASES)
@pytest.mark.parametrize("shape", [(2, 3, 2 * 40), (5, 2 * 1500), (1, 1, 2 * 7)])
def test_silu_mul_matches_reference(device, dtype, tol, shape):
    gate_up = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 4).to(device, dtype)
    out = silu_mul(gate_up, kernel="triton")
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    torch.testing.assert_close(out, silu_mul_reference(gate_up), atol=tol, rtol=tol)


def test_strided_rows_and_selector():
    wide = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    gate_up = wide[:, :60]  # rows with a stride larger than their length
    torch.testing.assert_close(silu_mul(gate_up, kernel="triton"), silu_mul_reference(gate_up))
    assert torch.equal(silu_mul(gate_up), silu_mul_reference(gate_up))  # "auto" on CPU: the reference
    with pytest.raises(ValueError, match="even"):
        silu_mul(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="kernel"):
        silu_mul(gate_up, kernel="fast")
