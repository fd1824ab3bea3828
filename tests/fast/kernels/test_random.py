"""The Triton draws of `specdec.rng` have the reference's exact bits (interpreter on CPU; real sizes and CUDA
graphs on GPU), and the fused race picks the reference's token."""

import pytest
import torch

import specdec
from specdec import rng
from specdec.fast.kernels import random

pytest.importorskip("triton")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = [pytest.mark.gpu, CUDA]
SEEDS = torch.tensor([0, 1, 2**31 + 7, 2**32, 2**32 + 5, 2**62 + 12345, 2**63 - 1])
POSITIONS = torch.tensor([0, 1, 5, 2**30 - 1, 2**30, 2**30 + 3, 2**31, 2**32 + 9, 2**40 + 1, 2**46 - 1])


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def _coordinates(device, n=3):
    """Every seed at n positions (chosen so rows see the large positions), int64 on `device`."""
    g = torch.Generator().manual_seed(len(SEEDS) * n)
    pick = torch.randint(len(POSITIONS), (len(SEEDS), n), generator=g)
    pick[:, 0] = torch.arange(len(SEEDS)) % len(POSITIONS)
    return SEEDS.to(device), POSITIONS[pick].to(device)


@pytest.mark.parametrize("stream", [rng.DRAFT, rng.ACCEPT, rng.NEXT])
@pytest.mark.parametrize("size", [1, 37, 1025])
def test_exponentials_bits_equal_reference(stream, size):
    seed, position = _coordinates("cpu")
    ref = rng.exponentials(seed, position, stream, size, kernel="reference")
    out = rng.exponentials(seed, position, stream, size, kernel="triton")  # the dispatch path
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.equal(_bits(out), _bits(ref))


@pytest.mark.parametrize("stream", [rng.DRAFT, rng.ACCEPT, rng.NEXT])
def test_uniforms_bits_equal_reference_with_broadcast_positions(stream):
    seed, position = _coordinates("cpu", n=4)
    shared = position[:1].expand(len(seed), -1)  # stride 0 over rows, as the engine's tests pass them
    for pos in (position, shared, position[:, 1:]):
        ref = rng.uniforms(seed, pos, stream, kernel="reference")
        assert torch.equal(_bits(rng.uniforms(seed, pos, stream, kernel="triton")), _bits(ref))


def test_neg_log_unit_matches_reference_on_a_sweep_of_units():
    k = torch.arange(0, 1 << 23, 4099, dtype=torch.long)
    k = torch.cat([k, torch.tensor([1, 2, (1 << 23) - 2, (1 << 23) - 1])])
    bits = (k << 9) | (k % 512)  # the low 9 bits are dropped
    assert torch.equal(_bits(random.neg_log_unit(bits)), _bits(rng._neg_log(rng._to_unit(bits))))


def _race_probs(rows, size, dtype=torch.float32):
    """Random rows; from 4 rows on, the first four are edge cases: all zeros, one-hot, NaNs, few equal values."""
    g = torch.Generator().manual_seed(rows * size)
    probs = torch.softmax(torch.randn(rows, size, generator=g) * 3, -1)
    if rows > 3:
        probs[0] = 0.0
        probs[1] = 0.0
        probs[1, size // 2] = 1.0
        probs[2, [size // 3, size - 1]] = float("nan")
        probs[3] = (probs[3] * 4).round() / 4  # mostly zero, a few equal values
    return probs.to(dtype)


@pytest.mark.parametrize("rows, size", [(5, 37), (5, 3000)])
def test_race_picks_the_reference_token(rows, size):
    probs = _race_probs(rows, size)
    seed = (torch.arange(rows) * 2654435761 + 2**33) % 2**63
    position = (torch.arange(rows) * 3 + 2**30 - 2) * (torch.arange(rows) % 2 + 1)
    splits, _ = random.race_splits(rows, size)
    assert (splits > 1) == (size == 3000)  # both launch shapes are covered
    for stream in (rng.DRAFT, rng.NEXT):
        ref = rng.sample(probs, seed, position, stream, kernel="reference")
        assert torch.equal(rng.sample(probs, seed, position, stream, kernel="triton"), ref)
    assert ref[0] == 0 and ref[1] == size // 2 and ref[2] == size // 3


def test_race_reads_low_precision_and_strided_probs():
    probs = _race_probs(4, 300, torch.bfloat16)
    wide = torch.zeros(4, 400, dtype=torch.bfloat16)
    wide[:, :300] = probs
    seed, position = torch.arange(4) + 11, torch.arange(4) * 5
    ref = rng.sample(probs, seed, position, rng.DRAFT, kernel="reference")
    assert torch.equal(rng.sample(wide[:, :300], seed, position, rng.DRAFT, kernel="triton"), ref)


def test_engine_with_the_kernels_matches_the_reference(make_llama, monkeypatch):
    """The engine's draws (draft race, accept uniforms, next-token noise) through the Triton path."""
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    kw = dict(drafter=draft, max_new_tokens=5, temperature=1.0, num_draft_tokens=2, seed=3, eos_token_id=[],
              engine="fast")
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    runs = []
    for kernel in ("reference", "triton"):
        monkeypatch.setattr(rng, "KERNEL", kernel)
        runs.append(specdec.generate(target, prompts, **kw).sequences)
    assert runs[0] == runs[1]


# ---- CUDA: real sizes, every unit value, CUDA graphs --------------------------------------------------------


@pytest.mark.parametrize("rows, size", [(1, 128256), (64, 8192), (64, 128256)])
@pytest.mark.gpu
@CUDA
def test_cuda_bits_equal_reference_at_real_sizes(rows, size):
    seed = torch.randint(0, 2**63 - 1, (rows,), device="cuda")
    position = torch.randint(0, 2**34, (rows, 2), device="cuda")
    for stream in (rng.DRAFT, rng.NEXT):
        ref = rng.exponentials(seed, position, stream, size, kernel="reference")
        assert torch.equal(_bits(rng.exponentials(seed, position, stream, size)), _bits(ref))
        assert torch.equal(_bits(rng.uniforms(seed, position, stream)),
                           _bits(rng.uniforms(seed, position, stream, kernel="reference")))
        probs = _race_probs(rows, size).cuda()
        assert torch.equal(rng.sample(probs, seed, position[:, 0], stream),
                           rng.sample(probs, seed, position[:, 0], stream, kernel="reference"))


@pytest.mark.gpu
@CUDA
def test_cuda_every_unit_value_has_the_reference_exponential():
    k = torch.arange(1 << 23, device="cuda", dtype=torch.long)
    bits = k << 9
    assert torch.equal(_bits(random.neg_log_unit(bits)), _bits(rng._neg_log(rng._to_unit(bits))))
    assert torch.equal(rng._neg_log(rng._to_unit(bits)).cpu(), rng._neg_log(rng._to_unit(bits.cpu())))


@pytest.mark.gpu
@CUDA
def test_cuda_graph_replays_draw_the_new_coordinates():
    rows, size = 8, 8192
    seed = torch.zeros(rows, dtype=torch.long, device="cuda")
    position = torch.zeros(rows, dtype=torch.long, device="cuda")
    probs = torch.softmax(torch.randn(rows, size, device="cuda") * 2, -1)

    def draw():
        return (rng.exponentials(seed, position[:, None], rng.NEXT, size),
                rng.uniforms(seed, position[:, None], rng.ACCEPT), rng.sample(probs, seed, position, rng.DRAFT))

    draw()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = draw()
    for i in range(3):
        seed.copy_(torch.randint(0, 2**62, (rows,)))
        position.copy_(torch.randint(0, 2**33, (rows,)) + i)
        graph.replay()
        refs = (rng.exponentials(seed, position[:, None], rng.NEXT, size, kernel="reference"),
                rng.uniforms(seed, position[:, None], rng.ACCEPT, kernel="reference"),
                rng.sample(probs, seed, position, rng.DRAFT, kernel="reference"))
        for out, ref in zip(outs, refs):
            assert torch.equal(out, ref)
