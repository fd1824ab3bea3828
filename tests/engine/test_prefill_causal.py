"""An admission's first prefill chunk over fresh rows attends causally with no mask
(`kernels.attention.causal_prefix_attention`, `FastLlama.forward(causal_prefix=True)`): `slots.prefill_rows` takes it
exactly there — first chunk, every row fed from 0 — and writes what the masked path writes (cache, features, the
next forward's logits), over a cache full of a previous occupant's leftovers; and the engine's SDPA never takes cuDNN
(a plan built per new admission shape: BENCHMARKS, round 6)."""

import pytest
import torch
from torch.nn.attention import SDPBackend

import specdec.engine.slots as slots_module
import specdec.fast.layers as layers_module
from specdec.engine.slots import SlotCache, SlotState, positions_bucket, prefill_rows
from specdec.fast.kernels.attention import SDPA_BACKENDS
from specdec.fast.model import FastLlama, LlamaShape

SHAPE = LlamaShape(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64,
                   max_positions=512)
ROWS, ENDS, CHUNK = slice(1, 4), [5, 70, 37], 32  # row 2: three chunks; the first chunk is the only causal one


@pytest.fixture(scope="module")
def model():
    return FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.2, seed=3)


def _run(model, monkeypatch, *, masked: bool, starts=(0, 0, 0)):
    calls = []
    real = layers_module.causal_prefix_attention
    monkeypatch.setattr(layers_module, "causal_prefix_attention", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    if masked:  # the chunk body with causal off: every chunk through the mask
        body = slots_module._prefill_chunk
        monkeypatch.setattr(slots_module, "_prefill_chunk", lambda *a: body(*a[:8], False, a[9]))
    gen = torch.Generator().manual_seed(0)
    state = SlotState(5, 320, torch.device("cpu"))
    state.tokens.copy_(torch.randint(0, SHAPE.vocab_size, state.tokens.shape, generator=gen))
    state.enable_features(SHAPE.dim, torch.float32)
    cache = SlotCache(model, 5, 300)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))  # leftovers past every row's text
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    with torch.inference_mode():
        prefill_rows(model, cache, state, ROWS, list(starts), ENDS, CHUNK, features=state.features, extent=0)
        view = cache.view(ROWS, positions_bucket(max(ENDS) + 1, cache.num_positions))
        view.lengths.copy_(torch.tensor(ENDS))
        logits = model(state.tokens[ROWS].gather(1, torch.tensor(ENDS)[:, None]), view, kernels="reference")
    monkeypatch.undo()
    return cache, state.features, logits, calls


def test_the_first_chunk_of_fresh_rows_is_causal_and_writes_what_the_mask_writes(model, monkeypatch):
    cache, features, logits, calls = _run(model, monkeypatch, masked=False)
    assert calls == [torch.Size([3, CHUNK, 4, 8])] * SHAPE.n_layers  # the first chunk only, every layer
    ref_cache, ref_features, ref_logits, ref_calls = _run(model, monkeypatch, masked=True)
    assert ref_calls == []
    for i, end in enumerate(ENDS):
        slot = ROWS.start + i
        torch.testing.assert_close(cache.keys[:, slot, :, :end], ref_cache.keys[:, slot, :, :end], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cache.values[:, slot, :, :end], ref_cache.values[:, slot, :, :end], rtol=1e-5,
                                   atol=1e-6)
        torch.testing.assert_close(features[slot, : end], ref_features[slot, : end], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


def test_rows_fed_from_an_offset_take_the_mask(model, monkeypatch):
    *_, calls = _run(model, monkeypatch, masked=False, starts=(0, 4, 0))  # (a catch-up's rows: not fresh)
    assert calls == []


def test_the_engines_sdpa_never_takes_cudnn():
    assert SDPBackend.CUDNN_ATTENTION not in SDPA_BACKENDS and SDPBackend.MATH in SDPA_BACKENDS


def test_negative_control_attention_that_sees_the_future_is_caught(model, monkeypatch):
    """The comparison above can fail: a first chunk attending over all its slots (not causal) writes other entries."""
    _, _, logits, _ = _run(model, monkeypatch, masked=True)
    wide = lambda q, k, v, scale=None: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.transpose(1, 2), *(t[:, :, : q.shape[1]].repeat_interleave(q.shape[2] // t.shape[1], 1) for t in (k, v)),
        scale=scale).transpose(1, 2)
    monkeypatch.setattr(layers_module, "causal_prefix_attention", wide)
    _, _, seeing, calls = _run(model, monkeypatch, masked=False)
    assert calls and not torch.allclose(seeing, logits, rtol=1e-3, atol=1e-3)
