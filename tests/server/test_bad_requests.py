"""Malformed requests get a 4xx with OpenAI's error body, never a 500; the server keeps serving."""

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
    "n > 1": completion(n=3),
    "echo": completion(echo=True),
    "logprobs too many": completion(logprobs=99),
    "stream not bool": completion(stream="yes"),
    "stream_options not object": completion(stream=True, stream_options=3),
    "num_draft_tokens not served": completion(specdec={"num_draft_tokens": 7}),
    "specdec not object": completion(specdec="fast"),
    "model not string": completion(model=5),
    "chat no messages": ("/v1/chat/completions", {"model": "demo"}),
    "chat messages not list": chat(messages="hi"),
    "chat unknown role": chat(messages=[{"role": "alien", "content": "x"}]),
    "chat content number": chat(messages=[{"role": "user", "content": 5}]),
    "chat image part": chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
    "chat top_logprobs": chat(logprobs=True, top_logprobs=3),
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


def test_unknown_routes_and_methods_use_the_error_shape(server):
    assert httpx.post(server + "/v1/nothing", json={}).json()["error"]["type"] == "not_found_error"
    r = httpx.get(server + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_unknown_fields_are_ignored_and_the_server_still_works(server):
    r = httpx.post(server + "/v1/completions", json={**COMPLETION, "user": "u1", "whatever": {"x": 1}}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_official_client_sees_a_bad_request_error(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="def f(", max_tokens=-5)
    assert "max_tokens" in str(info.value)
