"""Tool calls through the official `openai` client against the live server, whose test chat template renders
tools Hermes-style (`conftest.CHAT_TEMPLATE`): tool_choice none / auto / required / a named function, streamed
and not, and a conversation that carries earlier calls back."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
import httpx  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                                                     "maxLength": 12}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# tool_choice "auto" leaves the choice to the model; this regex makes the demo model's answer a Hermes call
CALL = r'ok <tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>'


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client, **kw):
    return client.chat.completions.create(model="demo", messages=kw.pop("messages", MESSAGES), temperature=0, **kw)


def streamed(client, **kw) -> tuple[str, dict, str]:
    """(content, {index: (name, arguments)}, finish_reason) accumulated from the stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in chat(client, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            name, args = calls.get(call.index, (None, ""))
            calls[call.index] = (call.function.name or name, args + (call.function.arguments or ""))
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_tool_choice_none_is_plain_chat_over_the_rendered_tools(client, local_llm):
    got = chat(client, tools=[WEATHER], tool_choice="none", max_tokens=12)
    tokenizer = local_llm.tokenizer
    ids = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, tools=[WEATHER], tokenize=False,
                                                         add_generation_prompt=True), add_special_tokens=False)
    want = local_llm.generate(ids, max_new_tokens=12, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.tool_calls is None
    assert got.usage.prompt_tokens == len(ids) and got.choices[0].finish_reason == want.finish_reason


def test_a_named_function_is_decoded_under_its_parameters_schema(client):
    got = chat(client, tools=[WEATHER, TIME], tool_choice=NAMED, max_tokens=48)
    choice = choice_ = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice_.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str) and len(arguments["city"]) <= 12
    content, calls, finish = streamed(client, tools=[WEATHER, TIME], tool_choice=NAMED, max_tokens=48)
    assert (content, finish) == ("", "tool_calls") and calls == {0: ("get_weather", call.function.arguments)}


def test_required_makes_one_call_with_parallel_calls_off(client):
    got = chat(client, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time") and isinstance(json.loads(call.function.arguments), dict)
    content, calls, finish = streamed(client, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                                      max_tokens=48)
    assert finish == "tool_calls" and calls == {0: (call.function.name, call.function.arguments)}


def test_auto_returns_text_when_the_model_makes_no_call(client):
    got = chat(client, tools=[WEATHER], max_tokens=10)
    assert got.choices[0].message.tool_calls is None and got.choices[0].message.content
    assert got.choices[0].finish_reason in ("stop", "length")


def test_auto_parses_a_hermes_call_from_the_output(client):
    got = chat(client, tools=[WEATHER], max_tokens=60, extra_body={"guided_regex": CALL})
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok "
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    content, calls, finish = streamed(client, tools=[WEATHER], max_tokens=60, extra_body={"guided_regex": CALL})
    assert (content, finish) == ("ok ", "tool_calls") and calls == {0: ("get_weather", '{"city": "Paris"}')}


def test_a_conversation_carries_earlier_calls_and_their_results(client, server):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    got = chat(client, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=4)
    assert got.choices[0].finish_reason in ("stop", "length")
    rendered = httpx.post(server + "/tokenize", json={"messages": history, "tools": [WEATHER],
                                                      "return_token_strs": True}, timeout=30).json()
    assert got.usage.prompt_tokens == rendered["count"]
    text = httpx.post(server + "/detokenize", json={"tokens": rendered["tokens"]}, timeout=30).json()["prompt"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text and "sunny" in text


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                              "uniqueItems": True}}}]}, "tools"),
])
def test_tool_requests_that_cannot_be_honoured_are_refused(server, fields, param):
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": 4, "tools": [WEATHER], **fields}
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_template_without_tools_is_refused_unless_tool_choice_is_none(local_llm, chat_template_file):
    from specdec.server.protocol import APIError, _render

    class Plain:  # the demo tokenizer with a template that never mentions tools
        chat_template = chat_template_file.read_text().split("{% endif %}", 1)[1]

        def apply_chat_template(self, *args, **kwargs):
            kwargs["chat_template"] = self.chat_template
            return local_llm.tokenizer.apply_chat_template(*args, **kwargs)

    assert _render(Plain(), MESSAGES, True, [WEATHER], require_tools=False) == _render(Plain(), MESSAGES, True)
    with pytest.raises(APIError, match="does not render tools"):
        _render(Plain(), MESSAGES, True, [WEATHER])
