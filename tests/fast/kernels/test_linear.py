"""The few-row linear kernel against its eager reference: Triton's interpreter on CPU (fp32, tiny shapes),
bf16 on CUDA."""

import pytest
import torch

from specdec.fast.kernels.linear import CONFIGS, LinearConfig, linear, linear_reference, pick_config

triton = pytest.importorskip("triton")

# fp32 checks of the kernel's logic: in Triton's interpreter on CPU (conftest sets TRITON_INTERPRET=1 there),
# compiled (IEEE fp32 dot) on a GPU machine.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def inputs(m, n, k, *, bias, residual, seed=0, dtype=torch.float32, device=DEV, lead=None):
    g = torch.Generator().manual_seed(seed)
    shape = (m,) if lead is None else lead

    def rnd(*s):
        return torch.randn(*s, generator=g).to(device=device, dtype=dtype)

    x, w = rnd(*shape, k), rnd(n, k) / k ** 0.5
    return x, w, rnd(n) if bias else None, rnd(*shape, n) if residual else None


# Small tiles so that the tiny shapes still span several programs and K tiles; N = 40 and K = 80 are not
# multiples of block_n = 16 / block_k = 32 (masked tails), K = 72 is not even a multiple of 16; K = 160 is, but
# its slices are not (the last slice's second tile lies past K).
SMALL = dict(block_n=16, block_k=32, num_warps=4, num_stages=2)


@pytest.mark.parametrize("m", [1, 2, 5, 9, 16])
def test_dot_variant_matches_reference_in_interpreter(m):
    for (n, k), split, bias, residual in [((40, 80), 1, False, False), ((40, 80), 3, True, True),
                                          ((24, 72), 1, True, False), ((24, 72), 2, False, True),
                                          ((40, 160), 3, False, True)]:  # K = 5 tiles in slices of 2: one overruns
        x, w, b, r = inputs(m, n, k, bias=bias, residual=residual, seed=m)
        got = linear(x, w, b, residual=r, kernel="triton", config=LinearConfig("dot", split_k=split, **SMALL))
        want = linear_reference(x, w, b, residual=r)
        assert got.shape == want.shape == (m, n) and got.dtype == x.dtype
        assert rel_err(got, want) < 1e-5, (n, k, split, bias, residual)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_fma_variant_matches_reference_in_interpreter(m):
    for split, bias, residual in [(1, True, True), (2, False, False)]:
        x, w, b, r = inputs(m, 40, 80, bias=bias, residual=residual, seed=10 + m)
        got = linear(x, w, b, residual=r, kernel="triton", config=LinearConfig("fma", split_k=split, **SMALL))
        assert rel_err(got, linear_reference(x, w, b, residual=r)) < 1e-5


def test_split_reductions_fused_and_kernel_give_the_same_bits():
    x, w, b, r = inputs(5, 40, 96, bias=True, residual=True, seed=3)
    config = LinearConfig("dot", split_k=3, **SMALL)
    fused = linear(x, w, b, residual=r, kernel="triton", config=config, split_reduce="fused")
    assert torch.equal(fused, linear(x, w, b, residual=r, kernel="triton", config=config, split_reduce="kernel"))
    assert rel_err(fused, linear_reference(x, w, b, residual=r)) < 1e-5
    # The fused path leaves its arrival counters at zero for the next launch.
    from specdec.fast.kernels._splitk_triton import _COUNTERS
    assert not _COUNTERS[x.device].any()
    assert torch.equal(fused, linear(x, w, b, residual=r, kernel="triton", config=config))


def test_leading_dims_out_aliasing_residual_and_strided_x():
    x, w, b, r = inputs(0, 40, 64, bias=True, residual=True, lead=(2, 3))
    want = linear_reference(x, w, b, residual=r)
    got = linear(x, w, b, residual=r, out=r, kernel="triton", split_k=2)  # in place, as the model's addmm_
    assert got is r and got.shape == (2, 3, 40) and rel_err(got, want) < 1e-5
    wide = torch.randn(4, 128, device=DEV)
    x_view = wide[:, ::2]  # K stride 2
    assert rel_err(linear(x_view, w, kernel="triton", split_k=1), linear_reference(x_view, w)) < 1e-5


def test_auto_on_cpu_is_the_reference():
    x, w, b, r = inputs(3, 40, 64, bias=True, residual=True, device="cpu")
    assert torch.equal(linear(x, w, b, residual=r), linear_reference(x, w, b, residual=r))
    assert torch.equal(linear(x, w, kernel="reference"), torch.nn.functional.linear(x, w))


def test_pick_config_table_then_heuristic(monkeypatch):
    monkeypatch.setattr("specdec.fast.kernels.linear.CONFIGS", {})  # the heuristic alone (the shipped table aside)
    import specdec.fast.kernels.linear as linear_module

    CONFIGS = linear_module.CONFIGS
    # Heuristic: few column blocks → K split until ≥ 2 programs per SM, slices ≥ 2 tiles deep.
    small = pick_config(1, 1024, 1024, num_sms=132)
    assert small.split_k > 1 and 1024 // small.split_k >= 2 * small.block_k
    assert -(-1024 // small.block_n) * small.split_k >= 132
    wide = pick_config(1, 128256, 4096, num_sms=132)
    assert wide.split_k == 1 and wide.block_n == 64
    monkeypatch.setitem(CONFIGS, (5, 1024, 1024), ("fma", 32, 256, 4, 8, 3))
    assert pick_config(3, 1024, 1024) == LinearConfig("fma", 32, 256, 4, 8, 3)  # M = 3 uses bucket 5
    assert pick_config(1, 1024, 1024) == small


def test_errors_name_the_argument():
    x, w, _, _ = inputs(2, 8, 16, bias=False, residual=False, device="cpu")
    with pytest.raises(ValueError, match="kernel"):
        linear(x, w, kernel="cublas")
    with pytest.raises(ValueError, match="K"):
        linear(x, torch.randn(8, 17))
    with pytest.raises(TypeError, match="weight"):
        linear(x, w.double())
    with pytest.raises(ValueError, match="bias"):
        linear(x, w, torch.randn(9))
    with pytest.raises(ValueError, match="residual"):
        linear(x, w, residual=torch.randn(2, 9))
    with pytest.raises(ValueError, match="split_k"):
        linear(x, w, kernel="triton", split_k=0)
    with pytest.raises(ValueError, match="split_reduce"):
        linear(x, w, kernel="triton", split_reduce="atomic")


# ----------------------------------------------------------------------------------------------- CUDA
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# (N, K) of the zoo target's and an 8B Llama's projections (lm_heads cut to keep the test quick).
REAL_SHAPES = [(3072, 1024), (1024, 1024), (5632, 1024), (1024, 2816), (8192, 1024),
               (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (32000, 4096)]


@pytest.mark.parametrize("n,k", REAL_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16])
@pytest.mark.gpu
@needs_cuda
def test_bf16_on_cuda_matches_reference(m, n, k):
    x, w, b, r = inputs(m, n, k, bias=True, residual=True, dtype=torch.bfloat16, device="cuda")
    want = linear_reference(x.float(), w.float(), b.float(), residual=r.float())
    for residual in (None, r):
        ref = want if residual is not None else want - r.float()
        for split in (None, 1, 4):
            got = linear(x, w, b, residual=residual, kernel="triton", split_k=split)
            assert got.dtype == torch.bfloat16 and rel_err(got, ref) <= 1e-2, (split, residual is not None)
    assert rel_err(linear(x, w, b, residual=r), want) <= 1e-2  # auto takes the kernel here
    inplace = r.clone()
    assert linear(x, w, b, residual=inplace, out=inplace) is inplace  # the model's x.addmm_(...) form
    assert rel_err(inplace, want) <= 1e-2


@pytest.mark.parametrize("m", [1, 5, 9])
@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_equals_eager_and_split_k_is_deterministic(m, monkeypatch):
    x, w, b, r = inputs(m, 1024, 2816, bias=False, residual=True, dtype=torch.bfloat16, device="cuda")
    config = LinearConfig("dot", 32, 128, 8, 4, 4)
    eager = linear(x, w, residual=r, config=config)
    for _ in range(20):  # fixed-order split-K sum: bitwise repeatable, whichever slice finishes last
        assert torch.equal(eager, linear(x, w, residual=r, config=config))
    assert torch.equal(eager, linear(x, w, residual=r, config=config, split_reduce="kernel"))
    from specdec.fast.kernels import _splitk_triton
    for counters_ready in (True, False):  # without counters (first use inside a capture): the two-kernel reduce
        if not counters_ready:
            monkeypatch.setattr(_splitk_triton, "_COUNTERS", {})
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = linear(x, w, residual=r, config=config)
        assert (x.device in _splitk_triton._COUNTERS) == counters_ready
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)


@pytest.mark.gpu
@needs_cuda
def test_auto_refuses_to_the_reference_on_cuda():
    for m, k, dtype in [(17, 64, torch.bfloat16), (2, 72, torch.bfloat16), (2, 64, torch.float32)]:
        x, w, _, _ = inputs(m, 64, k, bias=False, residual=False, dtype=dtype, device="cuda")
        assert torch.equal(linear(x, w), linear_reference(x, w))

