"""FP8 and int4 (GPTQ / AWQ) weights on random tensors, on the CPU: the reference packers' tensors unpack to the float
weight within the quantization grid, GPTQ and AWQ of the same integers are the same matrix, the Triton kernel (in
Triton's interpreter) matches the dequantized float32 product, and a wrong scale or a wrong zero-point order fails
the same checks (negative controls).

Tolerances. Unpacking: |w − dequantized| ≤ s/2 per group (round to nearest; 4-bit: s = the group's scale), e4m3: ≤
2⁻⁴ |w| + the scale (3 mantissa bits, subnormals). Kernel vs reference, both float32 sums of the same exact products:
|y − y_ref| ≤ 1e-5 · (|x| @ |W|ᵀ) + 1e-6 (summation order only).
"""

from __future__ import annotations

import pytest
import torch

from specdec.fast.kernels.quant_linear import QuantConfig, run_kernel, weight_only
from specdec.fast.quant import pack
from specdec.fast.quant.fp8 import Fp8Weight, join as fp8_join
from specdec.fast.quant.int4 import Int4Weight, from_awq, from_gptq, join as int4_join, unpack_columns

N, K, G = 80, 256, 128  # N not a multiple of the 64-column tile: the masks are exercised


def weight(seed=0, n=N, k=K):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def close(y, ref, x, w):
    bound = 1e-5 * (x.abs() @ w.abs().t()) + 1e-6
    return bool(((y - ref).abs() <= bound).all())


@pytest.fixture
def interpret(monkeypatch):
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("on a GPU host the kernel is tested on CUDA (test_quant_gpu_cuda.py)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_int4_unpack_within_grid_and_gptq_equals_awq():
    w = weight()
    q, z, s = pack.quantize_int4(w, G)
    gptq = from_gptq(*pack.pack_gptq(q, z, s))
    awq = from_awq(*pack.pack_awq(q, z, s))
    v2 = from_gptq(*pack.pack_gptq(q, z, s, "gptq_v2"), checkpoint_format="gptq_v2")
    d = gptq.dequantize()
    half_step = s.float().repeat_interleave(G, 0).t() / 2  # [N, K]
    assert ((d - w).abs() <= half_step + 1e-7).all()
    assert torch.equal(awq.dequantize(), d) and torch.equal(v2.dequantize(), d)
    assert torch.equal(gptq.values(), q)


def test_int4_wrong_zero_order_or_format_fails():
    q, z, s = pack.quantize_int4(weight(), G)
    qweight, qzeros, scales = pack.pack_awq(q, z, s)
    good = from_awq(qweight, qzeros, scales)
    # AWQ's zero points read in the plain column order (not 0, 2, 4, 6, 1, 3, 5, 7): wrong columns
    wrong = Int4Weight(good.qweight, unpack_columns(qzeros).contiguous(), good.scales, G, good.shape, "AWQ")
    assert not torch.allclose(wrong.dequantize(), good.dequantize(), atol=1e-4)
    # GPTQ v1 read as v2 (the stored z − 1 taken as z): every weight shifts by one step
    shifted = from_gptq(*pack.pack_gptq(q, z, s), checkpoint_format="gptq_v2")
    assert not torch.allclose(shifted.dequantize(), good.dequantize(), atol=1e-4)


def test_gptq_act_order_and_bits_refused():
    q, z, s = pack.quantize_int4(weight(), G)
    qweight, qzeros, scales, g_idx = pack.pack_gptq(q, z, s)
    with pytest.raises(ValueError, match="act-order"):
        from_gptq(qweight, qzeros, scales, g_idx.flip(0))
    with pytest.raises(ValueError, match="bits=8"):
        from_gptq(qweight, qzeros, scales, bits=8)


@pytest.mark.parametrize("scheme", ["tensor", "channel", "block"])
def test_fp8_unpack_within_grid(scheme):
    w = weight(1, n=200, k=384)  # (N not a multiple of 128: a partial scale block)
    e, scale = pack.quantize_fp8(w, scheme)
    fw = Fp8Weight.from_checkpoint(e, scale)
    assert fw.scheme == scheme
    d = fw.dequantize()
    assert ((d - w).abs() <= w.abs() / 16 + fw.scale.max() * 2**-6).all()


def test_fp8_scale_shapes_refused():
    e, _ = pack.quantize_fp8(weight(), "channel")
    with pytest.raises(ValueError, match="128 x 128"):
        Fp8Weight.from_checkpoint(e, torch.ones(3, 5), name="w")


def formats(seed=0, n=N, k=K):
    w = weight(seed, n, k)
    q, z, s = pack.quantize_int4(w, G)
    out = {"gptq": from_gptq(*pack.pack_gptq(q, z, s)), "awq": from_awq(*pack.pack_awq(q, z, s))}
    for scheme in ("tensor", "channel", "block"):
        out[f"fp8-{scheme}"] = Fp8Weight.from_checkpoint(*pack.quantize_fp8(w, scheme))
    return out


@pytest.mark.parametrize("fmt", ["gptq", "awq", "fp8-tensor", "fp8-channel", "fp8-block"])
@pytest.mark.parametrize("rows", [1, 5, 20])
def test_kernel_matches_reference_interpreted(interpret, fmt, rows):
    qw = formats()[fmt]
    d = qw.dequantize()
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(N, generator=torch.Generator().manual_seed(3))
    ref = x @ d.t() + bias
    configs = [QuantConfig(64, 128, 1), QuantConfig(32, 128, 2), QuantConfig(16, 128, 1, unpack="gather"),
               QuantConfig(32, 128, 2, split_reduce="kernel"), QuantConfig(32, 128, 2, prefetch=True),
               QuantConfig(16, 128, 1, unpack="gather", prefetch=True)]
    if fmt in ("fp8-tensor", "fp8-channel"):  # (per-channel scales: tiles of any depth dividing K)
        configs += [QuantConfig(32, 64, 2, prefetch=True), QuantConfig(16, 256, 1)]
    if rows <= 5:  # (the FMA variant's few rows; its 3-D accumulator is slow in the interpreter)
        configs += [QuantConfig(16, 128, 2, 4, variant="fma"), QuantConfig(16, 128, 1, 2, unpack="gather-magic",
                                                                           variant="fma", prefetch=True)]
    for config in configs:
        y = run_kernel(x, *qw.kernel_args()[:4], qw.kernel_args()[4], N, bias, config=config)
        assert close(y, ref, x, d), (fmt, config, (y - ref).abs().max())
    residual = torch.randn(rows, N)
    out = qw.add_linear_(residual.clone(), x, kernel="triton")
    assert close(out, residual + x @ d.t(), x, d)


@pytest.mark.parametrize("fmt", ["gptq", "fp8-block"])
def test_kernel_wrong_scale_fails(interpret, fmt):
    qw = formats()[fmt]
    d = qw.dequantize()
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(4))
    if fmt == "gptq":
        scales = qw.scales.clone()
        scales[1, 7] *= 1.5  # one group's scale of one column
        bad = Int4Weight(qw.qweight, qw.zeros, scales, qw.group, qw.shape, qw.source)
    else:
        scale = qw.scale.clone()
        scale[0, 1] *= 1.5
        bad = Fp8Weight(qw.weight, scale, "block")
    y = bad.linear(x, kernel="triton")
    assert not close(y, x @ d.t(), x, d)


def test_reference_path_on_cpu_and_joins():
    parts = [formats(seed) for seed in (5, 6)]
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(7))
    for fmt, join in (("gptq", int4_join), ("fp8-channel", fp8_join), ("fp8-block", fp8_join)):
        a, b = parts[0][fmt], parts[1][fmt]
        if fmt == "fp8-block":  # (blocks stack at multiples of 128 rows)
            a, b = formats(5, n=128)[fmt], formats(6, n=128)[fmt]
        joined = join([a, b])
        assert torch.equal(joined.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
        y = joined.linear(x)  # CPU: the reference (dequantize, then F.linear)
        assert torch.allclose(y, x @ joined.dequantize().t(), atol=1e-6)
    with pytest.raises(ValueError, match="block"):
        fp8_join([parts[0]["fp8-block"], parts[1]["fp8-block"]])  # 80 rows: not a multiple of 128


def test_bitwise_on_cpu_refused(monkeypatch):
    qw = formats()["gptq"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the interpreter would run the kernel on CPU tensors)
    with pytest.raises(ValueError, match="bitwise"):
        weight_only(torch.randn(2, K), qw, kernel="bitwise")


@pytest.mark.parametrize("unpack", ["reshape", "gather", "reshape-magic", "gather-magic"])
def test_int4_unpackings_fp16_interpreted(interpret, unpack):
    """Every int4 unpacking on fp16 activations (the interpreter has no bf16; the CUDA tests run bf16): the
    "-magic" ones build 1024 + q from its bits, then subtract 1024 + z (exact)."""
    qw = formats()["gptq"]
    d = qw.dequantize()
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(8)).half()
    y = run_kernel(x, "int4", qw.qweight, qw.zeros, qw.scales, G, N,
                   config=QuantConfig(32, 128, 2, unpack=unpack, prefetch=True))
    ref = x.float() @ d.t()
    assert ((y.float() - ref).abs() <= 2**-10 * (x.float().abs() @ d.abs().t()) + 1e-4).all()


@pytest.mark.parametrize("fmt", ["gptq", "fp8-block", "fp8-channel"])
def test_kernel_uneven_split_interpreted(interpret, fmt):
    """K = 384 in two slices of 256: the second slice's tile past K loads nothing (prefetched or not)."""
    qw = formats(9, n=48, k=384)[fmt]
    d = qw.dequantize()
    x = torch.randn(2, 384, generator=torch.Generator().manual_seed(10))
    for prefetch in (False, True):
        y = run_kernel(x, *qw.kernel_args()[:4], qw.kernel_args()[4], 48,
                       config=QuantConfig(16, 128, 2, prefetch=prefetch))
        assert close(y, x @ d.t(), x, d)
