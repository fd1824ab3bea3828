"""Attention sinks in the slot attention (gpt-oss: one more logit per head in each softmax denominator): the Triton
split-K kernel (CPU: Triton's interpreter) equals the reference, one split and several, with a window, a token tree
and a block table; the reference equals `hf_attention.extras_attention`'s definition; dropping the sinks changes
the output (the negative control)."""

import pytest
import torch

triton = pytest.importorskip("triton")

from specdec.fast.hf_attention import extras_attention  # noqa: E402
from specdec.fast.kernels.attention import (TreeMask, slot_attention, slot_attention_bias,  # noqa: E402
                                            slot_attention_reference)

B, K, H, HKV, D, S = 2, 3, 4, 2, 16, 40
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (CPU: the interpreter; CUDA: the compiled kernel)
TOL = 1e-5 if DEVICE == "cpu" else 1e-4


@pytest.fixture(autouse=True)
def _interpreter_new_enough():
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if not torch.cuda.is_available() and version < (3, 8):
        pytest.skip(f"Triton {triton.__version__}'s interpreter; these CPU tests need triton >= 3.8")


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, K, H, D, generator=gen)
    keys, values = torch.randn(B, HKV, S, D, generator=gen), torch.randn(B, HKV, S, D, generator=gen)
    positions = torch.tensor([[0, 1, 2], [30, 31, 32]])
    sinks = torch.tensor([1.5, -0.5, 3.0, 0.0])
    return tuple(t.to(DEVICE) for t in (q, keys, values, positions, sinks))


def rel_err(out, ref) -> float:
    return float((out - ref).norm() / ref.norm())


def test_the_reference_is_the_definition():
    q, keys, values, positions, sinks = _inputs()
    mask = slot_attention_bias(positions, S, 1, torch.float32)
    want = extras_attention(q, keys, values, mask, 0.25, sinks=sinks)
    torch.testing.assert_close(slot_attention_reference(q, keys, values, positions, 0.25, sinks=sinks), want,
                               atol=1e-5, rtol=1e-5)
    assert rel_err(slot_attention_reference(q, keys, values, positions, 0.25), want) > 1e-2  # (the sinks matter)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 4])
def test_triton_matches_the_reference(num_splits, window):
    q, keys, values, positions, sinks = _inputs(num_splits)
    ref = slot_attention(q, keys, values, positions, 0.25, window=window, sinks=sinks, kernel="reference")
    out = slot_attention(q, keys, values, positions, 0.25, window=window, sinks=sinks, kernel="triton",
                         num_splits=num_splits)
    assert rel_err(out, ref) < TOL
    without = slot_attention(q, keys, values, positions, 0.25, window=window, kernel="triton", num_splits=num_splits)
    assert rel_err(without, ref) > 1e-2


def test_triton_with_a_tree_and_a_block_table():
    q, keys, values, positions, sinks = _inputs(5)
    tree = TreeMask(base=positions[:, 0].clone(), ancestors=torch.tensor([[1, 3, 5], [1, 3, 5]], device=DEVICE))
    page = 8
    pool_k = keys.transpose(1, 2).reshape(B * S // page, page, HKV, D)
    pool_v = values.transpose(1, 2).reshape(B * S // page, page, HKV, D)
    table = torch.arange(B * S // page, dtype=torch.int32, device=DEVICE).view(B, S // page)
    ref = slot_attention(q, keys, values, positions, 0.25, sinks=sinks, tree=tree, kernel="reference")
    out = slot_attention(q, pool_k, pool_v, positions, 0.25, sinks=sinks, tree=tree, kernel="triton",
                         block_table=table, num_splits=2)
    assert rel_err(out, ref) < TOL


def test_bad_sinks_are_refused():
    q, keys, values, positions, _ = _inputs()
    with pytest.raises(ValueError, match="sinks must be"):
        slot_attention(q, keys, values, positions, sinks=torch.zeros(H + 1, device=DEVICE))
