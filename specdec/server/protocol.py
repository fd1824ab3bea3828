"""OpenAI request bodies → checked text requests, and specdec results → OpenAI response bodies.

Every field is type-checked and bounded here, before anything reaches the model; a bad field raises
`APIError` (HTTP 4xx, OpenAI's error-body shape, naming the field). Unknown fields are ignored, as OpenAI
does; known fields whose non-default values specdec cannot honour (n > 1, echo, penalties...) are refused.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from specdec.text.outputs import Completion, RequestStats, TextDelta

__all__ = ["APIError", "ParsedRequest", "parse_body", "parse_completion", "parse_chat", "error_body"]

MAX_BODY_BYTES = 1 << 20
MAX_PROMPTS = 16
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_ROLES = ("system", "developer", "user", "assistant", "tool")


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
class ParsedRequest:
    prompts: list[list[int]]  # token ids per prompt (chat: one rendered conversation)
    params: list[dict]  # specdec.text keyword parameters per prompt (max_new_tokens, temperature, ...)
    stream: bool
    include_usage: bool
    logprobs: int | None  # completions: how many; chat: 0 when asked for, None otherwise
    token_details: bool  # stream each token's text and kind (accepted / resampled / bonus / plain)
    model: str | None


def parse_body(raw: bytes) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(f"request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise APIError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


# --- field checks ---------------------------------------------------------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(body, name, *, minimum, maximum=None, default=None):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise APIError(f"{name} must be an integer, got {json.dumps(v)[:60]}", param=name)
    if v < minimum or (maximum is not None and v > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise APIError(f"{name} must be {bound}, got {v}", param=name)
    return v


def _float(body, name, *, low, high, low_open=False, default=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise APIError(f"{name} must be a number, got {json.dumps(v)[:60]}", param=name)
    if (v <= low if low_open else v < low) or v > high:
        raise APIError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {v}", param=name)
    return float(v)


def _bool(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(f"{name} must be true or false, got {json.dumps(v)[:60]}", param=name)
    return v


def _refuse_unsupported(body) -> None:
    checks = {
        "n": lambda v: v in (None, 1), "best_of": lambda v: v in (None, 1), "echo": lambda v: v in (None, False),
        "suffix": lambda v: v is None, "presence_penalty": lambda v: v in (None, 0, 0.0),
        "frequency_penalty": lambda v: v in (None, 0, 0.0), "logit_bias": lambda v: not v,
        "tools": lambda v: not v, "functions": lambda v: not v,
    }
    for name, ok in checks.items():
        if name in body and not ok(body[name]):
            raise APIError(f"{name}={json.dumps(body[name])[:60]} is not supported by specdec serve", param=name)


def _common(body, llm, num_prompt_tokens: int, default_max_tokens: int | None, max_tokens_limit: int) -> dict:
    """specdec.text parameters from the shared OpenAI fields."""
    _refuse_unsupported(body)
    room = llm.max_seq_len - num_prompt_tokens
    if room < 1:
        raise APIError(f"the prompt has {num_prompt_tokens} tokens; this model's context is {llm.max_seq_len} tokens",
                       param="messages" if "messages" in body else "prompt", code="context_length_exceeded")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    limit = min(room, max_tokens_limit)
    max_tokens = _int(body, name, minimum=1)
    if max_tokens is None:
        max_tokens = min(default_max_tokens or limit, limit)
    elif max_tokens > limit:
        why = (f"the prompt has {num_prompt_tokens} tokens and the context is {llm.max_seq_len}" if room < max_tokens_limit
               else f"this server's limit is {max_tokens_limit}")
        raise APIError(f"{name}={max_tokens} is too large: at most {limit} ({why})", param=name,
                       code="context_length_exceeded")
    params = {"max_new_tokens": max_tokens}
    temperature = _float(body, "temperature", low=0.0, high=2.0)
    if temperature is not None:
        params["temperature"] = temperature
    top_p = _float(body, "top_p", low=0.0, high=1.0, low_open=True)
    if top_p is not None:
        params["top_p"] = top_p
    top_k = _int(body, "top_k", minimum=-1, maximum=llm.vocab_size)
    if top_k is not None:
        params["top_k"] = max(top_k, 0)  # vLLM's -1 = off
    seed = _int(body, "seed", minimum=0, maximum=(1 << 63) - 1)
    if seed is not None:
        params["seed"] = seed
    stop = body.get("stop")
    if stop is not None:
        from specdec.text.prompts import check_stop

        try:
            params["stop"] = check_stop(stop)
        except (TypeError, ValueError) as err:
            raise APIError(str(err), param="stop") from None
    params["num_draft_tokens"] = _num_draft_tokens(body, llm)
    return params


def _num_draft_tokens(body, llm):
    extra = body.get("specdec")
    if extra is not None and not isinstance(extra, dict):
        raise APIError("specdec must be an object, e.g. {\"num_draft_tokens\": 0}", param="specdec")
    value = (extra or {}).get("num_draft_tokens", body.get("num_draft_tokens"))
    allowed = sorted({0, llm.num_draft_tokens}, key=str)
    if value is None:
        return llm.num_draft_tokens
    if value not in allowed or isinstance(value, bool):
        raise APIError(f"num_draft_tokens must be one of {allowed} on this server (0 = plain decoding), "
                       f"got {json.dumps(value)[:60]}", param="num_draft_tokens")
    return value


def _token_details(body) -> bool:
    extra = body.get("specdec") or {}
    return _bool(extra, "token_details") if isinstance(extra, dict) else False


def _stream_options(body) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise APIError("stream_options must be an object", param="stream_options")
    return stream, _bool(options, "include_usage")


def _model(body) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError("model must be a string", param="model")
    return model


def _encode(llm, prompt, param: str) -> list[int]:
    from specdec.text.prompts import encode_prompts

    try:
        ids, _ = encode_prompts(prompt, llm.tokenizer, llm.vocab_size)
    except (TypeError, ValueError) as err:
        raise APIError(str(err), param=param) from None
    return ids[0]


def parse_completion(body: dict, llm, max_tokens_limit: int) -> ParsedRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(t) for t in p)) for p in prompt):
        prompts = prompt
    else:
        raise APIError("prompt must be a non-empty string, a list of token ids, or a list of those", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise APIError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", param="prompt")
    if any(p == "" for p in prompts):
        raise APIError("prompt must not be empty", param="prompt")
    ids = [_encode(llm, p, "prompt") for p in prompts]
    logprobs = _int(body, "logprobs", minimum=0, maximum=5)
    stream, include_usage = _stream_options(body)
    params = [_common(body, llm, len(p), DEFAULT_COMPLETION_MAX_TOKENS, max_tokens_limit) for p in ids]
    for p in params:
        p["logprobs"] = logprobs is not None
    return ParsedRequest(ids, params, stream, include_usage, logprobs, _token_details(body), _model(body))


def parse_chat(body: dict, llm, max_tokens_limit: int) -> ParsedRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content} objects", param="messages")
    flat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise APIError(f"messages[{i}] must be an object with a role in {', '.join(_ROLES)}", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise APIError(f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if content is None and m["role"] == "assistant":
            content = ""
        if not isinstance(content, str):
            raise APIError(f"messages[{i}].content must be a string or a list of text parts", param="messages")
        flat.append({"role": m["role"], "content": content})
    ids = _encode(llm, flat, "messages")
    want = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", minimum=0, maximum=20, default=0)
    if top:
        raise APIError("top_logprobs > 0 is not supported: specdec reports the chosen token's log-probability",
                       param="top_logprobs")
    stream, include_usage = _stream_options(body)
    params = _common(body, llm, len(ids), None, max_tokens_limit)
    params["logprobs"] = want
    return ParsedRequest([ids], [params], stream, include_usage, 0 if want else None, _token_details(body),
                         _model(body))


# --- responses ------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(completions: list[Completion]) -> dict:
    prompt = sum(len(c.prompt_token_ids) for c in completions)
    generated = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def specdec_extra(stats: list[RequestStats], gamma) -> dict:
    """The `specdec` object of a response: one request's stats, or the sums over several prompts."""
    if len(stats) == 1:
        return {**stats[0].to_dict(), "num_draft_tokens_per_step": gamma}
    return {"num_draft_tokens_per_step": gamma, "choices": [s.to_dict() for s in stats],
            **{k: sum(s.to_dict()[k] for s in stats) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}}


def completion_logprobs(tokenizer, pieces_or_ids, logprobs: list[float | None]) -> dict:
    tokens = [tokenizer.decode([t]) for t in pieces_or_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": logprobs, "text_offset": offsets,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)]}


def chat_logprobs(tokenizer, token_ids, logprobs: list[float | None]) -> dict:
    content = []
    for t, lp in zip(token_ids, logprobs):
        text = tokenizer.decode([t])
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return {"content": content}


def delta_extra(delta: TextDelta, details: bool) -> dict:
    extra = {"num_accepted": delta.num_accepted, "num_drafted": delta.num_drafted}
    if details:
        extra["tokens"] = [{"text": p.text, "kind": p.kind} for p in delta.pieces]
    return extra


def created() -> int:
    return int(time.time())
