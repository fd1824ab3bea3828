"""Choosing cuBLAS or the weight-streaming GEMM per weight shape (`kernels.linear_choice`)."""

import pytest
import torch

from specdec.fast.kernels.linear_choice import GemmTiming, faster_shapes, time_gemms


def test_faster_shapes_needs_a_win_at_every_row_count():
    timings = [GemmTiming(64, 32, 1, 2, cublas_us=10.0, triton_us=8.0, weight_bytes=4096),
               GemmTiming(64, 32, 5, 2, cublas_us=10.0, triton_us=11.0, weight_bytes=4096),  # loses at 5 rows
               GemmTiming(16, 32, 1, 2, cublas_us=10.0, triton_us=9.5, weight_bytes=1024),
               GemmTiming(8, 32, 1, 2, cublas_us=10.0, triton_us=10.0, weight_bytes=512)]  # a tie is no win
    assert faster_shapes(timings) == {(16, 32)}
    assert faster_shapes(timings, margin=0.1) == frozenset()
    assert timings[0].triton_GBps == pytest.approx(4096 / 8.0e3)
    with pytest.raises(ValueError, match="CUDA weights"):
        time_gemms([torch.zeros(4, 4)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_time_gemms_on_cuda():
    pytest.importorskip("triton")
    weights = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    t = time_gemms(weights, rows=1, reps=5)
    assert (t.n, t.k, t.weights) == (1024, 1024, 4) and t.cublas_us > 0 and t.triton_us > 0
