"""Property-based fuzzing of the server's request path (`specdec.server.protocol`), without a model: any JSON body
either becomes checked runner requests or raises `APIError` (a 4xx naming a field) — never another exception.

Bounded and reproducible (derandomized); to hunt further:
SPECDEC_FUZZ_EXAMPLES=5000 SPECDEC_FUZZ_RANDOM=1 pytest tests/hostile/test_api_protocol_fuzz.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("pydantic")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specdec.server import choices as C  # noqa: E402
from specdec.server import protocol as P  # noqa: E402
from specdec.server.schema import ChatRequest, CompletionRequest  # noqa: E402
from specdec.server.structured import compile_for, constraint_of  # noqa: E402
from specdec.constrain import grammar_engine_available  # noqa: E402

GRAMMAR_ENGINE = grammar_engine_available()  # without it, structured bodies stop at the checks before compiling

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair" / "target"
FUZZ = settings(max_examples=int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", 300)), deadline=10_000,
                derandomize=not os.environ.get("SPECDEC_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def llm():
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(DEMO)
    tokenizer.chat_template = TEMPLATE
    return SimpleNamespace(tokenizer=tokenizer, vocab_size=len(tokenizer), max_seq_len=64, num_draft_tokens=4,
                           max_draft_tokens=8, defaults=SimpleNamespace(eos_token_ids=(2,), temperature=0.0))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
                                optional={"content": st.one_of(st.text(max_size=30), json_values),
                                          "name": json_values, "tool_calls": json_values})


def body_strategy(fields: list[str], main: str, main_values):
    known = st.dictionaries(st.sampled_from(fields), json_values | st.integers(0, 70) | st.floats(0, 2), max_size=6)
    return st.tuples(main_values, known, st.dictionaries(st.text(max_size=6), json_values, max_size=1)).map(
        lambda t: {main: t[0], **t[1], **(t[2] if len(t[2]) and not t[1] else {})})


def run(llm, raw: bytes, model_cls):
    """The app's path for one body: an `APIError` or a `ParsedRequest`."""
    try:
        typed = P.validate(model_cls, P.parse_body(raw))
        P.check_model(typed, "demo")
        P.check_refusals(typed)
        structured = constraint_of(typed)
        sources = P.prompt_sources(typed)
        P.check_length(sources, llm.max_seq_len, 200, "prompt")
        prompts = P.encode(llm, typed, sources)
        grammar = compile_for(llm, *structured, C.eos_ids(typed, llm)) if structured and GRAMMAR_ENGINE else None
        parsed = C.build(typed, llm, prompts, llm.max_seq_len, None, constraint=grammar)
    except P.APIError as err:
        assert 400 <= err.status < 500 and str(err)
        return err
    assert parsed.choices and all(0 <= t < llm.vocab_size for p in parsed.prompts for t in p)
    assert all(c.params["max_new_tokens"] + len(parsed.prompts[c.prompt_index]) <= llm.max_seq_len
               for c in parsed.choices)
    return parsed


def dumps(body) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


@FUZZ
@given(body=body_strategy(sorted(CompletionRequest.model_fields), "prompt",
                          st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 9000), max_size=6), json_values)))
def test_completion_bodies(llm, body):
    run(llm, dumps(body), CompletionRequest)


@FUZZ
@given(body=body_strategy(sorted(ChatRequest.model_fields), "messages", st.lists(message, max_size=3) | json_values))
def test_chat_bodies(llm, body):
    run(llm, dumps(body), ChatRequest)


@FUZZ
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_raw_bytes(llm, raw):
    run(llm, raw, CompletionRequest)


schema_like = st.recursive(
    st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null"]) | json_values,
        "maxLength": st.integers(-3, 10 ** 7), "minLength": st.integers(-3, 50), "pattern": st.text(max_size=8),
        "enum": json_values, "const": json_values, "minimum": st.integers(-(2 ** 70), 2 ** 70) | st.floats(),
        "format": st.sampled_from(["date", "email", "uuid", "bogus"]), "required": json_values}),
    lambda inner: st.fixed_dictionaries({}, optional={
        "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3), "items": inner,
        "anyOf": st.lists(inner, max_size=3), "$defs": st.dictionaries(st.text(max_size=4), inner, max_size=2),
        "$ref": st.sampled_from(["#", "#/$defs/a", "#/nope", "http://x"]), "additionalProperties": inner | st.booleans(),
        "type": st.just("object")}),
    max_leaves=8,
)


@FUZZ
@given(field=st.sampled_from(["guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
                              "response_format"]),
       value=schema_like | json_values | st.text(max_size=24))
def test_structured_output_bodies(llm, field, value):
    """Any value of a structured-output field: a 400 naming the problem, or a request carrying a compiled grammar."""
    if field == "response_format":
        value = {"type": "json_schema", "json_schema": {"name": "x", "schema": value}}
    run(llm, dumps({"prompt": "x", "max_tokens": 4, field: value}), CompletionRequest)
