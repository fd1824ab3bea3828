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


class _Biased(HFCausalLM):
    """A user's target: the model it wraps, with token 7's logit raised (its own `forward`)."""

    def forward(self, tokens, valid=None):
        logits = super().forward(tokens, valid)
        return logits + 100.0 * (torch.arange(logits.shape[-1]) == 7)


class _Named(HFCausalLM):
    """A user's subclass that adds a method only: the same law as the model it wraps."""

    def name(self) -> str:
        return "named"


def test_a_users_target_runs_its_own_methods_on_the_loop_never_the_model_inside(make_llama):
    """The engine runs the transformers model a specdec target wraps over its own cache: a user's target whose class
    defines a protocol method (here `forward`) takes the loop on "auto" — its own law, even after an engine was
    kept on the model inside — and engine="fast" refuses it by name, as `beam_search` and token trees do; the model itself, and a
    subclass that overrides no protocol method (the negative control), still run on the engine."""
    from specdec.decoding import route
    from specdec.engine import UnsupportedModel
    from specdec.models.protocol import own_methods

    model = make_llama(5)
    prompts = [[5, 6, 7, 8]]

    def greedy(target, engine):
        return specdec.generate(target, prompts, max_new_tokens=6, temperature=0, engine=engine).sequences

    plain = greedy(model, "auto")  # (an engine is kept on the model now)
    biased, named = _Biased(model), _Named(model)
    assert greedy(biased, "auto") == greedy(biased, "hf") == [[7] * 6] != plain
    assert own_methods(biased) == ("forward",) and own_methods(named) == () == own_methods(model)
    assert route.runner_for("auto", biased, None, 4) == "hf"
    with pytest.raises(UnsupportedModel, match="_Biased is a specdec Target whose forward its own class defines"):
        greedy(biased, "fast")
    with pytest.raises(TypeError, match="whose forward its own class defines"):
        specdec.beam_search(biased, prompts, max_new_tokens=2, num_beams=2)
    with pytest.raises(TypeError, match="whose forward its own class defines"):  # (token trees: the loop's too)
        specdec.generate(biased, prompts, make_llama(6), max_new_tokens=2, temperature=0, draft_tree=(2, 2))
    assert route.runner_for("auto", named, None, 4) == "fast" == route.runner_for("auto", model, None, 4)
    assert greedy(named, "auto") == plain == greedy(model, "auto")  # (no refusal was kept on the model inside)
