"""GrammarState (a core.processors.TokenConstraint) along a draft: the mask per position, nothing read after a
forbidden or stop token, the committed state untouched by `allowed`, `commit` = rollback to what was kept — each
checked against a fresh matcher fed the same text."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")

from specdec.constrain import Constraint, GrammarState, compile_constraint, unpack_bitmask  # noqa: E402
from specdec.constrain.state import _unpack_shifts  # noqa: E402
from specdec.core.processors import TokenConstraint  # noqa: E402

# token id → text ("" = special); EOS = 1; V = 40 > len(VOCAB): ids past the vocabulary are never allowed
VOCAB = ["", ""] + list("abc{}:\"0123456789 ,") + ["ab", "bc", "abc"]
V, EOS = 40, 1
ID = {t: i for i, t in enumerate(VOCAB) if t}


def _grammar(constraint=None):
    return compile_constraint(constraint or Constraint.regex("(ab|c)+0"), VOCAB, V, [EOS])


def _reference(grammar, prefix):
    """The allowed tokens after `prefix`, from a fresh matcher."""
    state = grammar.start(V)
    for t in prefix:
        assert state.matcher.accept_token(t)
    return state.allowed([])[0]


def test_a_grammar_is_a_constraint_spec_and_its_state_a_token_constraint():
    state = _grammar().start(V)
    assert isinstance(state, TokenConstraint) and isinstance(state, GrammarState)
    with pytest.raises(ValueError, match="grammar: compiled for 40 logits but the model has 32"):
        _grammar().start(32)


def test_each_position_is_masked_after_the_drafts_before_it():
    grammar = _grammar()
    draft = [ID["ab"], ID["c"], ID["a"], ID["b"]]
    allowed = grammar.start(V).allowed(draft)
    assert allowed.shape == (len(draft) + 1, V) and allowed.dtype == torch.bool
    for i in range(len(draft) + 1):
        assert torch.equal(allowed[i], _reference(grammar, draft[:i])), i
    assert not allowed[:, len(VOCAB):].any()  # padded ids
    assert allowed[0, ID["abc"]] and not allowed[0, ID["0"]] and allowed[2, ID["0"]]


def test_nothing_after_a_forbidden_token_is_masked():
    allowed = _grammar().start(V).allowed([ID["ab"], ID["b"], ID["c"], ID["c"]])  # "b" cannot follow "ab"
    assert not allowed[1, ID["b"]]
    assert allowed[2:].all()  # never read: the forbidden token is rejected with certainty


def test_a_stop_token_ends_the_walk():
    allowed = _grammar().start(V).allowed([ID["c"], ID["0"], EOS, ID["c"]])
    assert allowed[2].nonzero().flatten().tolist() == [EOS]  # complete: only the stop token
    assert allowed[3:].all()


def test_allowed_leaves_the_committed_state_and_masks_each_position_once():
    grammar = _grammar()
    state = grammar.start(V)
    draft = [ID["c"], ID["ab"], ID["0"]]
    growing = [state.allowed(draft[:i])[-1] for i in range(len(draft) + 1)]  # the model drafter's calls
    whole = state.allowed(draft)  # the verify pass
    assert state.mask_fills == len(draft) + 1
    for i in range(len(draft) + 1):
        assert torch.equal(growing[i], whole[i])
    other = state.allowed([ID["ab"]])  # another draft: rolled back to the common prefix (none)
    assert torch.equal(other[1], _reference(grammar, [ID["ab"]]))
    assert torch.equal(state.allowed([])[0], _reference(grammar, []))


@pytest.mark.parametrize("accepted, sampled", [(0, "ab"), (1, "abc"), (3, "c")])
def test_commit_keeps_the_matcher_at_the_committed_text(accepted, sampled):
    grammar = _grammar()
    state = grammar.start(V)
    draft = [ID["ab"], ID["c"], ID["ab"]]
    state.allowed(draft)
    committed = draft[:accepted] + [ID[sampled]]
    state.commit(committed)
    assert torch.equal(state.allowed([])[0], _reference(grammar, committed))
    assert torch.equal(state.allowed([ID["c"]])[1], _reference(grammar, committed + [ID["c"]]))


def test_commit_refuses_a_token_the_grammar_forbids():
    state = _grammar().start(V)
    state.allowed([ID["c"]])
    with pytest.raises(RuntimeError, match="grammar state out of step"):
        state.commit([ID["c"], ID["b"]])


def test_a_committed_stop_token_terminates():
    state = _grammar().start(V)
    state.commit([ID["c"], ID["0"], EOS])
    assert state.terminated
    assert state.allowed([5]).all()  # a finished row a static batch still steps: never read, never all-False


def test_unpack_bitmask():
    bits = torch.tensor([[0b101, -1]], dtype=torch.int32)
    assert unpack_bitmask(bits, 35)[0, :3].tolist() == [True, False, True] and unpack_bitmask(bits, 35)[0, 32:].all()
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (3, 5), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    expected = [[bool((int(w) >> j) & 1) for w in row for j in range(32)][:150] for row in words]
    assert unpack_bitmask(words, 150).tolist() == expected
    assert _unpack_shifts(words, 150).tolist() == expected  # the device path
    assert unpack_bitmask(words[:, 1:], 60).dtype == torch.bool  # a non-contiguous view


def test_compile_refusals_name_the_problem():
    with pytest.raises(ValueError, match="needs an EOS token id"):
        compile_constraint(Constraint.json_object(), VOCAB, V, [])
    with pytest.raises(ValueError, match="EOS token id 99 is outside"):
        compile_constraint(Constraint.json_object(), VOCAB, V, [99])
    with pytest.raises(ValueError, match="grammar: cannot be compiled"):
        compile_constraint(Constraint.grammar("root ::= undefined_rule"), VOCAB, V, [EOS])
    with pytest.raises(ValueError, match="json_schema: cannot be compiled: ") as err:
        compile_constraint(Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 2}), VOCAB, V, [EOS])
    assert ".cc:" not in str(err.value) and "Check failed" not in str(err.value)  # the engine's message, one line
    with pytest.raises(ValueError, match=r"json_schema.minimum: -1e\+30 is outside the integer range"):  # (spec.py)
        compile_constraint(Constraint.json_schema({"type": "integer", "minimum": -10 ** 30}), VOCAB, V, [EOS])
    with pytest.raises(ValueError, match="tokenizer has 24 tokens but the model's logits only 10"):
        compile_constraint(Constraint.json_object(), VOCAB, 10, [EOS])


def test_choice_and_json_object_compile_and_match():
    m = _grammar(Constraint.choice(["ab", "c0", 'a"b'])).matcher()
    assert m.accept_string("c0") and m.is_completed()
    obj = compile_constraint(Constraint.json_object(), VOCAB, V, [EOS])
    m = obj.matcher()
    assert m.accept_string('{"a": 1}') and m.is_completed()
    assert not obj.matcher().accept_string("1")  # an object, not any JSON value
