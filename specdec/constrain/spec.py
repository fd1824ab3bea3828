"""What a request asks its output to match, checked before anything is compiled: `Constraint`.

A `Constraint` is tokenizer-free (a JSON schema, "any JSON object", a regular expression, a list of choices or
an EBNF grammar as text); `grammar.compile_constraint` turns it into token masks for one tokenizer. JSON schemas
are checked keyword by keyword here: the grammar engine (xgrammar) silently ignores keywords it cannot enforce
(`not`, `if`/`then`, `uniqueItems`, …), so a schema using one is refused with an error naming it and where it
is, instead of producing output that may not validate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Constraint", "KINDS", "MAX_SOURCE_CHARS", "MAX_CHOICES", "check_schema"]

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
#: the longest schema / regex / grammar text accepted (compiling is super-linear in the worst case)
MAX_SOURCE_CHARS = 64 * 1024
MAX_CHOICES = 256
_MAX_DEPTH = 32

# Keywords whose meaning the generated text is guaranteed to honour (checked in tests/constrain), and annotations
# that constrain nothing. Anything else is refused by name.
_HONOURED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const", "anyOf",
    "oneOf", "$ref", "$defs", "definitions", "pattern", "format", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minProperties", "maxProperties",
    "propertyNames", "multipleOf",
})
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType",
})
_FORMATS = frozenset({"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"})
_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("additionalProperties", "items", "propertyNames")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_MAX_COUNT = 2**31 - 1  # the grammar engine's limit on a repetition count
_MAX_INTEGER = 2**63 - 2**10  # an integer bound must be an int64 (as a double) for the grammar engine


@dataclass(frozen=True)
class Constraint:
    """A structured-output request, tokenizer-free (validated on construction; errors name the field).

    kind     "json_schema" (source: the schema as canonical JSON text), "json_object" (any JSON object; source
             ""), "regex" (source: the pattern, matched in full), "choice" (`choices`: exactly one of these
             strings), "grammar" (source: EBNF in xgrammar's / GBNF dialect, root rule `root`)
    """

    kind: str
    source: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise TypeError(f"{self.kind}: the constraint source must be a string, got {type(self.source).__name__}")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise ValueError(f"{self.kind}: {len(self.source)} characters; at most {MAX_SOURCE_CHARS}")
        if self.kind == "choice":
            choices = tuple(self.choices)
            if not choices or len(choices) > MAX_CHOICES:
                raise ValueError(f"guided_choice must list 1 to {MAX_CHOICES} strings, got {len(choices)}")
            for i, c in enumerate(choices):
                if not isinstance(c, str) or not c:
                    raise ValueError(f"guided_choice[{i}] must be a non-empty string, got {c!r:.40}")
            object.__setattr__(self, "choices", choices)
        elif self.choices:
            raise ValueError(f"choices are only for kind 'choice', not {self.kind!r}")
        if self.kind in ("regex", "grammar") and not self.source:
            raise ValueError(f"{self.kind}: an empty pattern constrains nothing; leave the constraint out instead")
        if self.kind == "regex":
            try:  # the engine's dialect is ECMAScript-like; Python's parser catches the plain syntax errors early
                re.compile(self.source)
            except re.error as err:
                raise ValueError(f"regex: not a valid regular expression: {err}") from None

    @classmethod
    def json_schema(cls, schema: Any) -> "Constraint":
        """A schema as a dict or JSON text; checked (`check_schema`) and stored as compact JSON (key order kept: properties are generated in the order listed)."""
        if isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as err:
                raise ValueError(f"json_schema: not valid JSON: {err}") from None
        if schema is True:
            schema = {}
        check_schema(schema)
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))  # property order is generation order

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices) -> "Constraint":
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
            raise TypeError(f"guided_choice must be a list of strings, got {type(choices).__name__}")
        return cls("choice", choices=tuple(choices))

    @classmethod
    def grammar(cls, ebnf: str) -> "Constraint":
        return cls("grammar", ebnf)


def check_schema(schema: Any, path: str = "json_schema", depth: int = 0) -> None:
    """Refuse (ValueError naming the keyword and where it is) a schema the engine would not enforce exactly."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{path}: the schema nests deeper than {_MAX_DEPTH} levels")
    if schema is True or schema is False:
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{path}: a schema must be an object (or true/false), got {type(schema).__name__}")
    for key, value in schema.items():
        where = f"{path}.{key}"
        if key in _ANNOTATIONS:
            continue
        if key not in _HONOURED:
            raise ValueError(f"{where}: the JSON schema keyword {key!r} is not supported by constrained decoding "
                             f"(supported: {', '.join(sorted(_HONOURED))})")
        if key == "type":
            types = value if isinstance(value, list) else [value]
            bad = [t for t in types if t not in _TYPES]
            if bad or not types:
                raise ValueError(f"{where}: unknown type {bad[0] if bad else value!r}")
        elif key == "format" and value not in _FORMATS:
            raise ValueError(f"{where}: the string format {value!r} is not enforced (supported: "
                             f"{', '.join(sorted(_FORMATS))})")
        elif key == "multipleOf" and schema.get("type") != "integer":
            raise ValueError(f"{where}: multipleOf is enforced for type 'integer' only")
        elif key in _BOUNDS:
            _check_bound(schema, key, value, where)
        elif key in _COUNTS and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT):
            raise ValueError(f"{where}: must be an integer in [0, {_MAX_COUNT}], got {value!r:.40}")
        elif key == "$ref" and not (isinstance(value, str) and (value == "#" or value.startswith("#/"))):
            raise ValueError(f"{where}: only local references ('#/...') are resolved, got {value!r:.60}")
        elif key == "pattern":
            if not isinstance(value, str):
                raise ValueError(f"{where}: a pattern must be a string")
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"{where}: not a valid regular expression: {err}") from None
        elif key in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: must be an object of schemas")
            for name, sub in value.items():
                check_schema(sub, f"{where}.{name}", depth + 1)
        elif key in _SUBSCHEMA_LISTS:
            if not isinstance(value, list) or not value:
                raise ValueError(f"{where}: must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                check_schema(sub, f"{where}[{i}]", depth + 1)
        elif key in _SUBSCHEMAS:
            check_schema(value, where, depth + 1)
        elif key == "required" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{where}: must be a list of property names")
        elif key == "enum" and not (isinstance(value, list) and value):
            raise ValueError(f"{where}: must be a non-empty list")


def _check_bound(schema: dict, key: str, value, where: str) -> None:
    """A numeric keyword: a finite number (multipleOf > 0); on an integer, within the int64 range the grammar
    engine represents (a ±1e30 bound used to reach the client as xgrammar's `Check failed: ...`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"{where}: must be a finite number, got {value!r:.40}")
    if key == "multipleOf" and value <= 0:
        raise ValueError(f"{where}: must be > 0, got {value!r:.40}")
    types = schema.get("type")
    if (types == "integer" or isinstance(types, list) and "integer" in types) and abs(value) > _MAX_INTEGER:
        raise ValueError(f"{where}: {value:g} is outside the integer range constrained decoding enforces "
                         f"(|bound| <= {_MAX_INTEGER:.4g})")
