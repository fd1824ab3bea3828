"""A host-independent `tl.dot` for Triton's interpreter, for the tests that check bits.

The interpreter computes `tl.dot` with numpy's matmul, that is the host's BLAS, and there a row's bits can depend on
its place in the tile: OpenBLAS's Haswell kernel (an AMD EPYC with OPENBLAS_CORETYPE=Haswell) rounds rows 6–11 of a
16-row tile differently from rows 0–5, while another CPU's kernel rounds them alike. A GPU's tensor cores compute every
output element the same way wherever its row sits, which is what the batch-invariant kernels are designed on; so the
tests that check a row's bits across tiles, batches and spans run the interpreter's dot as a fixed-order product: for
every output element the same multiply-then-add sequence over k (IEEE float32 operations, no BLAS), on every host.
"""

from __future__ import annotations

import numpy as np
import pytest


def fixed_order_matmul(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """a `[..., M, K]` @ b `[..., K, N]` in `dtype`, each element summed over k = 0, 1, … in that order."""
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    out = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype=dtype)
    for k in range(a.shape[-1]):
        out += a[..., :, k, None] * b[..., None, k, :]
    return out


@pytest.fixture
def fixed_order_dot(monkeypatch):
    """Route the Triton interpreter's `tl.dot` through `fixed_order_matmul` for one test (nothing without triton)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:  # (fp8: the interpreter's own path)
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = fixed_order_matmul(a.data, b.data, d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    monkeypatch.setattr(builder, "create_dot", create_dot)
