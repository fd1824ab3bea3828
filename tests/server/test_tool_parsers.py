"""Tool calls without a server: the plan a request's tools and tool_choice make (constraints, refusals) and the
parser of each template family fed a choice's output delta by delta, the way the server streams it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from specdec.server.protocol import APIError, ChatRequest  # noqa: E402
from specdec.server.tool_parsers import MARKERS, ToolCallStream, detect_format  # noqa: E402
from specdec.server.tools import plan_tools, template_tool_calls  # noqa: E402
from specdec.text.outputs import TextDelta, TokenPiece  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def request(**kw) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def deltas(texts, ids=None):
    """TextDeltas of one piece each (token id -1 unless given)."""
    ids = ids or [-1] * len(texts)
    return [TextDelta(t, (TokenPiece(i, t, "plain"),), 0, 0) for t, i in zip(texts, ids)]


def run(stream: ToolCallStream, texts, finish="stop", ids=None):
    sent = []
    for d in deltas(texts, ids):
        sent += stream.feed(d)
    last, reason = stream.finish(finish)
    return sent + last, reason


def test_the_plan_of_each_tool_choice():
    assert plan_tools(request()) is None
    assert plan_tools(request(tools=[WEATHER], tool_choice="none")).mode == "none"
    auto = plan_tools(request(tools=[WEATHER, TIME]))
    assert auto.mode == "auto" and auto.constraint is None and auto.names == ("get_weather", "get_time")
    named = plan_tools(request(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert named.mode == "named" and json.loads(named.constraint.source) == WEATHER["function"]["parameters"]
    required = plan_tools(request(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False))
    schema = json.loads(required.constraint.source)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize("fields, fragment", [
    ({"tool_choice": "auto"}, "needs tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice must be one of"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0] must be"),
    ({"tools": [WEATHER, WEATHER]}, "listed twice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]},
     "tools[0].function.parameters.not"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "type object"),
])
def test_bad_tools_are_refused_naming_the_place(fields, fragment):
    with pytest.raises(APIError) as info:
        plan_tools(request(**fields))
    assert fragment in str(info.value) and info.value.param in ("tools", "tool_choice")


def test_earlier_calls_reach_the_template_with_object_arguments():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert template_tool_calls(calls, 2) == [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}},
                                              "id": "call_1"}]
    with pytest.raises(APIError, match=r"messages\[2\].tool_calls\[0\].function.arguments is not JSON"):
        template_tool_calls([{"type": "function", "function": {"name": "f", "arguments": "{x"}}], 2)


@pytest.mark.parametrize("template, fmt", [
    ("{% for t in tools %}{{ t }}{% endfor %}<tool_call>", "hermes"), ("[AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|>", "llama3_json"), ("{{ messages }}", None),
])
def test_the_format_is_read_from_the_template(template, fmt):
    class Tok:
        chat_template = template

    assert detect_format(Tok()) == fmt


def test_hermes_content_then_calls_split_across_deltas():
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER, TIME])), "hermes")
    texts = ["Let me", " check. <tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}',
             "</tool_call>\n<tool_call>", '{"name": "get_time", "arguments": {}}</tool_call>']
    sent, reason = run(stream, texts)
    assert reason == "tool_calls"
    assert "".join(d.get("content", "") for d in sent) == "Let me check. " == stream.content
    assert [(c.name, json.loads(c.arguments)) for c in stream.calls] == [("get_weather", {"city": "Paris"}),
                                                                        ("get_time", {})]
    calls = [d["tool_calls"][0] for d in sent if "tool_calls" in d]
    assert [c["index"] for c in calls] == [0, 1] and calls[0]["function"]["name"] == "get_weather"


def test_hermes_text_that_only_looks_like_a_marker_is_sent_whole():
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER])), "hermes")
    sent, reason = run(stream, ["a <to", "ol> b <tool_c"], finish="length")
    assert "".join(d["content"] for d in sent) == "a <tool> b <tool_c" and reason == "length" and not stream.calls


@pytest.mark.parametrize("body", ['{"name": "unknown", "arguments": {}}', '{"name": "get_weather", "argu'])
def test_a_call_that_does_not_parse_is_returned_as_content(body):
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER])), "hermes")
    sent, reason = run(stream, ["<tool_call>", body], finish="length")
    assert "".join(d["content"] for d in sent) == "<tool_call>" + body and reason == "length" and not stream.calls


def test_mistral_marker_is_a_special_token_seen_by_id():
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER])), "mistral", frozenset({9}))
    sent, reason = run(stream, ["ok", "", '[{"name": "get_weather", "arguments": {"city": "Rome"}}]'], ids=[1, 9, 2])
    assert reason == "tool_calls" and stream.content == "ok" and stream.calls[0].arguments == '{"city": "Rome"}'
    assert MARKERS["mistral"] not in json.dumps(sent)


def test_a_marker_token_whose_text_is_the_marker_is_read_once():
    """Qwen2.5's `<tool_call>` is one added token that is not special: its piece's text is the marker itself."""
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER])), "hermes", frozenset({7}))
    sent, reason = run(stream, ["Sure.\n", "<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n',
                                "</tool_call>"], ids=[1, 7, 2, 8])
    assert reason == "tool_calls" and stream.content == "Sure.\n" and stream.calls[0].arguments == '{"city": "Oslo"}'


@pytest.mark.parametrize("fmt", ["hermes", "mistral"])
def test_an_answer_that_is_only_a_json_call_is_a_call_in_every_family(fmt):
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER])), fmt)
    sent, reason = run(stream, ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}'])
    assert reason == "tool_calls" and stream.content is None and stream.calls[0].arguments == '{"city": "Paris"}'
    other = ToolCallStream(plan_tools(request(tools=[WEATHER])), fmt)
    sent, reason = run(other, ['{"name": "get_time"}'])  # not a listed tool: the text as it was
    assert sent == [{"content": '{"name": "get_time"}'}] and reason == "stop"


def test_llama3_json_calls_joined_by_semicolons():
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER, TIME])), "llama3_json")
    sent, reason = run(stream, [" ", '{"name": "get_weather", "parameters": {"city": "a;b"}}', '; {"name": "get_time",',
                                ' "parameters": {}}'])
    assert reason == "tool_calls" and stream.content is None
    assert [json.loads(c.arguments) for c in stream.calls] == [{"city": "a;b"}, {}]
    plain = ToolCallStream(plan_tools(request(tools=[WEATHER])), "llama3_json")
    sent, reason = run(plain, [" Hello", " {there}"])
    assert "".join(d["content"] for d in sent) == " Hello {there}" and reason == "stop"


def test_named_streams_arguments_and_required_parses_the_array():
    named = ToolCallStream(plan_tools(request(tools=[WEATHER], tool_choice={"type": "function",
                                                                            "function": {"name": "get_weather"}})))
    sent, reason = run(named, ['{"city":', ' "Oslo"}'])
    assert reason == "tool_calls" and sent[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":'}
    assert sent[1] == {"tool_calls": [{"index": 0, "function": {"arguments": ' "Oslo"}'}}]}
    assert named.calls[0].arguments == '{"city": "Oslo"}' and named.content is None
    required = ToolCallStream(plan_tools(request(tools=[WEATHER, TIME], tool_choice="required")))
    sent, reason = run(required, ['[{"name": "get_time", "parameters": {}}, ', '{"name": "get_weather", '
                                  '"parameters": {"city": "Lima"}}]'])
    assert reason == "tool_calls" and [c.name for c in required.calls] == ["get_time", "get_weather"]
    cut = ToolCallStream(plan_tools(request(tools=[WEATHER], tool_choice="required")))
    sent, reason = run(cut, ['[{"name": "get_wea'], finish="length")
    assert reason == "length" and sent == [{"content": '[{"name": "get_wea'}]


def test_tool_choice_none_passes_text_through():
    stream = ToolCallStream(plan_tools(request(tools=[WEATHER], tool_choice="none")), "hermes")
    sent, reason = run(stream, ["<tool_call>", "{}"])
    assert "".join(d["content"] for d in sent) == "<tool_call>{}" and reason == "stop" and not stream.calls
