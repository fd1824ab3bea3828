"""The drafter protocols (`specdec.drafters.protocol`): every drafter satisfies the one its runner calls, every
`propose` of the family starts with `(context, num_draft_tokens)` and returns one `Proposal` record, the engine
reads a drafter's capabilities from them, and `as_drafter` takes a protocol object or refuses by name."""

import inspect

import pytest
import torch

import specdec
from specdec.drafters import (CachedSlotDrafter, FeatureSlotDrafter, LoopDrafter, ModelDrafter, NGramDrafter,
                              PromptLookupDrafter, Proposal, SlotDrafter)
from specdec.drafters.protocol import as_drafter, is_slot_drafter
from specdec.engine import Engine, EngineConfig
from specdec.models import as_target


def test_loop_drafters_satisfy_the_loop_protocol(llama_draft):
    for drafter in (NGramDrafter(2), PromptLookupDrafter(), ModelDrafter(llama_draft)):
        assert isinstance(drafter, LoopDrafter), type(drafter).__name__
    for drafter in (NGramDrafter(2), PromptLookupDrafter()):
        # a table drafter has no capability the engine looks for (`SlotDrafter` alone is only "has propose")
        assert not isinstance(drafter, (CachedSlotDrafter, FeatureSlotDrafter)), type(drafter).__name__
    # every kind is one class for both runners: the engine takes prompt lookup and the n-gram tables as they are; a
    # model drafter over the loop's cache it binds to its own state first (`ModelDrafter.with_state`)
    assert is_slot_drafter(NGramDrafter(2)) and is_slot_drafter(PromptLookupDrafter())
    assert not is_slot_drafter(ModelDrafter(llama_draft)) and not is_slot_drafter(_DuckDrafter())
    assert not is_slot_drafter(PromptLookupDrafter) and not is_slot_drafter(None)  # (a class, nothing)


def test_the_engine_runs_one_implementation_of_lookup_and_ngram(llama):
    for drafter in (PromptLookupDrafter(), NGramDrafter(2).fit([[1, 2, 3, 4]], llama.config.vocab_size)):
        engine = Engine(llama, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2,
                                                     cuda_graphs=False))
        assert engine.drafter is drafter  # passed through: no engine copy of the kind


def test_one_model_drafter_class_serves_both_runners(llama, llama_draft):
    from specdec.engine.config import UnsupportedModel

    drafter = ModelDrafter(llama_draft)
    engine = Engine(llama, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2,
                                                 cuda_graphs=False))
    # bound to the engine's state (`with_state`): the same class, the loop's instance left as it was
    assert type(engine.drafter) is ModelDrafter and engine.drafter.on_engine and not drafter.on_engine
    assert is_slot_drafter(engine.drafter) and isinstance(engine.drafter, CachedSlotDrafter)
    assert engine.drafter.state is not drafter.state and drafter.model is llama_draft

    class LoopOnlyModel(ModelDrafter):  # negative control: a subclass whose propose needs the loop's arguments
        def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None) -> Proposal:
            return super().propose(context, num_draft_tokens, sampling, generator, confidence_threshold)

    from specdec.drafters.loop_adapter import LoopOnEngine

    loop_only = Engine(llama, LoopOnlyModel(llama_draft), EngineConfig(max_batch_size=2, max_seq_len=64,
                                                                       num_draft_tokens=2, cuda_graphs=False))
    # not bound as the engine's model drafter: called through the loop's protocol, row by row (`loop_adapter`)
    assert isinstance(loop_only.drafter, LoopOnEngine) and not loop_only.drafter_cached
    with pytest.raises(UnsupportedModel, match="engine does not run object drafters"):
        Engine(llama, object(), EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2, cuda_graphs=False))


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
    stats = engine.stats  # the proposals' `forward_passes`, folded: γ model calls a speculative step, lookup none
    assert stats.num_steps > 0 and stats.drafter_calls == (2 * stats.num_steps if kind == "model" else 0), stats


def _loop_drafter_classes():
    import specdec.drafters  # noqa: F401  (every subclass that defines `propose`, wherever it lives)
    import specdec.fast.seq2seq  # noqa: F401
    import specdec.fast.target  # noqa: F401
    from specdec.drafters.base import Drafter

    found, todo = [], [Drafter]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("specdec.") and "propose" in vars(cls):
            found.append(cls)
    return found


def _engine_drafter_classes():
    from specdec.engine.feature_drafter import EngineFeatureDrafter, EngineMedusaDrafter

    return [EngineFeatureDrafter, EngineMedusaDrafter]  # (the model drafters are the loop's classes: one each)


def propose_mismatches(classes, method="propose", head=("context", "num_draft_tokens"), record="Proposal") -> list[str]:
    """The classes whose `method` does not start with `head` (after self) or is not annotated to return `record`."""
    bad = []
    for cls in classes:
        signature = inspect.signature(getattr(cls, method))
        names = tuple(signature.parameters)[1 : 1 + len(head)]
        returns = signature.return_annotation
        returns = returns if isinstance(returns, str) else getattr(returns, "__name__", str(returns))
        if names != head or returns.strip("'\"") != record:
            bad.append(f"{cls.__name__}.{method}{signature}")
    return bad


def test_every_drafter_proposes_through_one_head_and_one_record():
    loop, engine = _loop_drafter_classes(), _engine_drafter_classes()
    names = {c.__name__ for c in loop}
    assert {"Drafter", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter",
            "HierarchicalDrafter"} <= names, names
    # the model drafter's one propose: the cross-vocabulary kind maps its logits, the fast loop drafters are states
    assert not {"CrossVocabDrafter", "FastDrafter", "FastSeq2SeqDrafter"} & names, names
    assert propose_mismatches(loop + engine) == []
    from specdec.drafters.tree import TreeModelDrafter

    assert propose_mismatches([TreeModelDrafter], "propose_tree", ("context", "spec"), "TreeProposal") == []


def test_the_signature_check_reports_a_drafter_off_the_protocol():
    """Negative controls: the engine's old door (view, gamma) -> tuple, and a right head with a tuple record."""

    class OldDoor:
        def propose(self, view, gamma) -> tuple:
            return ()

    class TupleRecord:
        def propose(self, context, num_draft_tokens) -> tuple:
            return ()

    assert [m.split(".")[0] for m in propose_mismatches([OldDoor, TupleRecord])] == ["OldDoor", "TupleRecord"]


@pytest.mark.parametrize("kind", ["model", "lookup", "ngram"])
def test_an_engine_proposal_is_the_loops_record(llama, llama_draft, kind):
    from specdec.engine.drafters import Flavor, StepView

    drafter = {"model": lambda: llama_draft, "lookup": PromptLookupDrafter,
               "ngram": lambda: NGramDrafter(2).fit([[1, 2, 3, 4, 5, 1, 2, 3]], llama.config.vocab_size)}[kind]()
    engine = Engine(llama, drafter, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                 cuda_graphs=False))
    params = specdec.SamplingParams(max_new_tokens=6, temperature=0 if kind != "ngram" else 1.0, seed=0)
    engine.add_request([1, 2, 3, 4, 5, 1, 2, 3], params)
    with torch.inference_mode():
        engine._admit([])
        proposal = engine.drafter.propose(StepView(engine.state, 1, 64, Flavor.of(params)), 3)
    assert isinstance(proposal, Proposal) and proposal.tokens.shape == (1, 3)
    assert proposal.forward_passes == (3 if kind == "model" else 0)
    assert (proposal.probs is None) is (kind != "ngram")  # greedy rows and lookup: one-hot q
    if kind == "lookup":
        assert proposal.lengths.tolist() == [3] and proposal.tokens.tolist() == [[4, 5, 1]]  # copied after "1 2 3"


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


def test_an_engine_tree_proposal_is_the_loops_tree_record(llama, llama_draft):
    """The engine's token trees return the loop's `TreeProposal`; its forward passes (one per level but the
    leaves') are what the statistics fold: depth 2 → 2 drafter calls a step."""
    from specdec.drafters.protocol import TreeProposal
    from specdec.engine.drafters import Flavor, StepView
    from specdec.engine.tree_step import EngineTree, propose_tree

    engine = Engine(llama, llama_draft, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2,
                                                     cuda_graphs=False))
    params = specdec.SamplingParams(max_new_tokens=6, temperature=0, draft_tree=(2, 1))
    engine.add_request([1, 2, 3, 4, 5, 1, 2, 3], params)
    with torch.inference_mode():
        engine._admit([])
        tree = EngineTree.of(params.draft_tree, torch.device("cpu"))
        proposal = propose_tree(engine.drafter, StepView(engine.state, 1, 64, Flavor.of(params)), tree)
    assert isinstance(proposal, TreeProposal) and proposal.tokens.shape == (1, 5) and proposal.probs is None
    assert proposal.forward_passes == 2
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats
    assert stats.num_steps > 0 and stats.drafter_calls == 2 * stats.num_steps, stats
