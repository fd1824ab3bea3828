"""Fused RMSNorm (+ residual add) equals its eager reference (Triton interpreter on CPU; bf16 on CUDA)."""

import pytest
import torch

from specdec.fast.kernels.norm import add_rms_norm, add_rms_norm_reference, rms_norm, rms_norm_reference

pytest.importorskip("triton")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CASES = [pytest.param("cpu", torch.float32, 1e-5, id="cpu-fp32"),
         pytest.param("cuda", torch.bfloat16, 2e-2, id="cuda-bf16", marks=[pytest.mark.gpu, CUDA])]


def _inputs(shape, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(device, dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    return x, w


@pytest.mark.parametrize("device, dtype, tol", CASES)
@pytest.mark.parametrize("shape", [(3, 5, 40), (1, 64), (2, 1, 100)])
def test_rms_norm_matches_reference(device, dtype, tol, shape):
    x, w = _inputs(shape, device, dtype)
    before = x.clone()
    out = rms_norm(x, w, 1e-5, kernel="triton")
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_reference(x, w, 1e-5), atol=tol, rtol=tol)
    assert torch.equal(x, before)  # the input is read only


@pytest.mark.parametrize("device, dtype, tol", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_add_rms_norm_updates_the_residual_in_place(device, dtype, tol, bias):
    x, w = _inputs((2, 3, 48), device, dtype)
    g = torch.Generator().manual_seed(1)
    delta = torch.randn((48,) if bias else (2, 3, 48), generator=g).to(device, dtype)
    ref_x, ref_h = add_rms_norm_reference(x.clone(), delta, w, 1e-6)
    got_x, got_h = add_rms_norm(x, delta, w, 1e-6, kernel="triton")
    assert got_x is x  # updated in place
    torch.testing.assert_close(got_x, ref_x, atol=0, rtol=0)  # one add, rounded once either way
    torch.testing.assert_close(got_h, ref_h, atol=tol, rtol=tol)


def test_selector():
    x, w = _inputs((2, 8), "cpu", torch.float32)
    # "auto" on CPU tensors is the eager reference, bit for bit
    assert torch.equal(rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
    with pytest.raises(ValueError, match="kernel"):
        rms_norm(x, w, 1e-5, kernel="cuda")
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm(x, torch.zeros(3), w, 1e-5)
