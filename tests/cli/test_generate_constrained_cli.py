"""`specdec generate --json-schema / --json-object / --regex / --choice / --grammar` on the demo pair."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")

from specdec.cli import main  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair"
BASE = ["generate", "--target", str(DEMO / "target"), "--temperature", "0", "--max-new-tokens", "60", "--json"]
SPECULATIVE = ["--draft", str(DEMO / "draft"), "--num-draft-tokens", "4"]


def _run(capsys, *argv):
    code = main([*BASE, *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_each_constraint_option_shapes_the_text_and_speculation_keeps_it(capsys, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 999}},
                                  "required": ["n"]}))
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "x = " [0-9] [0-9]? ";"')
    cases = [(["--json-schema", str(schema)], lambda t: isinstance(json.loads(t)["n"], int)),
             (["--regex", "[a-f]{2,6}!"], lambda t: re.fullmatch("[a-f]{2,6}!", t)),
             (["--choice", "red", "--choice", "blue"], lambda t: t in ("red", "blue")),
             (["--grammar", str(grammar)], lambda t: re.fullmatch("x = [0-9]{1,2};", t)),
             (["--json-object"], lambda t: isinstance(json.loads(t), dict))]
    for option, check in cases:
        texts = []
        for speculative in ([], SPECULATIVE):
            code, out, err = _run(capsys, "--prompt", "def f():\n    return ", *speculative, *option)
            assert code == 0, err
            texts.append(json.loads(out)["texts"][0])
        assert texts[0] == texts[1], option
        if option[0] != "--json-object":  # an unbounded object may reach the token budget first
            assert check(texts[1]), (option, texts[1])


@pytest.mark.parametrize("argv, fragment", [
    (["--regex", "a(b"], "--regex: regex: not a valid regular expression"),
    (["--json-schema", "/nonexistent.json"], "--json-schema: /nonexistent.json: no such file"),
    (["--choice", ""], "--choice: guided_choice[0] must be a non-empty string"),
    (["--regex", "a+", *SPECULATIVE, "--draft-tree", "2,1"], "cannot be combined with --leniency, --draft-tree"),
])
def test_bad_constraints_are_one_line_before_loading(capsys, tmp_path, argv, fragment):
    code, out, err = _run(capsys, "--prompt", "x", *argv)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_schema_keyword_that_is_not_enforced_is_named(capsys, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    code, _, err = _run(capsys, "--prompt", "x", "--json-schema", str(schema))
    assert code == 2 and "--json-schema: json_schema.uniqueItems" in err
