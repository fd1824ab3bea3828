"""`FastLlama.bitwise`: a position's logits are the same bits fed one token at a time, in a (γ+1)-token pass, in a
prefill chunk, and next to other rows of a batch — on CPU (the eager body on the invariant torch kernels) and on
the fused layer in Triton's interpreter; within round-off of the default kernels; refused where it does not hold."""

import importlib.util

import pytest
import torch

from specdec.fast.model import FastLlama, LlamaShape

SHAPE = LlamaShape(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=96)
TOKENS = [5, 9, 2, 33, 17, 8, 60, 41, 3, 12, 27, 50]


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
    for cuts, others in [([7], 0), ([4, 9], 2), ([6, 7, 8], 3)]:
        assert torch.equal(in_passes(m, TOKENS, cuts, others), alone), (cuts, others)
    default = one_at_a_time(model("reference", bitwise=False), TOKENS)
    torch.testing.assert_close(alone, default, rtol=1e-4, atol=1e-4)


def test_default_kernels_are_not_invariant_here():
    """The negative control: without the mode the same comparison finds differing bits (MKL's GEMM and SDPA
    change their summation with the number of rows)."""
    m = model("reference", bitwise=False)
    alone = one_at_a_time(m, TOKENS)
    assert any(not torch.equal(in_passes(m, TOKENS, cuts, others), alone)
               for cuts, others in [([7], 0), ([4, 9], 2), ([6, 7, 8], 3)])


def test_bitwise_is_refused_outside_the_llama_body(make_gpt2):
    m = FastLlama.from_hf(make_gpt2(0))
    with pytest.raises(ValueError, match="bitwise=True covers"):
        m.bitwise = True
    with pytest.raises(TypeError, match="bitwise"):
        model("reference").bitwise = 1
