"""The drafter protocols (`specdec.drafters.protocol`): every drafter satisfies the one its runner calls, the
engine reads a drafter's capabilities from them, and `as_drafter` takes a protocol object or refuses by name."""

import pytest
import torch

import specdec
from specdec.drafters import (CachedSlotDrafter, FeatureSlotDrafter, LoopDrafter, ModelDrafter, NGramDrafter,
                              PromptLookupDrafter, Proposal, SlotDrafter)
from specdec.drafters.protocol import as_drafter
from specdec.engine import Engine, EngineConfig
from specdec.models import as_target


def test_loop_drafters_satisfy_the_loop_protocol(llama_draft):
    for drafter in (NGramDrafter(2), PromptLookupDrafter(), ModelDrafter(llama_draft)):
        assert isinstance(drafter, LoopDrafter), type(drafter).__name__
        assert not isinstance(drafter, SlotDrafter), type(drafter).__name__  # the engine builds its own


@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_engine_finds_capabilities_from_the_protocols(llama, llama_draft, kind):
    drafter = llama_draft if kind == "model" else PromptLookupDrafter()
    engine = Engine(llama, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2,
                                                 cuda_graphs=False))
    assert isinstance(engine.drafter, SlotDrafter)
    assert not isinstance(engine.drafter, FeatureSlotDrafter)
    assert engine.drafter_cached is (kind == "model") is isinstance(engine.drafter, CachedSlotDrafter)
    assert engine.model.feature_layers is None and engine.state.features is None
    engine.add_request([1, 2, 3, 4, 5, 1, 2, 3], specdec.SamplingParams(max_new_tokens=6))
    out = []
    while engine.has_unfinished():
        out += [t for o in engine.step() for t in o.new_token_ids]
    assert len(out) == 6


class _DuckDrafter:
    """A drafter that does not subclass `Drafter`: proposes token 1 with a one-hot q."""

    vocab_size = None
    deterministic = True
    accepts_processor = False

    def begin(self, context, vocab_size):
        pass

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        return Proposal(tokens=torch.ones(context.batch_size, num_draft_tokens, dtype=torch.long))

    def commit(self, context):
        pass

    def select_rows(self, index):
        pass


def test_as_drafter_takes_a_protocol_object_and_refuses_others(llama):
    target = as_target(llama)
    duck = _DuckDrafter()
    assert as_drafter(duck, target) is duck
    assert as_drafter(None, target) is None
    result = specdec.generate(llama, [[1, 2, 3]], drafter=duck, max_new_tokens=5, temperature=0,
                              num_draft_tokens=2, engine="hf")
    plain = specdec.generate(llama, [[1, 2, 3]], max_new_tokens=5, temperature=0, engine="hf")
    assert result.sequences == plain.sequences  # exact whatever the drafts
    assert not isinstance(_NoCommit(), LoopDrafter)
    with pytest.raises(TypeError, match="drafter must be None, a transformers model or a specdec Drafter, got _NoCommit"):
        as_drafter(_NoCommit(), target)


class _NoCommit:
    """Proposes, but has no `commit`/`begin`/`select_rows`: not a `LoopDrafter`, and not a model."""

    vocab_size = None
    deterministic = True
    accepts_processor = False
    propose = _DuckDrafter.propose
