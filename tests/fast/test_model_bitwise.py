"""`FastLlama.bitwise`: a position's logits are the same bits fed one token at a time, in a (γ+1)-token pass, in a
prefill chunk, and next to other rows of a batch — on CPU (the eager body on the invariant torch kernels) and on
the fused layer in Triton's interpreter; within round-off of the default kernels; refused where it does not hold."""

import importlib.util

import pytest
import torch

from specdec.fast.model import FastLlama, LlamaShape
from variant_kernels import patch_cpu_gemms

SHAPE = LlamaShape(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=96)
TOKENS = [5, 9, 2, 33, 17, 8, 60, 41, 3, 12, 27, 50]
CASES = [([7], 0), ([4, 9], 2), ([6, 7, 8], 3)]  # (cuts, other rows): a prefill chunk, verify-sized passes
pytestmark = pytest.mark.usefixtures("fixed_order_dot")  # the interpreter's tl.dot without the host's BLAS


def model(kernels: str, bitwise: bool = True) -> FastLlama:
    m = FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.1, kernels=kernels)
    m.bitwise = bitwise
    return m


def one_at_a_time(m: FastLlama, tokens: list[int]) -> torch.Tensor:
    cache = m.new_cache(1, 32)
    return torch.cat([m(torch.tensor([[t]]), cache) for t in tokens], 1)[0]  # [T, V]


def in_passes(m: FastLlama, tokens: list[int], cuts: list[int], others: int = 0) -> torch.Tensor:
    """Row 0 fed in passes cut at `cuts` (a prefill chunk, then verify-sized passes), next to `others` rows of
    other tokens."""
    gen = torch.Generator().manual_seed(len(cuts) + others)
    batch = 1 + others
    rows = torch.randint(0, SHAPE.vocab_size, (batch, len(tokens)), generator=gen)
    rows[0] = torch.tensor(tokens)
    cache = m.new_cache(batch, 32 + 16 * others)  # another cache span too
    bounds = [0, *cuts, len(tokens)]
    return torch.cat([m(rows[:, a:b], cache) for a, b in zip(bounds, bounds[1:])], 1)[0]


@pytest.mark.parametrize("kernels", ["reference", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs triton (the fused layer in the interpreter)"))])
def test_logits_are_the_same_bits_in_any_pass_and_batch(kernels):
    m = model(kernels)
    alone = one_at_a_time(m, TOKENS)
    for cuts, others in CASES:
        assert torch.equal(in_passes(m, TOKENS, cuts, others), alone), (cuts, others)
    default = one_at_a_time(model("reference", bitwise=False), TOKENS)
    torch.testing.assert_close(alone, default, rtol=1e-4, atol=1e-4)


def test_the_comparison_finds_a_row_count_dependent_gemm(monkeypatch):
    """The negative control, by construction on every host: with the default GEMMs replaced by one whose last bit
    depends on the rows in the call (`variant_kernels`), every pass-and-batch case above differs from one token at
    a time. (The host's own kernels are no control: MKL/oneDNN keep a row's bits for these shapes on some CPUs.)"""
    patch_cpu_gemms(monkeypatch)
    m = model("reference", bitwise=False)
    alone = one_at_a_time(m, TOKENS)
    assert all(not torch.equal(in_passes(m, TOKENS, cuts, others), alone) for cuts, others in CASES)


def test_bitwise_mode_does_not_use_the_default_gemms(monkeypatch):
    """The same variant GEMM does not reach the mode's invariant kernels: the bits still agree."""
    patch_cpu_gemms(monkeypatch)
    m = model("reference")
    alone = one_at_a_time(m, TOKENS)
    assert all(torch.equal(in_passes(m, TOKENS, cuts, others), alone) for cuts, others in CASES)


def test_bitwise_is_refused_outside_the_llama_body(make_gpt2):
    m = FastLlama.from_hf(make_gpt2(0))
    with pytest.raises(ValueError, match="bitwise=True covers"):
        m.bitwise = True
    with pytest.raises(TypeError, match="bitwise"):
        model("reference").bitwise = 1
