"""OpenAI request bodies → checked, tokenized prompts, and the records the runners receive.

A body goes through, in order: the size limit, strict JSON (no NaN; nesting bounded), the typed models of
`schema.py` (every field typed and bounded), the model name (404 when unknown), the refusals (a value specdec
cannot honour: 400 naming the field), a cheap length refusal (before any tokenization), then tokenization and
chat-template rendering (`encode`, run off the event loop by the app), then the per-choice parameters
(`choices.py`: `build` → `ParsedRequest`, defined here). Every client error raises `APIError` (OpenAI's error
body, naming the field), never a bare 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from specdec.server.schema import MAX_CHOICES, MAX_PROMPTS, ChatRequest, CompletionRequest, refusal

__all__ = ["APIError", "ParsedRequest", "ChoiceSpec", "parse_body", "validate", "check_model", "check_refusals",
           "prompt_sources", "check_length", "source_chars", "encode", "prompt_texts", "error_body", "CompletionRequest",
           "ChatRequest", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 1 << 20


class APIError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type, code

    def body(self) -> dict:
        return error_body(str(self), type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class ChoiceSpec:
    """One runner request: which prompt, its specdec.text parameters, and its EOS ids (None = the model's)."""

    prompt_index: int
    params: dict
    eos_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ParsedRequest:
    prompts: list[list[int]]  # token ids per prompt (chat: one rendered conversation)
    choices: list[ChoiceSpec]  # prompt-major: prompt i's n choices are choices[i*n : (i+1)*n]
    stream: bool
    include_usage: bool
    logprobs: int | None  # completions: its logprobs (0..5); chat: 0 when asked for; None otherwise
    token_details: bool  # stream each token's text and kind (accepted / resampled / bonus / plain)
    num_draft_tokens: int
    echo: tuple[str, ...] | None = None  # completions: the prompt texts to prepend
    return_token_ids: bool = False
    request_id: str | None = None
    top_logprobs: int = 0  # alternatives per token (chat: top_logprobs ≤ 20; completions: logprobs ≤ 5)


# --- body → typed request -------------------------------------------------------------------------

def parse_body(raw: bytes) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(f"request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:  # the C decoder counts its depth against the recursion limit: cheap and bounded
        raise APIError("request body nests JSON arrays/objects too deeply") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise APIError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def validate(model_cls, body: dict):
    """The typed request, or APIError naming the first bad field (unknown fields are refused, as OpenAI does)."""
    try:
        return model_cls.model_validate(body)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = first.get("loc", ())
        # a union's member name ("str", "list[int]") is not a field
        path = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))]
        name = ".".join(p if not p.isdigit() else f"[{p}]" for p in path).replace(".[", "[") or None
        if first.get("type") == "extra_forbidden":
            raise APIError(f"unrecognized request argument supplied: {name}", param=name) from None
        if first.get("type") == "missing":
            raise APIError(f"{name} is required", param=name) from None
        got = first.get("input")
        try:
            shown = json.dumps(got)
        except (TypeError, ValueError, RecursionError):
            shown = repr(got)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise APIError(f"{name}: {first.get('msg', 'invalid value')} (got {shown})", param=name.split("[")[0].split(".")[0]
                       if name else None) from None


def check_model(request, served: str) -> None:
    if request.model is not None and request.model != served:
        raise APIError(f"The model `{request.model}` does not exist (this server serves `{served}`)", status=404,
                       param="model", type="NotFoundError", code="model_not_found")


def check_refusals(request) -> None:
    refused = refusal(request)
    if refused is not None:
        raise APIError(refused[1], param=refused[0].split(".")[0])


# --- prompts --------------------------------------------------------------------------------------

def prompt_sources(request) -> list:
    """What `encode` turns into token ids, one entry per prompt: a string, token ids, or (chat) message dicts."""
    if isinstance(request, ChatRequest):
        messages = []
        for i, m in enumerate(request.messages):
            content = m.content
            if isinstance(content, list):  # content parts: only text is understood
                texts = []
                for j, part in enumerate(content):
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise APIError(f"messages[{i}].content[{j}]: only text parts are supported "
                                       f"(got type {str(part.get('type'))[:40]!r})", param="messages")
                    texts.append(part["text"])
                content = "".join(texts)
            if content is None:
                if m.role != "assistant":
                    raise APIError(f"messages[{i}].content is required for role {m.role!r}", param="messages")
                content = ""
            _check_unicode(content, f"messages[{i}].content", "messages")
            message = {"role": m.role, "content": content}
            if m.name is not None:
                message["name"] = m.name
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            if m.tool_calls:
                from specdec.server.tools import template_tool_calls

                message["tool_calls"] = template_tool_calls(m.tool_calls, i)
            messages.append(message)
        return [messages]
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError("prompt must not be empty", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise APIError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", param="prompt")
    if len(prompts) * request.n > MAX_CHOICES:
        raise APIError(f"prompts × n = {len(prompts)} × {request.n} = {len(prompts) * request.n} choices; at most "
                       f"{MAX_CHOICES} per request", param="n")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise APIError(f"prompt {i} is empty", param="prompt")
        if isinstance(p, str):
            _check_unicode(p, f"prompt {i}", "prompt")
    return prompts


def _check_unicode(text: str, where: str, param: str) -> None:
    """JSON may escape lone surrogates ("\\ud800"): not Unicode text, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise APIError(f"{where} contains a lone surrogate {text[err.start]!r} at {err.start}: not valid Unicode",
                       param=param) from None


def check_length(sources: list, max_seq_len: int, max_token_chars: int, param: str) -> None:
    """The cheap refusal, before any tokenization: a text of c characters has at least c / max_token_chars tokens
    (no token covers more characters than the longest vocabulary entry), so past max_seq_len × max_token_chars
    characters it cannot fit the context, whatever the tokenizer does."""
    limit = max_seq_len * max(max_token_chars, 1)
    for i, source in enumerate(sources):
        if isinstance(source, str):
            chars = len(source)
        elif source and isinstance(source[0], dict):
            chars = sum(len(m["content"]) for m in source)
        else:
            chars = 0
            if len(source) >= max_seq_len:
                raise APIError(f"prompt {i} has {len(source)} tokens; this model's context is {max_seq_len} tokens",
                               param=param, code="context_length_exceeded")
        if chars > limit:
            raise APIError(f"prompt {i} has {chars} characters: more than the {max_seq_len}-token context can hold "
                           f"(at most {max_token_chars} characters per token)", param=param,
                           code="context_length_exceeded")


def source_chars(sources: list) -> int:
    """Characters to tokenize or render (token-id prompts count 0)."""
    total = 0
    for source in sources:
        if isinstance(source, str):
            total += len(source)
        elif source and isinstance(source[0], dict):
            total += sum(len(m["content"]) for m in source)
    return total


def encode(llm, request, sources: list) -> list[list[int]]:
    """Token ids per prompt: tokenization and chat-template rendering (slow for long inputs: the app runs this on
    a worker thread, never on the event loop). Errors (a template's raise_exception included) → APIError."""
    from specdec.text.prompts import encode_prompts

    tokenizer = llm.tokenizer
    chat = isinstance(request, ChatRequest)
    param = "messages" if chat else "prompt"
    tools = list(request.tools) if chat and request.tools else None
    out = []
    for source in sources:
        try:
            if chat:
                text = _render(tokenizer, source, request.add_generation_prompt, tools,
                               require_tools=request.tool_choice != "none")
                ids = tokenizer.encode(text, add_special_tokens=request.add_special_tokens)
            elif isinstance(source, str):
                ids = tokenizer.encode(source, add_special_tokens=request.add_special_tokens)
            else:
                ids = source
            if request.truncate_prompt_tokens is not None:
                ids = ids[-request.truncate_prompt_tokens:]
            out.append(encode_prompts([ids], tokenizer, llm.vocab_size)[0][0])
        except APIError:
            raise
        except (TypeError, ValueError) as err:
            raise APIError(str(err), param=param) from None
        except Exception as err:  # noqa: BLE001 - jinja2's TemplateError (raise_exception) and its kin
            if type(err).__module__.startswith("jinja2"):
                raise APIError(f"chat template: {err}", param="messages") from None
            raise
    return out


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list | None = None,
            require_tools: bool = True) -> str:
    """The conversation as the chat template writes it; with `tools`, the template's own rendering of them (a
    template that leaves them out is refused unless `require_tools` is off — tool_choice "none": the model would
    not see the functions it is asked to call)."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError("this model has no chat template: start the server with --chat-template FILE, or use "
                       "/v1/completions with a text prompt", param="messages")
    from specdec.text.prompts import apply_template  # (any rendering failure: a one-line ChatTemplateError, a 400)

    text = apply_template(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
    if tools and require_tools and text == apply_template(tokenizer, messages,
                                                          add_generation_prompt=add_generation_prompt):
        raise APIError("tools: this model's chat template does not render tools (the model would not see them); "
                       "start the server with a --chat-template that does", param="tools")
    return text


def prompt_texts(llm, sources: list) -> tuple[str, ...]:
    """The prompts as text (echo): a string as given, token ids decoded."""
    return tuple(s if isinstance(s, str) else llm.tokenizer.decode(s) for s in sources)
