"""Constraint: what is accepted, and every refusal names the field or the schema keyword (no xgrammar needed)."""

from __future__ import annotations

import json

import pytest

from specdec.constrain import Constraint, check_schema


def test_schema_is_canonical_json_from_dict_or_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    a = Constraint.json_schema(schema)
    b = Constraint.json_schema(json.dumps(schema, indent=2))
    assert a == b and a.kind == "json_schema" and json.loads(a.source) == schema


@pytest.mark.parametrize("schema, named", [
    ({"not": {"type": "string"}}, "json_schema.not"),
    ({"type": "array", "uniqueItems": True}, "json_schema.uniqueItems"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "json_schema.if"),
    ({"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}, "json_schema.properties.a.contains"),
    ({"anyOf": [{"type": "string", "format": "idn-email"}]}, "json_schema.anyOf[0].format"),
    ({"type": "number", "multipleOf": 2}, "json_schema.multipleOf"),
    ({"$ref": "http://example.com/s.json"}, "json_schema.$ref"),
    ({"type": "strng"}, "json_schema.type"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "json_schema.allOf"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "json_schema.patternProperties"),
    ({"type": "string", "pattern": "(unclosed"}, "json_schema.pattern"),
    ([1, 2], "json_schema"),
    # bounds the grammar engine cannot represent (issue 35, item 6: xgrammar's `Check failed: ...` reached clients)
    ({"type": "integer", "minimum": -1e30, "maximum": 1e30}, "json_schema.minimum"),
    ({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMaximum": 1e30}}},
     "json_schema.properties.n.exclusiveMaximum"),
    ({"type": "number", "minimum": float("inf")}, "json_schema.minimum"),
    ({"type": "integer", "multipleOf": 0}, "json_schema.multipleOf"),
    ({"type": "string", "maxLength": 10**12}, "json_schema.maxLength"),
    ({"type": "array", "minItems": -1}, "json_schema.minItems"),
])
def test_unsupported_schemas_are_refused_by_name(schema, named):
    with pytest.raises(ValueError) as err:
        check_schema(schema)
    assert str(err.value).startswith(named + ":"), str(err.value)


def test_annotations_and_honoured_keywords_pass():
    check_schema({"title": "t", "description": "d", "$schema": "x", "type": ["string", "null"], "minLength": 1,
                  "examples": ["a"], "format": "date"})
    check_schema({"$defs": {"n": {"type": "integer", "multipleOf": 3}}, "type": "array",
                  "items": {"$ref": "#/$defs/n"}, "minItems": 1})


def test_deep_schemas_are_refused():
    schema: dict = {"type": "integer"}
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ValueError, match="nests deeper"):
        check_schema(schema)


@pytest.mark.parametrize("make, message", [
    (lambda: Constraint("xml"), "constraint kind must be one of"),
    (lambda: Constraint.regex(""), "regex: an empty pattern"),
    (lambda: Constraint.regex("a(b"), "regex: not a valid regular expression"),
    (lambda: Constraint.choice([]), "guided_choice must list 1 to"),
    (lambda: Constraint.choice(["a", ""]), r"guided_choice\[1\] must be a non-empty string"),
    (lambda: Constraint.choice("ab"), "guided_choice must be a list of strings"),
    (lambda: Constraint.json_schema("{not json"), "json_schema: not valid JSON"),
    (lambda: Constraint("grammar", "x" * (64 * 1024 + 1)), "grammar: 65537 characters"),
])
def test_bad_constraints_name_the_problem(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()
