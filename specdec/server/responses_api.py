"""A minimal OpenAI Responses API (`POST /v1/responses`) over the chat path.

A request becomes a chat request (`to_chat`): `input` (a string = one user message, or a list of messages whose
content is text or input_text / output_text parts), `instructions` (a system message first),
`max_output_tokens`, `temperature`, `top_p`, `text.format` (text, or json_schema / json_object → the chat's
`response_format`, exact under speculation), `stream`. What a stateless text server cannot do is refused by
name: `tools`, `previous_response_id` / `conversation` (nothing is stored), `store: true`, `background`,
`reasoning`, `include`, other input items (images, files, function outputs). The answer is one `message` output
item with one `output_text` part; streamed, OpenAI's event sequence (response.created … output_text.delta …
response.completed).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from specdec.server import protocol as P
from specdec.server import responses as R
from specdec.server.schema import _Strict

__all__ = ["ResponsesRequest", "to_chat", "response_body", "response_events"]


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    text: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled"] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    reasoning: Any = None
    include: list[Any] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    stream_options: Any = None


_REFUSED = (
    ("tools", lambda r: not r.tools, "tools are served on /v1/chat/completions"),
    ("tool_choice", lambda r: r.tool_choice in (None, "none", "auto"), "tools are served on /v1/chat/completions"),
    ("max_tool_calls", lambda r: r.max_tool_calls is None, "tools are served on /v1/chat/completions"),
    ("previous_response_id", lambda r: r.previous_response_id is None, "responses are not stored: send the "
     "conversation in input"),
    ("conversation", lambda r: r.conversation is None, "conversations are not stored: send them in input"),
    ("store", lambda r: not r.store, "responses are not stored"),
    ("background", lambda r: not r.background, "responses run in the foreground"),
    ("reasoning", lambda r: r.reasoning is None, "the model has no reasoning setting"),
    ("include", lambda r: not r.include, "no extra output data is computed"),
    ("top_logprobs", lambda r: r.top_logprobs is None, "log-probabilities are served on /v1/chat/completions"),
    ("prompt", lambda r: r.prompt is None, "there are no stored prompt templates"),
    ("stream_options", lambda r: r.stream_options is None, "not supported"),
)


def to_chat(body: dict) -> tuple[ResponsesRequest, "P.ChatRequest"]:
    """The typed Responses request and the chat request it runs as (APIError naming the field)."""
    typed = P.validate(ResponsesRequest, body)
    for name, honoured, why in _REFUSED:
        if not honoured(typed):
            raise P.APIError(f"{name} is not supported by specdec serve's /v1/responses: {why}", param=name)
    messages = [{"role": "system", "content": typed.instructions}] if typed.instructions is not None else []
    items = [{"role": "user", "content": typed.input}] if isinstance(typed.input, str) else typed.input
    for i, item in enumerate(items):
        messages.append(_message(item, i))
    chat = {"messages": messages, "stream": typed.stream}
    for src, dst in (("model", "model"), ("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("user", "user"), ("metadata", "metadata"), ("service_tier", "service_tier"),
                     ("safety_identifier", "safety_identifier"), ("prompt_cache_key", "prompt_cache_key")):
        if getattr(typed, src) is not None:
            chat[dst] = getattr(typed, src)
    if typed.text is not None:
        chat.update(_text_format(typed.text))
    return typed, P.validate(P.ChatRequest, chat)


def _message(item, i: int) -> dict:
    where = f"input[{i}]"
    if item.get("type", "message") != "message":
        raise P.APIError(f"{where}: items of type {str(item.get('type'))[:40]!r} are not supported (messages only)",
                         param="input")
    unknown = sorted(set(item) - {"type", "role", "content", "id", "status"})
    if unknown:
        raise P.APIError(f"{where}.{unknown[0]} is not a field of a message", param="input")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text") or \
                    not isinstance(part.get("text"), str):
                raise P.APIError(f"{where}.content[{j}]: only input_text / output_text parts are supported",
                                 param="input")
            texts.append(part["text"])
        content = "".join(texts)
    if item.get("role") not in ("user", "system", "developer", "assistant") or not isinstance(content, str):
        raise P.APIError(f"{where} must have a role (user, system, developer, assistant) and text content",
                         param="input")
    return {"role": item["role"], "content": content}


def _text_format(text: dict) -> dict:
    fmt = text.get("format", {"type": "text"})
    if set(text) - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise P.APIError("text: only text.format is supported", param="text")
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise P.APIError("text.format.type must be text, json_object or json_schema", param="text")
    if fmt["type"] == "text":
        return {}
    if fmt["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


def response_body(typed: ResponsesRequest, run, model_name: str, status: str | None = None) -> dict:
    """The Response object of a finished (or, with `status`, a starting) run."""
    done = status is None
    completion = run.requests[0].completion() if done else None
    text = completion.text if done else ""
    incomplete = done and completion.finish_reason == "length"
    item = {"id": f"msg_{run.key}", "type": "message", "role": "assistant",
            "status": "incomplete" if incomplete else "completed" if done else "in_progress",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []}
    body = {"id": f"resp_{run.key}", "object": "response", "created_at": run.created, "model": model_name,
            "status": status or ("incomplete" if incomplete else "completed"),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
            "instructions": typed.instructions, "max_output_tokens": typed.max_output_tokens,
            "temperature": typed.temperature, "top_p": typed.top_p, "parallel_tool_calls": False,
            "tool_choice": "none", "tools": [], "text": typed.text or {"format": {"type": "text"}},
            "truncation": "disabled", "store": False, "metadata": typed.metadata or {},
            "output": [item] if done else [], "usage": None}
    if done:
        u = R.usage(run.parsed.prompts, [completion])
        body["usage"] = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                         "total_tokens": u["total_tokens"], "input_tokens_details": dict(u["prompt_tokens_details"]),
                         "output_tokens_details": {"reasoning_tokens": 0}}
        body["specdec"] = R.specdec_extra([completion.stats], run.gamma)
    return body


async def response_events(typed: ResponsesRequest, run, model_name: str):
    """The streamed Response: OpenAI's event sequence as SSE (`event:` and `data:` lines)."""
    sequence = iter(range(1 << 62))
    item_id = f"msg_{run.key}"

    def event(kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    try:
        start = response_body(typed, run, model_name, status="in_progress")
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        yield event("response.output_item.added", output_index=0, item=item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part)
        async for _, delta in run.events():
            if delta.text:
                yield event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0,
                            delta=delta.text, logprobs=[])
        final = response_body(typed, run, model_name)
        text = final["output"][0]["content"][0]["text"]
        yield event("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=text,
                    logprobs=[])
        yield event("response.content_part.done", item_id=item_id, output_index=0, content_index=0,
                    part=final["output"][0]["content"][0])
        yield event("response.output_item.done", output_index=0, item=final["output"][0])
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield event(kind, response=final)
    except Exception as err:  # noqa: BLE001 - the stream has started: report in-band
        from specdec.server.runs import describe

        yield event("error", code="server_error", message=f"generation failed: {describe(err)}", param=None)
    finally:
        run.abort_unfinished()
