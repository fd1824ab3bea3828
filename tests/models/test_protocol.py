"""The target protocol (`specdec.models.protocol`): the adapters satisfy it, `as_target` passes a protocol
object through, wraps a transformers model, and refuses anything else by name."""

import pytest
import torch

import specdec
from specdec.models import HFCausalLM, Target, as_target


def test_adapters_are_targets_and_models_are_wrapped(llama):
    target = as_target(llama)
    assert isinstance(target, HFCausalLM) and isinstance(target, Target)
    assert as_target(target) is target
    assert not isinstance(llama, Target)  # a transformers model has no begin / crop / select_rows


class _Incomplete:
    vocab_size = 8
    device = torch.device("cpu")

    def begin(self, prompts, max_new_tokens):
        raise AssertionError("never called")

    def forward(self, tokens, valid=None):
        raise AssertionError("never called")

    def select_rows(self, index):
        raise AssertionError("never called")


def test_an_object_without_the_protocol_is_refused_by_name():
    assert not isinstance(_Incomplete(), Target)  # no crop
    with pytest.raises(TypeError, match="target must be a transformers model or a specdec target, got _Incomplete"):
        as_target(_Incomplete())
    with pytest.raises(TypeError, match="target must be"):
        specdec.generate(_Incomplete(), [[1, 2]], max_new_tokens=2, engine="hf")
