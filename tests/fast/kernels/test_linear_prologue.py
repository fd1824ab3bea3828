"""The linear kernel's prologues (RMSNorm before the product; silu(gate)·up before it) against their eager
references: Triton's interpreter on CPU (fp32, tiny shapes), bf16 on CUDA."""

import pytest
import torch

from specdec.fast.kernels.linear import LinearConfig, linear, linear_reference
from specdec.fast.kernels.mlp import silu_mul
from specdec.fast.kernels.norm import rms_norm

triton = pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(block_n=16, block_k=32, num_warps=4, num_stages=2)  # several programs and K tiles on tiny shapes


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def rnd(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(device=DEV, dtype=dtype)


@pytest.mark.parametrize("m", [1, 3, 9])
@pytest.mark.parametrize("variant, split", [("dot", 1), ("dot", 3), ("fma", 2)])
def test_norm_prologue_matches_norm_then_linear(m, variant, split):
    """K = 80 / 72 are not multiples of block_k (masked tails); the norm's 1/rms spans every K slice."""
    g = torch.Generator().manual_seed(m + split)
    for n, k in ((40, 80), (24, 72)):
        x, w, nw, r = 3 * rnd(g, m, k), rnd(g, n, k) / k ** 0.5, 1 + 0.1 * rnd(g, k), rnd(g, m, n)
        config = LinearConfig(variant, split_k=split, **SMALL)
        got = linear(x, w, residual=r, norm_weight=nw, eps=1e-5, kernel="triton", config=config)
        want = linear_reference(x, w, residual=r, norm_weight=nw, eps=1e-5)
        assert rel_err(got, want) < 1e-5, (n, k)
        # the same as the separate launches it replaces: the norm kernel, then the product
        two = linear(rms_norm(x, nw, 1e-5, kernel="triton"), w, residual=r, kernel="triton", config=config)
        assert rel_err(got, two) < 1e-5
        assert rel_err(linear_reference(x, w, residual=r), want) > 1e-2  # negative control: the norm matters


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [1, 2])
def test_gated_prologue_is_silu_mul_then_linear(m, split):
    g = torch.Generator().manual_seed(10 * m + split)
    n, k = 40, 80
    gate_up, w, r = rnd(g, m, 2 * k), rnd(g, n, k) / k ** 0.5, rnd(g, m, n)
    config = LinearConfig("dot", split_k=split, **SMALL)
    got = linear(gate_up, w, residual=r, gated=True, kernel="triton", config=config)
    assert rel_err(got, linear_reference(gate_up, w, residual=r, gated=True)) < 1e-5
    # silu·mul computed as its own kernel computes it: the same bits as the two launches
    two = linear(silu_mul(gate_up, kernel="triton"), w, residual=r, kernel="triton", config=config)
    assert torch.equal(got, two)


def test_prologue_in_place_residual_and_leading_dims():
    g = torch.Generator().manual_seed(7)
    x, w, nw = rnd(g, 2, 3, 64), rnd(g, 40, 64) / 8, 1 + 0.1 * rnd(g, 64)
    r = rnd(g, 2, 3, 40)
    want = linear_reference(x, w, residual=r, norm_weight=nw)
    got = linear(x, w, residual=r, out=r, norm_weight=nw, kernel="triton", split_k=2)
    assert got is r and rel_err(got, want) < 1e-5


def test_prologue_errors_name_the_problem():
    x, w = torch.randn(2, 64), torch.randn(40, 64)
    with pytest.raises(ValueError, match="gate|up"):
        linear(x, w, gated=True)  # x must be [.., 2K]
    with pytest.raises(ValueError, match="two different prologues"):
        linear(torch.randn(2, 128), w, gated=True, norm_weight=torch.ones(64))
    with pytest.raises(ValueError, match="norm_weight must be"):
        linear(x, w, norm_weight=torch.ones(32))
    # the reference path (CPU, kernel="auto") runs the prologue as separate ops
    nw = torch.rand(64) + 0.5
    assert torch.equal(linear(x, w, norm_weight=nw), linear_reference(x, w, norm_weight=nw))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 5, 16])
def test_bf16_prologues_on_cuda(m):
    g = torch.Generator().manual_seed(m)
    for n, k in ((6144, 4096), (1024, 1024)):
        x, w, nw = rnd(g, m, k, dtype=torch.bfloat16), (rnd(g, n, k) / k ** 0.5).bfloat16(), (1 + 0.1 * rnd(g, k)).bfloat16()
        got = linear(x, w, norm_weight=nw, kernel="triton")
        assert rel_err(got, linear_reference(x, w, norm_weight=nw)) < 1e-2
        gate_up = rnd(g, m, 2 * k, dtype=torch.bfloat16)
        got = linear(gate_up, w, gated=True, kernel="triton")
        assert torch.equal(got, linear(silu_mul(gate_up), w, kernel="triton"))


def test_model_fuse_prologues_computes_the_same_and_skips_the_launches(monkeypatch):
    """FastLlama's fused path with `fuse_prologues`: the same logits as without (and as the eager body), with no
    RMSNorm or silu·mul launch left inside the layers."""
    import specdec.fast.layers as layers
    from specdec.fast.model import FastLlama, LlamaShape

    shape = LlamaShape(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=48,
                       rope_theta=10000.0, tie_word_embeddings=False, max_positions=64)
    fast = FastLlama.random(shape, device=DEV, dtype=torch.float32, std=0.2, kernels="triton")
    with torch.no_grad():
        for p in list(fast.attn_norm) + list(fast.mlp_norm):
            p.uniform_(0.5, 1.5)
    fast.linear_kernel = "triton"
    calls = []
    for name in ("rms_norm", "silu_mul"):
        real = getattr(layers, name)
        monkeypatch.setattr(layers, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    tokens = torch.tensor([[3, 4, 5], [6, 7, 8]], device=DEV)
    outs = {}
    for fuse in (False, True):
        fast.fuse_prologues = fuse
        calls.clear()
        cache = fast.new_cache(2, 8)
        with torch.inference_mode():
            outs[fuse] = [fast(tokens[:, :2], cache), fast(tokens[:, 2:], cache)]
        assert (calls == []) == fuse, calls
    fast.kernels = "reference"
    cache = fast.new_cache(2, 8)
    with torch.inference_mode():
        ref = [fast(tokens[:, :2], cache), fast(tokens[:, 2:], cache)]
    for a, b, c in zip(outs[True], outs[False], ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)


def test_faster_shapes_needs_a_win_at_every_row_count():
    from specdec.fast.kernels.linear_choice import GemmTiming, faster_shapes, time_gemms

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
    from specdec.fast.kernels.linear_choice import time_gemms

    weights = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    t = time_gemms(weights, rows=1, reps=5)
    assert (t.n, t.k, t.weights) == (1024, 1024, 4) and t.cublas_us > 0 and t.triton_us > 0
