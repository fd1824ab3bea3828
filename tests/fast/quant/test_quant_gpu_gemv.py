"""The decode-shape quantized GEMV (`fast.kernels.quant_gemv`) on the CPU, in Triton's interpreter: every format (GPTQ
and AWQ int4 in both word layouts, FP8 per tensor / channel / 128 × 128 block) against the dequantized float32
product for M = 1, 3, 5, 8 rows on odd shapes (N not a multiple of any tile; FP8's K not a multiple of 16, so partial
scale blocks both ways), both products (FMA, tensor-core dot), split-K by the reduce kernel and by the last slice;
negative controls: a wrong group / channel / block scale and the int4 nibbles read in reverse order fail the same
comparison. Then the opt-in (`SPECDEC_QUANT_KERNEL`, `SPECDEC_INT4_LAYOUT`: default unchanged, bad values named) and
an sm_90 compile of the kernel's variants (Triton's compiler, no GPU).

Tolerance, float32 activations: both sides are float32 sums of the same exact products (q − z and e4m3 values are
exact, the scale multiplies a tile's partial), so |y − y_ref| ≤ 1e-5 · (|x| @ |W|ᵀ) + 1e-6 (summation order only);
fp16 activations: the output's own rounding, 2⁻¹⁰ · (|x| @ |W|ᵀ) + 1e-4.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specdec.fast.kernels import quant_gemv
from specdec.fast.kernels.quant_gemv import GemvConfig, gemv, pick_gemv_config, plan_split, shape_class
from specdec.fast.kernels.quant_linear import run_kernel, weight_only
from specdec.fast.quant.fp8 import Fp8Weight
from specdec.fast.quant.gpu_attach import quantize_weight
from specdec.fast.quant.int4 import Int4Weight, pack_rows

FORMATS = ("gptq", "awq", "fp8", "fp8-tensor", "fp8-block")
SHAPES = {"int4": (88, 384), "fp8": (77, 200)}  # (N, K)
CONFIGS = {"fma": GemvConfig(block_n=32, block_k=64, split_k=2), "dot": GemvConfig(block_n=64, variant="dot")}


@pytest.fixture
def interpret(monkeypatch):
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("on a GPU host the GEMV is tested on CUDA (test_quant_gpu_gemv_cuda.py)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(quant_gemv.ENV_KERNEL, raising=False)
    monkeypatch.delenv(quant_gemv.ENV_LAYOUT, raising=False)


def quantized(fmt: str, seed: int = 0):
    n, k = SHAPES["fp8" if fmt.startswith("fp8") else "int4"]
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return quantize_weight(w, fmt, 128)


def close(y, x, d, rel=1e-5, atol=1e-6) -> bool:
    ref = x.float() @ d.t()
    return bool(((y.float() - ref).abs() <= rel * (x.float().abs() @ d.abs().t()) + atol).all())


def rows(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 5, 8])
def test_every_format_matches_the_dequantized_product(interpret, fmt, m):
    qw = quantized(fmt)
    d = qw.dequantize()
    x = rows(m, qw.shape[1], seed=m)
    layouts = ("nk", "kn") if fmt in ("gptq", "awq") else ("nk",)
    for variant, config in CONFIGS.items():
        for layout in layouts:
            y = gemv(x, qw, config=config, layout=layout)
            assert y.shape == (m, qw.shape[0]) and y.dtype == x.dtype
            assert close(y, x, d), (variant, layout)
    assert close(gemv(x, qw), x, d)  # (the table's config)


@pytest.mark.parametrize("fmt", ["gptq", "fp8", "fp8-block"])
def test_bias_residual_and_both_split_sums(interpret, fmt):
    qw = quantized(fmt, seed=2)
    d = qw.dequantize()
    n, k = qw.shape
    x = rows(4, k, seed=3)
    bias = rows(1, n, seed=4)[0]
    for split, reduce in ((1, "kernel"), (3, "kernel"), (3, "fused")):
        config = GemvConfig(block_n=32, block_k=64, split_k=split, reduce=reduce, prefetch=split == 1)
        assert close(gemv(x, qw, bias, config=config) - bias, x, d), (split, reduce)
        residual = rows(4, n, seed=5)
        out = gemv(x, qw, None, residual.clone(), config=config)
        assert close(out - residual, x, d, atol=1e-5), (split, reduce)
        target = residual.clone()
        assert gemv(x, qw, None, target, config=config) is target  # (in place)


@pytest.mark.parametrize("variant", ["fma", "dot"])
@pytest.mark.parametrize("unpack", ["shift", "magic"])
def test_fp16_activations_every_int4_unpacking(interpret, variant, unpack):
    """fp16 rows (the interpreter has no bf16; the CUDA tests run bf16): the "magic" unpackings build 2²³ + q (FMA)
    or 1024 + q (dot) from its bits, then subtract the same + z (exact)."""
    qw = quantized("gptq", seed=6)
    d = qw.dequantize()
    x = rows(5, qw.shape[1], seed=7).half()
    y = gemv(x, qw, config=GemvConfig(block_n=32, variant=variant, unpack=unpack))
    assert y.dtype == torch.float16
    assert close(y, x, d, rel=2**-10, atol=1e-4)


def test_odd_rows_group_64_built_directly(interpret):
    """N = 77 (no packer's multiple of 8), group 64: an `Int4Weight` made from its integers."""
    g = torch.Generator().manual_seed(8)
    n, k, group = 77, 192, 64
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.uint8)
    zeros = torch.randint(1, 16, (k // group, n), generator=g, dtype=torch.uint8)
    scales = (torch.rand(k // group, n, generator=g) * 0.01 + 1e-3).half()
    qw = Int4Weight(pack_rows(q).t().contiguous(), zeros, scales, group, (n, k), "GPTQ")
    d = qw.dequantize()
    for m in (1, 8):
        x = rows(m, k, seed=9)
        for layout in ("nk", "kn"):
            assert close(gemv(x, qw, layout=layout), x, d), (m, layout)
    with pytest.raises(ValueError, match="block_k 128 must divide 64"):
        gemv(rows(1, k), qw, config=GemvConfig(block_k=128))


def test_negative_controls_wrong_scale_and_reversed_nibbles_fail(interpret):
    qw = quantized("gptq", seed=10)
    d = qw.dequantize()
    x = rows(3, qw.shape[1], seed=11)
    assert close(gemv(x, qw), x, d)  # (the positive, with the same comparison)
    scales = qw.scales.clone()
    scales[1, 5] *= 1.01  # one group's scale 1% off
    wrong = Int4Weight(qw.qweight, qw.zeros, scales, qw.group, qw.shape, qw.source)
    assert not close(gemv(x, wrong), x, d)
    n, k = qw.shape
    nibbles = (qw.qweight[:, :, None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF  # [N, K/8, 8]
    flipped = nibbles.flip(-1).reshape(n, k).t().to(torch.uint8)  # k = 8i + j holding 8i + 7 − j's value
    swapped = Int4Weight(pack_rows(flipped).t().contiguous(), qw.zeros, qw.scales, qw.group, qw.shape, qw.source)
    for layout in ("nk", "kn"):
        assert not close(gemv(x, swapped, layout=layout), x, d)
    for fmt in ("fp8", "fp8-block"):
        fw = quantized(fmt, seed=12)
        d8 = fw.dequantize()
        x8 = rows(5, fw.shape[1], seed=13)
        assert close(gemv(x8, fw), x8, d8)
        bad = fw.scale.clone()
        bad.view(-1)[1] *= 1.01
        assert not close(gemv(x8, Fp8Weight(fw.weight, bad, fw.scheme)), x8, d8), fmt


def test_default_is_splitk_and_gemv_is_opt_in(interpret, monkeypatch):
    from specdec.fast.kernels.select import kernel_module

    module = kernel_module("quant_gemv_triton")
    calls = []
    real = module.launch
    monkeypatch.setattr(module, "launch", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    qw = quantized("gptq", seed=14)
    fmt, q, zeros, scales, group = qw.kernel_args()
    x = rows(5, qw.shape[1], seed=15)
    splitk = run_kernel(x, fmt, q, zeros, scales, group, qw.shape[0])
    assert torch.equal(weight_only(x, qw, kernel="triton"), splitk) and calls == []  # unset: today's kernel
    monkeypatch.setenv(quant_gemv.ENV_KERNEL, "splitk")
    assert torch.equal(weight_only(x, qw, kernel="triton"), splitk) and calls == []
    monkeypatch.setenv(quant_gemv.ENV_KERNEL, "gemv")
    assert close(weight_only(x, qw, kernel="triton"), x, qw.dequantize()) and calls == [5]
    weight_only(rows(9, qw.shape[1]), qw, kernel="triton")  # 9 rows: past GEMV_ROWS, the split-K kernel
    weight_only(x, qw, kernel="bitwise")  # the bitwise mode never takes the GEMV
    weight_only(x, qw)  # CPU "auto": the reference
    assert calls == [5]
    monkeypatch.delenv(quant_gemv.ENV_KERNEL)
    weight_only(x[:2], qw, kernel="gemv")  # forced
    assert calls == [5, 2]


def test_bad_environment_values_are_named(interpret, monkeypatch):
    qw = quantized("gptq", seed=16)
    x = rows(1, qw.shape[1])
    monkeypatch.setenv(quant_gemv.ENV_KERNEL, "fast")
    with pytest.raises(ValueError, match="SPECDEC_QUANT_KERNEL must be one of splitk, gemv, got 'fast'"):
        weight_only(x, qw, kernel="triton")
    monkeypatch.setenv(quant_gemv.ENV_KERNEL, "gemv")
    monkeypatch.setenv(quant_gemv.ENV_LAYOUT, "KN")
    with pytest.raises(ValueError, match="SPECDEC_INT4_LAYOUT must be one of nk, kn, got 'KN'"):
        weight_only(x, qw, kernel="triton")
    monkeypatch.setenv(quant_gemv.ENV_LAYOUT, "kn")
    assert close(weight_only(x, qw, kernel="triton"), x, qw.dequantize())
    assert torch.equal(quant_gemv._KN_WORDS[qw], qw.qweight.t())  # (the transposed copy, kept beside the weight)
    with pytest.raises(ValueError, match="1–8 rows"):
        gemv(rows(9, qw.shape[1]), qw)
    with pytest.raises(ValueError, match="layout must be one of nk, kn"):
        gemv(x, qw, layout="row")
    monkeypatch.setenv(quant_gemv.ENV_LAYOUT, "nkk")  # (an FP8 weight reads the variable too)
    with pytest.raises(ValueError, match="SPECDEC_INT4_LAYOUT"):
        gemv(rows(1, 200), quantized("fp8"))


def test_configs_and_their_choices():
    with pytest.raises(ValueError, match="variant"):
        GemvConfig(variant="wgmma")
    with pytest.raises(ValueError, match="block_n"):
        GemvConfig(block_n=48)
    eight_b = {(4096, 4096): "square", (14336, 4096): "wide", (4096, 14336): "deep", (128256, 4096): "head"}
    assert {nk: shape_class(*nk) for nk in eight_b} == eight_b
    assert pick_gemv_config("fp8_block", 4096, 4096, 1).block_k <= 128
    assert pick_gemv_config("int4", 4096, 4096, 1, group=64).block_k == 64
    assert pick_gemv_config("fp8", 77, 40, 3).block_k == 64  # (K's next power of two)
    config = GemvConfig(block_n=64, block_k=128)
    for (n, k), m in ((nk, m) for nk in eight_b for m in (1, 4, 8)):
        split = plan_split(config, n, k, m, n * k // 2)
        assert split >= 1 and k // split >= 2 * 128 or split == 1
        assert split == 1 or split * m * n * 4 <= n * k // 2 / 8  # (the fp32 partials: ≤ 1/8 of the weight)
    assert plan_split(dataclasses.replace(config, split_k=5), 4096, 4096, 1, 1) == 5


COMPILE = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from specdec.fast.kernels import quant_gemv_triton as g

    names = list(g._gemv_kernel.arg_names)
    for fmt, dot, magic, prefetch, split, m_pad in ((0, False, 3, True, 2, 8), (0, True, 1, False, 1, 16),
                                                    (1, False, 0, True, 1, 1), (1, False, 0, False, 1, 4),
                                                    (2, True, 0, True, 2, 16)):
        sig = dict(x_ptr="*bf16", q_ptr="*i32" if fmt == 0 else "*fp8e4nv", z_ptr="*u8", s_ptr="*fp32",
                   b_ptr="*bf16", r_ptr="*bf16", o_ptr="*bf16", p_ptr="*fp32", c_ptr="*i32", M="i32", N="i32",
                   K="i32", k_per_split="i32", stride_xm="i32", stride_qn="i32", stride_qk="i32", stride_s="i32",
                   stride_rm="i32", stride_om="i32")
        consts = dict(FORMAT=fmt, GROUP=128, SPLIT=split, DOT=dot, MAGIC=magic, IEEE=False, PREFETCH=prefetch,
                      STAGES=3, EVEN_K=fmt != 1, HAS_BIAS=True, HAS_RES=True, M_PAD=m_pad, BLOCK_N=64, BLOCK_K=128)
        full = {**sig, **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=g._gemv_kernel, signature={n: full[n] for n in names}, constexprs=consts)
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
    print("compiled")
''')


def test_kernel_variants_compile_for_sm90():
    """What only the compiler sees (layouts of the unpack, the split x and the dot, types merged across branches):
    int4 FMA of 8 rows and dot, FP8 per channel (odd K) FMA of one row and of four, FP8 128-blocks through the dot,
    each lowered to an sm_90 cubin."""
    triton = pytest.importorskip("triton")
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 3):
        pytest.skip("the ASTSource signature format used here is Triton >= 3.3")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas next to Triton")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
