"""`draft=` (specdec.load) and `drafter=` (specdec.generate / stream) are type-checked at the call, before any
weight is read (issue 35, item 5: `load(target, draft=42)` used to load, warn, and fail at the first generate)."""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.loading
from specdec.drafters.protocol import check_drafter_argument


@pytest.mark.parametrize("bad", [42, 4.5, True, {"model": "x"}, [1, 2], object()])
def test_load_refuses_a_draft_of_the_wrong_kind_before_loading(monkeypatch, bad):
    def no_loading(*args, **kwargs):
        raise AssertionError("load_model was called")

    monkeypatch.setattr(specdec.loading, "load_model", no_loading)
    with pytest.raises(TypeError, match=rf"^draft must be None, a checkpoint folder .*; got {type(bad).__name__}"):
        specdec.load("no/such/target", draft=bad)


@pytest.mark.parametrize("bad", [42, "x".encode(), {"drafter": 1}])
def test_generate_and_stream_refuse_a_drafter_of_the_wrong_kind(llama, bad):
    for call in (specdec.generate, specdec.stream):
        with pytest.raises(TypeError, match=rf"^drafter must be None, .*; got {type(bad).__name__}"):
            call(llama, torch.tensor([[1, 2, 3]]), drafter=bad, max_new_tokens=2)


def test_every_kind_a_runner_takes_passes(llama):  # the negative control
    from specdec.drafters.tree import TreeModelDrafter

    for ok in (None, "prompt-lookup", "ngram", "some/folder", llama, specdec.PromptLookupDrafter(),
               specdec.NGramDrafter(2), TreeModelDrafter(llama)):
        assert check_drafter_argument(ok, "draft") is ok
    out = specdec.generate(llama, torch.tensor([[1, 2, 3]]), drafter=specdec.PromptLookupDrafter(), max_new_tokens=2)
    assert len(out.sequences[0]) == 2
