"""The quantized CPU engine's attention (`fast/quant/attn_cpu.cpp`, `fast.quant.attention.cpu_attention`).

  the function   equal to `slot_attention`'s reference (SDPA over the cache with the mask) within float rounding, on
                 a static cache and on a paged pool through a shuffled block table, with a window and a softcap, GQA;
                 a scale 1% off (the negative control) fails the same check
  invariance     a query's output is the same bits whether it runs alone, among γ + 1 queries of its row, or beside
                 other rows; a deliberately row-count dependent variant fails the same check
  the layers     a `FastLlama` with `cpu_attention` set gives the reference's logits within rounding
"""

from __future__ import annotations

import pytest
import torch

from specdec.fast.kernels.attention import slot_attention
from specdec.fast.model import FastLlama, LlamaShape
from specdec.fast.quant.attention import cpu_attention, cpu_attention_unsupported
from specdec.fast.quant.kernel import kernel_available

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the CPU kernels did not build here")

B, K, H, HKV, D, S, BS = 2, 5, 6, 2, 64, 96, 16


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, K, H, D, generator=g)
    keys, values = torch.randn(B, HKV, S, D, generator=g), torch.randn(B, HKV, S, D, generator=g)
    positions = torch.tensor([[20, 21, 22, 23, 24], [85, 86, 87, 88, 89]])
    return q, keys, values, positions


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool((out - ref).abs().max() <= 1e-5 * ref.abs().max().clamp_min(1.0))


@pytest.mark.parametrize("window,softcap", [(None, None), (8, None), (None, 20.0), (40, 5.0)])
def test_static_cache_matches_the_reference(window, softcap):
    q, keys, values, positions = _inputs()
    ref = slot_attention(q, keys, values, positions, 0.125, window=window, softcap=softcap, kernel="reference")
    assert _close(cpu_attention(q, keys, values, positions, 0.125, window=window, softcap=softcap), ref)
    wrong = cpu_attention(q, keys, values, positions, 0.125 * 1.01, window=window, softcap=softcap)
    assert not _close(wrong, ref)  # the negative control: a scale 1% off


def test_paged_pool_matches_the_reference():
    q, _, _, positions = _inputs(1)
    g = torch.Generator().manual_seed(2)
    width, num_blocks = S // BS, 2 * (S // BS) + 1
    pool_k, pool_v = torch.randn(num_blocks, BS, HKV, D, generator=g), torch.randn(num_blocks, BS, HKV, D, generator=g)
    table = (torch.randperm(num_blocks - 1, generator=g)[: B * width] + 1).view(B, width).int()
    ref = slot_attention(q, pool_k, pool_v, positions, None, kernel="reference", block_table=table)
    assert _close(cpu_attention(q, pool_k, pool_v, positions, None, block_table=table), ref)
    shuffled = table.flip(1).contiguous()  # the negative control: another block order reads other keys
    assert not _close(cpu_attention(q, pool_k, pool_v, positions, None, block_table=shuffled), ref)


def _row_count_invariant(fn) -> bool:
    q, keys, values, positions = _inputs(3)
    whole = fn(q, keys, values, positions)
    alone = torch.cat([fn(q[:, i:i + 1], keys, values, positions[:, i:i + 1]) for i in range(K)], 1)
    row = torch.cat([fn(q[b:b + 1], keys[b:b + 1], values[b:b + 1], positions[b:b + 1]) for b in range(B)])
    return torch.equal(whole, alone) and torch.equal(whole, row)


def test_a_querys_bits_do_not_depend_on_the_others():
    assert _row_count_invariant(lambda q, k, v, p: cpu_attention(q, k, v, p, 0.125))
    assert _row_count_invariant(lambda q, k, v, p: cpu_attention(q, k, v, p, 0.125, window=8, softcap=5.0))

    def dependent(q, k, v, p):  # the negative control: the scale rounded differently when queries share a call
        return cpu_attention(q, k, v, p, 0.125 * (1 + 1e-6 * (q.shape[1] > 1)))

    assert not _row_count_invariant(dependent)


def test_what_it_does_not_take():
    q, keys, _, _ = _inputs()
    assert cpu_attention_unsupported(q, keys) is None
    assert "float32" in cpu_attention_unsupported(q.double(), keys.double())
    assert "tree" in cpu_attention_unsupported(q, keys, tree=object())


def test_a_model_with_cpu_attention_gives_the_references_logits():
    shape = LlamaShape(vocab_size=64, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, intermediate_size=256)
    model = FastLlama.random(shape, device="cpu", dtype=torch.float32, std=0.05, seed=0)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        outs = []
        for flag in (False, True):
            model.cpu_attention = flag
            cache = model.new_cache(2, 32)
            model(ids[:, :8], cache)  # a prompt of 8 tokens, then 1 and 3 new ones
            outs.append(torch.cat([model(ids[:, 8:9], cache), model(ids[:, 9:12], cache)], 1))
    assert _close(outs[1], outs[0])
