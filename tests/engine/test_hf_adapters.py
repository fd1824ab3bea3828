"""The attention adapters of `fast/hf_adapters.py` compute what their modules compute: each piece an adapter adds to
the engine's attention (GPT-NeoX-Japanese's RoPE and its last layer's output bias, Bloom's `slow_but_exact`
output projection), dropped, makes the backend's self-check refuse the model, and with the self-check off the
engine's greedy text is not transformers' (the positive cases — greedy equal to `generate` alone and under
continuous batching with a draft model — are `hf_models.MATRIX` entries, run by `test_hf_backend.py`)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

import specdec
from helpers import hf_greedy
from hf_models import BACKEND, NEW, PROMPTS, make, run
from specdec.engine import Engine, EngineConfig
from specdec.fast import hf_adapters
from specdec.fast.hf_backend import HFBackendModel, UnsupportedArchitecture

_JAPANESE = ("transformers.models.gpt_neox_japanese.modeling_gpt_neox_japanese", "GPTNeoXJapaneseAttention")


def _refused_and_wrong(monkeypatch, name: str) -> None:
    """The broken adapter (already patched in): the self-check refuses; without it the text is not transformers'."""
    target = make(name)
    with pytest.raises(UnsupportedArchitecture, match="other logits through the engine's attention"):
        HFBackendModel(target)
    monkeypatch.setattr(HFBackendModel, "_self_check", lambda self, model_type: None)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert run(engine, PROMPTS, NEW) != [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)], name


def _patch_japanese(monkeypatch, forward) -> None:
    real = hf_adapters._ADAPTERS[_JAPANESE]
    monkeypatch.setitem(hf_adapters._ADAPTERS, _JAPANESE, replace(real, forward=forward(real.forward)))


def test_the_positive_cases_are_in_the_matrix():
    from hf_models import MATRIX, REFUSED

    assert {"gpt-neox-japanese", "bloom-slow-but-exact"} <= set(MATRIX)
    assert not {"gpt-neox-japanese", "bloom-slow-but-exact"} & set(REFUSED)


def test_negative_control_gpt_neox_japanese_without_its_output_bias_fails(monkeypatch):
    """The module hands its last layer's `dense_bias` to the layer apart from its output: dropped, another text."""
    _patch_japanese(monkeypatch, lambda real: lambda module, *a, **kw: real(module, *a, **kw)[:2] + (None,))
    _refused_and_wrong(monkeypatch, "gpt-neox-japanese")


def test_negative_control_gpt_neox_japanese_without_its_rope_fails(monkeypatch):
    """RoPE on the first `rotary_ndims` of each head (half of it here): left out, another text."""
    assert make("gpt-neox-japanese").gpt_neox_japanese.layers[0].attention.rotary_ndims == 4  # (of 8)
    no_rope = SimpleNamespace(apply_rotary_pos_emb=lambda q, k, cos, sin: (q, k))
    monkeypatch.setattr(hf_adapters, "_family", lambda module: no_rope)  # (only this adapter reads it here)
    _refused_and_wrong(monkeypatch, "gpt-neox-japanese")


def test_negative_control_bloom_slow_but_exact_through_the_plain_projection_fails(monkeypatch):
    """`slow_but_exact` sums one bias-free product per slice: the plain projection (its bias added) differs."""
    monkeypatch.setattr(hf_adapters, "_bloom_dense", lambda module, context: module.dense(context))
    _refused_and_wrong(monkeypatch, "bloom-slow-but-exact")
