"""Malformed requests get a 4xx with OpenAI's error body naming the field, never a 500; every field specdec
cannot honour is refused by name (never silently ignored); the server keeps serving."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")

COMPLETION = {"model": "demo", "prompt": "def f(", "max_tokens": 4}
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def completion(**kw):
    return ("/v1/completions", {**COMPLETION, **kw})


def chat(**kw):
    return ("/v1/chat/completions", {**CHAT, **kw})


CASES = {
    "not json": ("/v1/completions", b"{not json"),
    "json array": ("/v1/completions", b"[1, 2]"),
    "invalid utf-8": ("/v1/completions", b"\xff\xfe{}"),
    "no prompt": ("/v1/completions", {"model": "demo"}),
    "prompt number": completion(prompt=5),
    "prompt empty": completion(prompt=""),
    "prompt empty list": completion(prompt=[]),
    "prompt negative id": completion(prompt=[-1, 5]),
    "prompt id past vocab": completion(prompt=[99999]),
    "prompt too long": completion(prompt="x = 1\n" * 1500),
    "too many prompts": completion(prompt=["a"] * 17),
    "max_tokens negative": completion(max_tokens=-1),
    "max_tokens zero": completion(max_tokens=0),
    "max_tokens string": completion(max_tokens="ten"),
    "max_tokens float": completion(max_tokens=1.5),
    "max_tokens huge": completion(max_tokens=10**9),
    "max_tokens past context": completion(prompt="x = 1\n" * 200, max_tokens=1000),
    "temperature negative": completion(temperature=-0.5),
    "temperature string": completion(temperature="hot"),
    "temperature too high": completion(temperature=7),
    "top_p zero": completion(top_p=0),
    "top_p above one": completion(top_p=1.5),
    "top_k string": completion(top_k="a"),
    "seed negative": completion(seed=-3),
    "seed huge": completion(seed=2**70),
    "stop number": completion(stop=5),
    "stop empty string": completion(stop=[""]),
    "stop too many": completion(stop=[str(i) for i in range(40)]),
    "n too large": completion(n=17),
    "n zero": completion(n=0),
    "prompts times n": completion(prompt=["a", "b", "c"], n=6),
    "logprobs too many": completion(logprobs=99),
    "num_draft_tokens float": completion(specdec={"num_draft_tokens": 4.0}),
    "num_draft_tokens top-level float": completion(num_draft_tokens=4.0),
    "num_draft_tokens bool": completion(specdec={"num_draft_tokens": True}),
    "max_tokens bool": completion(max_tokens=True),
    "temperature NaN": ("/v1/completions", b'{"prompt": "a", "temperature": NaN}'),
    "temperature Infinity": ("/v1/completions", b'{"prompt": "a", "temperature": Infinity}'),
    "nested 100k deep": ("/v1/completions", b'{"prompt": "a", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "nested in a string is fine but unknown key": ("/v1/completions", b'{"prompt": "[[[[", "x": 1}'),
    "unknown field": completion(whatever={"x": 1}),
    "prompt lone surrogate": ("/v1/completions", b'{"prompt": "a\\ud800b"}'),
    "chat lone surrogate": ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}'),
    "stop_token_ids past vocab": completion(stop_token_ids=[10**6]),
    "top_k past vocab": completion(top_k=10**6),
    "min_p above one": completion(min_p=1.5),
    "request_id empty": completion(request_id=""),
    "chat content missing": chat(messages=[{"role": "user"}]),
    "chat function role": chat(messages=[{"role": "function", "content": "x", "name": "f"}]),
    "chat template raise_exception": chat(messages=[{"role": "user", "content": "RAISE"}]),
    "stream not bool": completion(stream="yes"),
    "stream_options not object": completion(stream=True, stream_options=3),
    "num_draft_tokens past the engine's largest": completion(specdec={"num_draft_tokens": 9}),
    "specdec not object": completion(specdec="fast"),
    "model not string": completion(model=5),
    "chat no messages": ("/v1/chat/completions", {"model": "demo"}),
    "chat messages not list": chat(messages="hi"),
    "chat unknown role": chat(messages=[{"role": "alien", "content": "x"}]),
    "chat content number": chat(messages=[{"role": "user", "content": 5}]),
    "chat image part": chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
    "chat top_logprobs > 20": chat(logprobs=True, top_logprobs=21),
    "completion logprobs > 5": completion(logprobs=6),
    "body too large": completion(prompt="x" * (1 << 21)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_request_gets_a_4xx_with_an_openai_error_body(server, name):
    path, body = CASES[name]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and "type" in error
    assert "Error:" not in error["message"] or "raise_exception" in name  # a message, not an exception's name


def test_the_messages_say_what_is_wrong(server):
    def message(path, body):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(server + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    error = message(*completion(specdec={"num_draft_tokens": 4.0}))
    assert error["param"] == "specdec" and "num_draft_tokens" in error["message"] and "integer" in error["message"]
    for body in (completion(specdec={"num_draft_tokens": "heuristic"}), completion(num_draft_tokens="Optimal")):
        error = message(*body)  # a draft-length policy: a model's default γ only, and why
        assert "for one request" in error["message"] and "whole batch" in error["message"], error
    assert "whole batch" not in message(*completion(num_draft_tokens="four"))["message"]  # (no policy: no reason)
    assert "nests" in message(*CASES["nested 100k deep"])["message"]
    assert "NaN" in message(*CASES["temperature NaN"])["message"]
    error = message(*completion(whatever=1))
    assert error["param"] == "whatever" and "unrecognized" in error["message"]
    assert "surrogate" in message(*CASES["prompt lone surrogate"])["message"]
    # the chat template's own message reaches the client
    assert "no RAISE please" in message(*CASES["chat template raise_exception"])["message"]


# Fields specdec cannot honour (yet), and values of honoured fields it refuses: each a 400 that names the field.
REFUSED = [
    completion(best_of=3), completion(use_beam_search=True), completion(length_penalty=0.5),
    completion(logit_bias={"999999": 10}), completion(logit_bias={"x": 1}), completion(logit_bias={"5": 101}),
    completion(min_tokens=3, max_tokens=2), completion(repetition_penalty=0),
    completion(allowed_token_ids=[1, 999999]), completion(allowed_token_ids=[]), completion(bad_words=[" "]),
    completion(bad_words=[f"word{i}" for i in range(40)]), completion(logits_processors=["x"]),
    completion(response_format={"type": "structural_tag"}),
    chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}),
    completion(guided_json={"not": {}}), completion(guided_regex="a("), completion(guided_choice=[]),
    completion(guided_grammar="x"), completion(structured_outputs={"xml": {}}), completion(prompt_logprobs=1),
    completion(guided_whitespace_pattern=" "), completion(structural_tag={"a": 1}),
    completion(guided_decoding_backend="outlines"),
    completion(include_stop_str_in_output=True), completion(skip_special_tokens=False),
    completion(spaces_between_special_tokens=False), completion(return_tokens_as_token_ids=True),
    completion(priority=1), completion(store=True), completion(service_tier="flex"),
    completion(kv_transfer_params={}), completion(vllm_xargs={"a": 1}), completion(stream_options={"include_usage": True}),
    completion(stream=True, stream_options={"include_obfuscation": True}),
    completion(stream=True, stream_options={"continuous_usage_stats": True}),
    completion(suffix="x"),
    completion(logprobs=0, echo=True), completion(prompt_embeds="x"),
    chat(top_logprobs=0), chat(tools=[{"type": "function"}]),
    chat(tool_choice="auto"), chat(functions=[{"name": "f"}]), chat(function_call="auto"), chat(audio={"voice": "x"}),
    chat(modalities=["text", "audio"]), chat(prediction={"type": "content", "content": "x"}),
    chat(reasoning_effort="low"), chat(verbosity="low"), chat(web_search_options={}), chat(echo=True),
    chat(continue_final_message=True), chat(chat_template="{{ 1 }}"), chat(chat_template_kwargs={"a": 1}),
    chat(documents=[{"a": "b"}]), chat(mm_processor_kwargs={"a": 1}),
    chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: f"{c[0].split('/')[-1]}:{next(iter(set(c[1]) - set(CHAT) - set(COMPLETION)), 'messages')}")
def test_fields_that_cannot_be_honoured_are_refused_by_name(server, case):
    path, body = case
    field = next(iter(set(body) - {"model", "prompt", "messages", "max_tokens", "stream"}), None)
    field = field or ("stream_options" if "stream_options" in body else "messages")
    r = httpx.post(server + path, json=body, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert field in error["message"] and error["param"] in (field, "stream_options", "logprobs", "top_logprobs", "echo",
                                                             "messages"), error


def test_every_declared_field_is_honoured_or_has_a_refusal():
    """The schema's fields = the ones the server honours + the ones with a refusal rule: none is ignored."""
    from specdec.server.schema import REFUSED as COMMON, REFUSED_CHAT, REFUSED_COMPLETION, ChatRequest, CompletionRequest

    honoured = {"model", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "stream", "stream_options", "user",
                "metadata", "safety_identifier", "prompt_cache_key", "top_k", "min_p", "ignore_eos", "stop_token_ids",
                "truncate_prompt_tokens", "request_id", "return_token_ids", "cache_salt", "specdec",
                "num_draft_tokens", "add_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty",
                "logit_bias", "min_tokens", "allowed_token_ids", "bad_words", "response_format", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar", "guided_decoding_backend", "structured_outputs"}
    completion_only = {"prompt", "echo", "logprobs"}
    chat_only = {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "parallel_tool_calls", "tools", "tool_choice",
                 "add_generation_prompt"}
    common = {r[0] for r in COMMON if "." not in r[0]}
    assert set(CompletionRequest.model_fields) == honoured | completion_only | common | {r[0] for r in REFUSED_COMPLETION}
    assert set(ChatRequest.model_fields) == honoured | chat_only | common | {r[0] for r in REFUSED_CHAT}


def test_unknown_routes_and_methods_use_the_error_shape(server):
    assert httpx.post(server + "/v1/nothing", json={}).json()["error"]["type"] == "not_found_error"
    r = httpx.get(server + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_identifier_fields_are_accepted_and_the_server_still_works(server):
    body = {**COMPLETION, "user": "u1", "safety_identifier": "s", "prompt_cache_key": "k", "metadata": {"a": "b"},
            "cache_salt": "salt", "service_tier": "auto", "store": False}
    r = httpx.post(server + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_an_unknown_model_is_404(server):
    r = httpx.post(server + "/v1/completions", json={**COMPLETION, "model": "gpt-4"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found" and "gpt-4" in r.text
    assert httpx.get(server + "/v1/models/gpt-4").status_code == 404
    assert httpx.get(server + "/v1/models/demo").json()["id"] == "demo"
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_the_official_client_sees_a_bad_request_error(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="def f(", max_tokens=-5)
    assert "max_tokens" in str(info.value)
