"""`fast.hf_attention.extras_attention`: without extras it is the engine's reference attention over the same mask;
attention sinks are one more key whose logit is the sink and whose value is zero; an ALiBi bias is an additive
per-head, per-slot term (a constant per query changes nothing); bad shapes are refused by name."""

from __future__ import annotations

import pytest
import torch

from specdec.fast.hf_attention import extras_attention
from specdec.fast.kernels.attention import slot_attention_bias, slot_attention_reference

B, K, H, HKV, D, S = 2, 3, 4, 2, 8, 12


@pytest.fixture
def inputs():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, K, H, D, generator=gen)
    keys, values = torch.randn(B, HKV, S, D, generator=gen), torch.randn(B, HKV, S, D, generator=gen)
    positions = torch.tensor([[4, 5, 6], [8, 9, 10]])
    return q, keys, values, positions


def test_without_extras_it_is_the_reference(inputs):
    q, keys, values, positions = inputs
    for window in (None, 3):
        mask = slot_attention_bias(positions, S, 1, torch.float32, window)
        want = slot_attention_reference(q, keys, values, positions, 0.3, window=window)
        torch.testing.assert_close(extras_attention(q, keys, values, mask, 0.3), want, atol=1e-5, rtol=1e-5)


def test_sinks_are_a_key_with_a_zero_value(inputs):
    """Sink logit s_h in each denominator = one more slot (visible to every query) with score s_h, value 0."""
    q, keys, values, positions = inputs
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    mask = slot_attention_bias(positions, S, 1, torch.float32)
    ours = extras_attention(q, keys, values, mask, 0.3, sinks=sinks)
    # by hand: the scores over the S slots and a sink column, one softmax, the values with a zero row appended
    k_rep, v_rep = keys.repeat_interleave(H // HKV, 1), values.repeat_interleave(H // HKV, 1)
    scores = torch.einsum("bkhd,bhsd->bhks", q, k_rep) * 0.3 + mask
    scores = torch.cat([scores, sinks[None, :, None, None].expand(B, H, K, 1)], dim=-1)
    v_ext = torch.cat([v_rep, torch.zeros(B, H, 1, D)], dim=2)
    want = torch.einsum("bhks,bhsd->bkhd", scores.softmax(-1), v_ext)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, extras_attention(q, keys, values, mask, 0.3), atol=1e-3)  # (the sinks matter)


def test_alibi_is_additive_and_shift_invariant(inputs):
    q, keys, values, positions = inputs
    mask = slot_attention_bias(positions, S, 1, torch.float32)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    alibi = slopes[:, None] * torch.arange(S)
    ours = extras_attention(q, keys, values, mask, 0.3, alibi=alibi)
    torch.testing.assert_close(extras_attention(q, keys, values, mask, 0.3, alibi=alibi - 7.0), ours,
                               atol=1e-5, rtol=1e-5)
    k_rep, v_rep = keys.repeat_interleave(H // HKV, 1), values.repeat_interleave(H // HKV, 1)
    scores = torch.einsum("bkhd,bhsd->bhks", q, k_rep) * 0.3 + alibi[None, :, None, :] + mask
    torch.testing.assert_close(ours, torch.einsum("bhks,bhsd->bkhd", scores.softmax(-1), v_rep), atol=1e-5,
                               rtol=1e-5)
    assert not torch.allclose(ours, extras_attention(q, keys, values, mask, 0.3), atol=1e-3)


def test_bad_shapes_are_refused(inputs):
    q, keys, values, positions = inputs
    mask = slot_attention_bias(positions, S, 1, torch.float32)
    with pytest.raises(ValueError, match="alibi must be"):
        extras_attention(q, keys, values, mask, None, alibi=torch.zeros(H, S - 1))
    with pytest.raises(ValueError, match="sinks must be"):
        extras_attention(q, keys, values, mask, None, sinks=torch.zeros(H + 1))
    with pytest.raises(ValueError, match="mask must be"):
        extras_attention(q, keys, values, mask[:, :, :1], None)
