"""GrammarRows along a draft: masks per position, the cut after a forbidden or stop token, rollback to what was
committed — each checked against a fresh matcher fed the same text."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")

from specdec.constrain import Constraint, GrammarRows, compile_constraint, mask_logits, unpack_bitmask  # noqa: E402

# token id → text ("" = special); EOS = 1; V = 40 > len(VOCAB): ids past the vocabulary are never allowed
VOCAB = ["", ""] + list("abc{}:\"0123456789 ,") + ["ab", "bc", "abc"]
V, EOS = 40, 1
ID = {t: i for i, t in enumerate(VOCAB) if t}


def _grammar(constraint=None):
    return compile_constraint(constraint or Constraint.regex("(ab|c)+0"), VOCAB, V, [EOS])


def _reference_mask(grammar, prefix):
    """The allowed tokens after `prefix`, from a fresh matcher."""
    rows = GrammarRows(grammar, 1)
    for t in prefix:
        assert rows.matchers[0].accept_token(t)
    return rows.draft_mask(0, torch.zeros(1, 0, dtype=torch.long))[0]


def test_walk_gives_each_positions_mask_after_the_drafts_before_it():
    grammar = _grammar()
    draft = [ID["ab"], ID["c"], ID["a"], ID["b"]]
    rows = GrammarRows(grammar, 1)
    rows.begin(len(draft))
    allowed, lengths = rows.walk(torch.tensor([draft]), None)
    assert allowed.shape == (1, len(draft) + 1, V) and lengths.tolist() == [len(draft)]
    for i in range(len(draft) + 1):
        assert torch.equal(allowed[0, i], _reference_mask(grammar, draft[:i])), i
    assert not allowed[0, :, len(VOCAB):].any()  # padded ids
    assert allowed[0, 0, ID["abc"]] and not allowed[0, 0, ID["0"]] and allowed[0, 2, ID["0"]]


def test_a_forbidden_draft_ends_the_draft_after_itself():
    grammar = _grammar()
    draft = [ID["ab"], ID["b"], ID["c"], ID["c"]]  # "b" cannot follow "ab"
    rows = GrammarRows(grammar, 2)
    rows.begin(4)
    tokens = torch.tensor([draft, [ID["c"]] * 4])
    allowed, lengths = rows.walk(tokens, torch.tensor([4, 3]))
    assert lengths.tolist() == [2, 3]  # the forbidden token stays (rejected with certainty), nothing after it
    assert not allowed[0, 1, ID["b"]]
    assert allowed[0, 2:, :].all()  # never read
    assert rows.walked == [1, 3]


def test_a_stop_token_ends_the_draft_after_itself():
    grammar = _grammar()
    rows = GrammarRows(grammar, 1)
    rows.begin(4)
    draft = [ID["c"], ID["0"], EOS, ID["c"]]
    allowed, lengths = rows.walk(torch.tensor([draft]), None)
    assert lengths.tolist() == [3]
    assert allowed[0, 2].nonzero().flatten().tolist() == [EOS]  # complete: only the stop token


@pytest.mark.parametrize("accepted, sampled", [(0, "ab"), (1, "abc"), (3, "0")])
def test_settle_keeps_the_matcher_at_the_committed_text(accepted, sampled):
    grammar = _grammar()
    draft = [ID["ab"], ID["c"], ID["ab"]]
    rows = GrammarRows(grammar, 1)
    rows.begin(3)
    rows.walk(torch.tensor([draft]), None)
    new = torch.tensor([draft[:accepted] + [ID[sampled]] + [0] * (3 - accepted)])
    rows.settle(new, torch.tensor([accepted]), torch.tensor([accepted + 1]))
    rows.begin(0)
    committed = draft[:accepted] + [ID[sampled]]
    now = rows.draft_mask(0, torch.zeros(1, 0, dtype=torch.long))[0]
    assert torch.equal(now, _reference_mask(grammar, committed))


def test_settle_refuses_a_token_the_grammar_forbids():
    rows = GrammarRows(_grammar(), 1)
    rows.begin(1)
    rows.walk(torch.tensor([[ID["c"]]]), None)
    with pytest.raises(RuntimeError, match="grammar state out of step"):
        rows.settle(torch.tensor([[ID["c"], ID["b"]]]), torch.tensor([1]), torch.tensor([2]))


def test_masks_while_drafting_equal_the_walk_and_are_not_recomputed():
    grammar = _grammar()
    draft = torch.tensor([[ID["c"], ID["ab"], ID["0"]], [ID["ab"], ID["ab"], ID["c"]]])
    live = GrammarRows(grammar, 2)
    live.begin(3)
    during = [live.draft_mask(i, draft[:, :i]) for i in range(3)]
    allowed, lengths = live.walk(draft, None)
    fresh = GrammarRows(grammar, 2)
    fresh.begin(3)
    expected, expected_lengths = fresh.walk(draft, None)
    assert torch.equal(allowed, expected) and torch.equal(lengths, expected_lengths)
    for i in range(3):
        assert torch.equal(during[i], expected[:, i])


def test_select_rows_keeps_each_rows_own_state():
    grammar = _grammar()
    rows = GrammarRows(grammar, 3)
    for b, t in enumerate([ID["c"], ID["ab"], ID["c"]]):
        rows.matchers[b].accept_token(t)
    rows.matchers[2].accept_token(ID["0"])
    rows.select_rows(torch.tensor([2, 0]))
    got = rows.draft_mask(0, torch.zeros(2, 0, dtype=torch.long))
    assert torch.equal(got[0], _reference_mask(grammar, [ID["c"], ID["0"]]))
    assert torch.equal(got[1], _reference_mask(grammar, [ID["c"]]))


def test_mask_logits_pads_and_cuts_to_the_logits_width():
    allowed = torch.tensor([[True, False, True]])
    assert mask_logits(torch.zeros(1, 5), allowed).isinf().tolist() == [[False, True, False, True, True]]
    assert mask_logits(torch.zeros(1, 2), allowed).isinf().tolist() == [[False, True]]
    bits = torch.tensor([[0b101, -1]], dtype=torch.int32)
    assert unpack_bitmask(bits, 35)[0, :3].tolist() == [True, False, True] and unpack_bitmask(bits, 35)[0, 32:].all()


def test_compile_refusals_name_the_problem():
    with pytest.raises(ValueError, match="needs an EOS token id"):
        compile_constraint(Constraint.json_object(), VOCAB, V, [])
    with pytest.raises(ValueError, match="EOS token id 99 is outside"):
        compile_constraint(Constraint.json_object(), VOCAB, V, [99])
    with pytest.raises(ValueError, match="grammar: cannot be compiled"):
        compile_constraint(Constraint.grammar("root ::= undefined_rule"), VOCAB, V, [EOS])
    with pytest.raises(ValueError, match="tokenizer has 24 tokens but the model's logits only 10"):
        compile_constraint(Constraint.json_object(), VOCAB, 10, [EOS])


def test_choice_and_json_object_compile_and_match():
    grammar = _grammar(Constraint.choice(["ab", "c0", 'a"b']))
    rows = GrammarRows(grammar, 1)
    assert rows.matchers[0].accept_string("c0") and rows.matchers[0].is_completed()
    obj = compile_constraint(Constraint.json_object(), VOCAB, V, [EOS])
    m = obj.matcher()
    assert m.accept_string('{"a": 1}') and m.is_completed()
    assert not obj.matcher().accept_string("1")  # an object, not any JSON value
