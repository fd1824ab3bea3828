"""Structured output through `specdec serve` with the official openai client: response_format (json_schema,
json_object), vLLM's guided_json / guided_regex / guided_choice / structured_outputs — valid output, the same greedy
text with and without speculation — and a 400 naming every field or schema keyword that is not honoured."""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")
import httpx  # noqa: E402


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=30)
    kind: str = pydantic.Field(pattern="^(cat|dog)$")


PLAIN = {"specdec": {"num_draft_tokens": 0}}
MESSAGES = [{"role": "user", "content": "A pet as JSON."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model_through_speculation(client):
    """The openai client's `parse` sends a strict json_schema and validates the reply into the model."""
    kw = dict(model="demo", messages=MESSAGES, response_format=Pet, temperature=0, max_tokens=80)
    spec = client.chat.completions.parse(**kw)
    plain = client.chat.completions.parse(**kw, extra_body=PLAIN)
    assert spec.choices[0].finish_reason == "stop"
    assert isinstance(spec.choices[0].message.parsed, Pet)
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert spec.model_extra["specdec"]["num_draft_tokens"] > 0 == plain.model_extra["specdec"]["num_draft_tokens"]


def test_json_object_streams_a_json_object(client):
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, temperature=0, max_tokens=120,
                                            response_format={"type": "json_object"}, stream=True)
    text, reason = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reason = chunk.choices[0].finish_reason or reason
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert text.startswith("{")


@pytest.mark.parametrize("extra, check", [
    ({"guided_regex": r"[0-9]{3}-(yes|no)"}, lambda t: re.fullmatch(r"[0-9]{3}-(yes|no)", t)),
    ({"guided_choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"guided_json": Pet.model_json_schema()}, lambda t: Pet.model_validate_json(t)),
    ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
], ids=["guided_regex", "guided_choice", "guided_json", "structured_outputs"])
def test_vllm_guided_fields_on_completions(client, extra, check):
    kw = dict(model="demo", prompt="def pick(x):\n    return ", max_tokens=60, temperature=0)
    spec = client.completions.create(**kw, extra_body=extra)
    plain = client.completions.create(**kw, extra_body={**extra, **PLAIN})
    assert spec.choices[0].finish_reason == "stop", spec.choices[0].text
    assert check(spec.choices[0].text)
    assert spec.choices[0].text == plain.choices[0].text


def test_sampled_choices_match_too(client):
    out = client.completions.create(model="demo", prompt="x = ", max_tokens=20, temperature=1.0, n=4, seed=3,
                                    extra_body={"guided_regex": "[a-c]{2,4};"})
    for choice in out.choices:
        assert choice.finish_reason == "stop" and re.fullmatch("[a-c]{2,4};", choice.text), choice.text


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "response_format: json_schema.not: the JSON schema keyword 'not' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format", "json_schema.uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format",
     "json_schema must be an object with a name"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "type 'structural_tag' is not served"),
    ({"guided_json": {"type": "string", "format": "idn-email"}}, "guided_json", "json_schema.format"),
    ({"guided_regex": "a(b"}, "guided_regex", "not a valid regular expression"),
    ({"guided_choice": []}, "guided_choice", "guided_choice must list 1 to"),
    ({"guided_grammar": "root ::= nothing_defined"}, "guided_grammar", "cannot be compiled"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", "a request may ask for one structured output"),
    ({"guided_regex": "a+", "guided_decoding_backend": "outlines"}, "guided_decoding_backend", "is not available"),
    ({"guided_regex": "a+", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "one layout"),
    ({"guided_regex": "a+", "ignore_eos": True}, "guided_regex", "ends with an EOS token"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "name exactly one"),
    ({"guided_regex": "a+", "min_tokens": 2}, "min_tokens", "min_tokens=2 cannot be combined with a constraint"),
])
def test_refusals_name_the_field(server, body, param, message):
    response = httpx.post(server + "/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 4, **body},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_the_text_api_compiles_a_constraint_and_gives_the_servers_text(client, local_llm):
    from specdec.constrain import Constraint

    prompt, pattern = "def pick(x):\n    return ", r"[0-9]{3}-(yes|no)"
    served = client.completions.create(model="demo", prompt=prompt, max_tokens=60, temperature=0,
                                       extra_body={"guided_regex": pattern})
    local = local_llm.generate(prompt, max_new_tokens=60, temperature=0, constraint=Constraint.regex(pattern))
    assert local.text == served.choices[0].text and re.fullmatch(pattern, local.text)
