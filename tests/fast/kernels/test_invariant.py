"""The batch-invariant kernels (`fast.kernels.invariant`): each computes its eager function (within round-off) and
gives a row / a query the same bits whatever shares the call — rows of another GEMM height, other queries of the
row, other rows of the batch, another cache span, one split or several. The torch path on CPU; the Triton kernels
in Triton's interpreter on CPU (fp32; its `tl.dot` as a fixed-order product, `interpreter_dot`, since numpy's BLAS
rounds a row by its place in the tile on some hosts) and compiled on CUDA (bf16, GPU-marked)."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from specdec.fast.kernels import invariant
from specdec.fast.kernels.attention import slot_attention_reference
from specdec.fast.kernels.invariant import invariant_attention, invariant_linear
from variant_kernels import nudged, row_count_dependent_linear

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.usefixtures("fixed_order_dot")  # the interpreter's tl.dot without the host's BLAS
CPU_KERNELS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


def rnd(*shape, seed=0, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------------ linear
def row_invariance_failures(fn, x: torch.Tensor, heights) -> list:
    """The row counts M for which row 0 of fn(rows) differs from fn(that row alone), and the places in a batch
    where the same row differs (each M: the row put at the batch's last place, other rows random)."""
    alone = fn(x[:1])[0]
    bad = []
    for m in heights:
        rows = rnd(m, x.shape[-1], seed=m, dtype=x.dtype, device=x.device)
        rows[m - 1] = x[0]
        if not torch.equal(fn(rows)[m - 1], alone):
            bad.append(m)
    return bad


@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_linear_matches_the_product_and_is_row_invariant(kernel):
    heights = [2, 3, 5, 8, 9, 17, 40, 70] if kernel == "torch" else [2, 5, 33, 40]  # (the interpreter is slow)
    for n, k in [(40, 48), (96, 160)]:
        x, w, b, r = rnd(70, k, seed=1), rnd(n, k, seed=2) / k ** 0.5, rnd(n, seed=3), rnd(70, n, seed=4)
        got = invariant_linear(x, w, b, residual=r, kernel=kernel)
        assert got.shape == (70, n) and got.dtype == x.dtype
        torch.testing.assert_close(got, F.linear(x, w, b) + r, rtol=1e-5, atol=1e-5)
        for bias, residual in [(None, None), (b[None], r[:1])]:
            fn = lambda rows: invariant_linear(rows, w, None if bias is None else b,  # noqa: E731
                                               residual=None if residual is None else residual.expand(len(rows), n),
                                               kernel=kernel)
            assert row_invariance_failures(fn, x, heights) == [], (n, k, bias is not None)


def test_linear_in_place_residual_and_leading_dims():
    x, w, r = rnd(2, 3, 48, seed=5), rnd(40, 48, seed=6), rnd(2, 3, 40, seed=7)
    want = invariant_linear(x, w, residual=r.clone(), kernel="torch")
    out = r.clone()
    assert invariant_linear(x, w, residual=out, out=out, kernel="torch") is out
    assert torch.equal(out, want) and want.shape == (2, 3, 40)



@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_split_k_linear_is_row_invariant(monkeypatch):
    """The fixed split-K (Triton interpreter): K cut into 3 ranges of 2 · 16 (the last one ragged), partials summed
    in split order by `_reduce`, then bias and residual; a row's bits do not depend on M nor on the other rows. The
    control: another split count is another summation order (different bits), so the check has power."""
    from specdec.fast.kernels import _invariant_triton as kt

    split3 = kt.MatmulConfig(16, 16, 16, 1, 1, split_k=3)
    monkeypatch.setattr(kt, "_LAUNCH", {})  # (launch_config's cache: the configs are patched below)
    monkeypatch.setattr(kt, "fixed_config", lambda n, k: split3)
    n, k = 40, 80
    x, w, b, r = rnd(40, k, seed=1), rnd(n, k, seed=2) / k ** 0.5, rnd(n, seed=3), rnd(40, n, seed=4)
    got = invariant_linear(x, w, b, residual=r, kernel="triton")
    torch.testing.assert_close(got, F.linear(x, w, b) + r, rtol=1e-5, atol=1e-5)
    out = r.clone()  # in place on the residual (the reduce reads and writes each element in one program)
    assert torch.equal(invariant_linear(x, w, b, residual=out, out=out, kernel="triton"), got)
    fn = lambda rows: invariant_linear(rows, w, b, residual=r[:1].expand(len(rows), n), kernel="triton")  # noqa: E731
    assert row_invariance_failures(fn, x, [2, 5, 17, 33]) == []
    big = 1e4 * rnd(1, k, seed=5)  # large products of both signs: the sum's order shows in the low bits
    monkeypatch.setattr(kt, "fixed_config", lambda n, k: kt.MatmulConfig(16, 16, 16, 1, 1, split_k=1))
    kt._LAUNCH.clear()
    one = invariant_linear(big, w, kernel="triton")
    monkeypatch.setattr(kt, "fixed_config", lambda n, k: split3)
    kt._LAUNCH.clear()
    assert not torch.equal(invariant_linear(big, w, kernel="triton"), one)


def test_the_row_check_has_power():
    """The negative control, by construction on every host: a product whose last bit depends on the rows in the call
    (`variant_kernels`) fails the check at every height. (Plain BLAS is no control: MKL keeps a row's bits for some
    shapes on some CPUs and not on others.)"""
    x, w = rnd(70, 160, seed=8), rnd(96, 160, seed=9)
    heights = [2, 3, 5, 8, 9, 17, 40, 70]
    assert row_invariance_failures(lambda rows: row_count_dependent_linear(rows, w), x, heights) == heights


def test_linear_refuses_bad_arguments():
    x, w = rnd(3, 48), rnd(40, 48)
    with pytest.raises(ValueError, match="K"):
        invariant_linear(x, rnd(40, 32))
    with pytest.raises(ValueError, match="kernel"):
        invariant_linear(x, w, kernel="cublas")
    with pytest.raises(ValueError, match="bias"):
        invariant_linear(x, w, rnd(39))
    with pytest.raises(ValueError, match="residual"):
        invariant_linear(x, w, residual=rnd(3, 39))


# --------------------------------------------------------------------------------------------------- attention
def attention_case(batch=3, k=4, heads=4, kv_heads=2, dim=16, slots=96, seed=0, device="cpu",
                   dtype=torch.float32):
    q = rnd(batch, k, heads, dim, seed=seed, dtype=dtype, device=device)
    keys = rnd(batch, kv_heads, slots, dim, seed=seed + 1, dtype=dtype, device=device)
    values = rnd(batch, kv_heads, slots, dim, seed=seed + 2, dtype=dtype, device=device)
    starts = torch.tensor([3, 40, slots - 2 - k][:batch], device=device)
    positions = starts[:, None] + torch.arange(k, device=device)[None, :]
    return q, keys, values, positions


def query_invariance_failures(fn, q, keys, values, positions) -> list:
    """Where a query's output differs from the same query computed alone (k = 1, batch 1), or over a shorter span."""
    full = fn(q, keys, values, positions)
    bad = []
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            alone = fn(q[b : b + 1, i : i + 1], keys[b : b + 1], values[b : b + 1], positions[b : b + 1, i : i + 1])
            if not torch.equal(alone[0, 0], full[b, i]):
                bad.append(("alone", b, i))
            span = int(positions[b, i]) + 2  # the shortest cache that still holds the query's slots (+ junk)
            short = fn(q[b : b + 1, i : i + 1], keys[b : b + 1, :, :span], values[b : b + 1, :, :span],
                       positions[b : b + 1, i : i + 1])
            if not torch.equal(short[0, 0], full[b, i]):
                bad.append(("span", b, i))
    return bad


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("window", [None, 7])
def test_attention_matches_the_reference_and_is_query_invariant(kernel, window):
    q, keys, values, positions = attention_case()
    fn = lambda *a: invariant_attention(*a, 0.3, window=window, kernel=kernel)  # noqa: E731
    got = fn(q, keys, values, positions)
    want = slot_attention_reference(q, keys, values, positions, 0.3, window=window)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert query_invariance_failures(fn, q, keys, values, positions) == []


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("window", [None, 40])
def test_attention_with_several_splits_stays_query_invariant(monkeypatch, window):
    """Spans longer than SPLIT_SLOTS run fixed slot ranges merged in order; shown with splits of 32 slots: a query
    gets the same bits whatever the number of splits the span launches (one split stores directly, which is what
    the merge makes of one split), whatever the company."""
    from specdec.fast.kernels import _invariant_attention

    monkeypatch.setattr(_invariant_attention, "SPLIT_SLOTS", 32)
    q, keys, values, positions = attention_case(batch=3, k=2, slots=96)
    fn = lambda *a: invariant_attention(*a, window=window, kernel="triton")  # noqa: E731
    torch.testing.assert_close(fn(q, keys, values, positions),
                               slot_attention_reference(q, keys, values, positions, window=window),
                               rtol=2e-5, atol=2e-5)
    assert query_invariance_failures(fn, q, keys, values, positions) == []


def _invariant_by_construction(q, k, v, p):
    """The reference attention computed one query at a time over the same slice of the cache whatever the call
    (the query's slots + the junk slot): the same inputs of the same shapes, so the same bits on any host."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            span = int(p[b, i]) + 2
            out[b, i] = slot_attention_reference(q[b : b + 1, i : i + 1], k[b : b + 1, :, :span],
                                                 v[b : b + 1, :, :span], p[b : b + 1, i : i + 1], 0.3)[0, 0]
    return out


def test_the_query_check_has_power():
    """The negative controls, by construction on every host: over an attention whose bits cannot depend on the call
    (`_invariant_by_construction`), the last bit moved when the call holds more than one query fails the check at
    every query, alone and over the short span; moved only over a span shorter than the full case's, it fails at
    every query's short span and nowhere else. (The reference attention itself is no base: whether its bits change
    with the span depends on the host's kernels.)"""
    q, keys, values, positions = attention_case(k=5, slots=200)
    assert query_invariance_failures(_invariant_by_construction, q, keys, values, positions) == []  # (the base)

    def company_dependent(q, k, v, p):
        return nudged(_invariant_by_construction(q, k, v, p), q.shape[0] * q.shape[1] > 1)

    def span_dependent(q, k, v, p):
        return nudged(_invariant_by_construction(q, k, v, p), k.shape[2] < 200)

    queries = [(b, i) for b in range(q.shape[0]) for i in range(q.shape[1])]
    bad = query_invariance_failures(company_dependent, q, keys, values, positions)
    assert sorted(bad) == sorted([(case, b, i) for b, i in queries for case in ("alone", "span")])
    bad = query_invariance_failures(span_dependent, q, keys, values, positions)
    assert sorted(bad) == sorted([("span", b, i) for b, i in queries])


def test_attention_refuses_bad_arguments():
    q, keys, values, positions = attention_case()
    with pytest.raises(ValueError, match="positions"):
        invariant_attention(q, keys, values, positions[:, :2])
    with pytest.raises(ValueError, match="window"):
        invariant_attention(q, keys, values, positions, window=0)
    with pytest.raises(ValueError, match="keys/values"):
        invariant_attention(q, keys[:, :, :, :8], values, positions)


# --------------------------------------------------------------------------------------------------------- GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_linear_is_row_invariant(dtype):
    for n, k in [(1024, 576), (3072, 1024), (1000, 4096), (65536, 256)]:  # 4 K splits; the vocab-sized config
        x = rnd(600, k, seed=1, dtype=dtype, device="cuda")
        w, b = rnd(n, k, seed=2, dtype=dtype, device="cuda") / k ** 0.5, rnd(n, seed=3, dtype=dtype, device="cuda")
        got = invariant_linear(x, w, b)
        torch.testing.assert_close(got.float(), F.linear(x, w, b).float(), rtol=2e-2, atol=2e-2)
        fn = lambda rows: invariant_linear(rows, w, b)  # noqa: E731
        assert row_invariance_failures(fn, x, [2, 5, 9, 33, 64, 65, 320, 576, 600]) == [], (n, k)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("window", [None, 100])
def test_gpu_attention_is_query_invariant(window):
    for dim, slots in [(64, 300), (128, 1200)]:  # 1200 slots: three splits
        q, keys, values, positions = attention_case(batch=3, k=9, heads=32, kv_heads=8, dim=dim, slots=slots,
                                                    device="cuda", dtype=torch.bfloat16)
        fn = lambda *a: invariant_attention(*a, window=window)  # noqa: E731
        got = fn(q, keys, values, positions)
        want = slot_attention_reference(q, keys, values, positions, window=window)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert query_invariance_failures(fn, q, keys, values, positions) == [], dim
