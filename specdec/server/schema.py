"""The request bodies of /v1/completions and /v1/chat/completions as typed pydantic models.

Every field of OpenAI's completions and chat references, and vLLM's common extras, is declared here: a body
with any other key is refused (as OpenAI does: "unrecognized request argument"). Types are strict (4.0 is not
an integer, true is not a number, NaN and ±Infinity are not numbers). A declared field is either honoured
exactly or, where specdec cannot honour its value, refused with a 400 naming it (`REFUSED`, `refusal`) — never
silently ignored. The table in docs/SERVING.md ("Request fields") lists what each field does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = ["CompletionRequest", "ChatRequest", "Message", "StreamOptions", "SpecdecOptions", "refusal",
           "MAX_CHOICES", "MAX_PROMPTS", "MAX_TOP_LOGPROBS"]

MAX_PROMPTS = 16
#: prompts × n: the runner requests one HTTP request may start
MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
#: specdec.draft_tree's bounds as typed (children per node, depth); the engine's node budget is checked apart
MAX_TREE_WIDTH, MAX_TREE_DEPTH = 63, 16
_SEED_MAX = (1 << 63) - 1
_ID_MAX = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM
    include_obfuscation: bool | None = None  # OpenAI


def _no_policy(value):
    """One request's γ is an integer: a draft-length policy's name is refused saying why (`PER_REQUEST_POLICY`)."""
    from specdec.text.prompts import refuse_request_policy

    refuse_request_policy(value)
    return value


#: A request's own γ (0 = plain decoding; 1..the engine's max_draft_tokens), or None: the server's.
RequestGamma = Annotated[int | None, BeforeValidator(_no_policy)]


class SpecdecOptions(_Strict):
    num_draft_tokens: RequestGamma = None  # 0 = plain decoding; else the server's γ
    token_details: bool = False  # stream each token's text and kind (accepted / resampled / bonus / plain)
    leniency: float | None = Field(default=None, gt=0.0, le=1.0)  # l < 1: lossy verification (1 = exact)
    draft_tree: list[Annotated[int, Field(ge=1, le=MAX_TREE_WIDTH)]] | None = Field(default=None, min_length=1,
                                                                                    max_length=MAX_TREE_DEPTH)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "structural_tag", "regex", "grammar"]
    json_schema: Any = None
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, frozen=True)


class _Common(_Strict):
    """The fields both endpoints share (OpenAI's, then vLLM's sampling extras, then specdec's)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    seed: int | None = Field(default=None, ge=0, le=_SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=_ID_MAX)
    response_format: ResponseFormat | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=_ID_MAX)
    prompt_cache_key: str | None = Field(default=None, max_length=_ID_MAX)
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    length_penalty: float | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    best_of: int | None = Field(default=None, ge=1)
    use_beam_search: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logits_processors: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    structural_tag: Any = None
    structured_outputs: Any = None
    priority: int = 0
    request_id: str | None = Field(default=None, min_length=1, max_length=_ID_MAX)
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    cache_salt: str | None = Field(default=None, max_length=_ID_MAX)
    kv_transfer_params: Any = None
    vllm_xargs: Any = None
    # specdec's own
    specdec: SpecdecOptions | None = None
    num_draft_tokens: RequestGamma = None  # the same as specdec.num_draft_tokens

    @property
    def draft_tokens(self) -> int | None:
        if self.specdec is not None and self.specdec.num_draft_tokens is not None:
            return self.specdec.num_draft_tokens
        return self.num_draft_tokens


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    add_special_tokens: bool = True
    prompt_embeds: Any = None


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(default=None, max_length=_ID_MAX)
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = Field(default=None, max_length=_ID_MAX)
    function_call: Any = None
    refusal: str | None = None
    audio: Any = None
    reasoning_content: str | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    # vLLM's chat extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: Any = None
    mm_processor_kwargs: Any = None


# --- what is refused ------------------------------------------------------------------------------
# (field, the values specdec honours, why the others are refused). Checked after the types, in this order.
_PROCESSORS = "needs a logits processor applied to the target and draft distributions (not built yet)"
REFUSED: tuple[tuple[str, Any, str], ...] = (
    ("best_of", lambda r: r.best_of is None or r.best_of == r.n,
     "best_of > n (generate several and return the best) is not supported; n > 1 is"),
    ("use_beam_search", lambda r: not r.use_beam_search, "beam search is not served over HTTP yet: it runs on the "
     "engine through `specdec beam`, `specdec.beam_search` and `Engine.add_request(..., beams=BeamParams(...))`"),
    ("length_penalty", lambda r: r.length_penalty in (None, 1.0), "only applies to beam search"),
    ("logits_processors", lambda r: not r.logits_processors, _PROCESSORS),
    # response_format, guided_json / _regex / _choice / _grammar / _decoding_backend and structured_outputs are
    # honoured (server/structured.py: one per request, schemas checked keyword by keyword)
    ("guided_whitespace_pattern", lambda r: r.guided_whitespace_pattern is None,
     "JSON is generated in one layout (\", \" and \": \" separators, no other whitespace)"),
    ("structural_tag", lambda r: r.structural_tag is None, "structural tags (tool-call formats) are not served; "
     "use response_format or guided_grammar"),
    ("prompt_logprobs", lambda r: r.prompt_logprobs is None, "prompt log-probabilities are not computed"),
    ("include_stop_str_in_output", lambda r: not r.include_stop_str_in_output,
     "the text is always cut before a stop string"),
    ("skip_special_tokens", lambda r: r.skip_special_tokens, "special tokens are always left out of the text"),
    ("spaces_between_special_tokens", lambda r: r.spaces_between_special_tokens,
     "special tokens are left out of the text"),
    ("return_tokens_as_token_ids", lambda r: not r.return_tokens_as_token_ids, "use return_token_ids instead"),
    ("priority", lambda r: r.priority == 0, "requests are served first come, first served"),
    ("store", lambda r: not r.store, "completions are not stored"),
    ("service_tier", lambda r: r.service_tier in (None, "auto", "default"), "there is one service tier"),
    ("kv_transfer_params", lambda r: r.kv_transfer_params is None, "there is no KV transfer"),
    ("vllm_xargs", lambda r: r.vllm_xargs is None, "no extension arguments are read"),
    ("stream_options", lambda r: r.stream_options is None or r.stream or _no_stream_options(r.stream_options),
     "stream_options needs stream: true"),
    ("stream_options.include_obfuscation", lambda r: r.stream_options is None or not r.stream_options.include_obfuscation,
     "stream chunks are not padded"),
    ("stream_options.continuous_usage_stats", lambda r: r.stream_options is None
     or not r.stream_options.continuous_usage_stats, "usage is sent once, at the end (include_usage)"),
)

REFUSED_COMPLETION: tuple[tuple[str, Any, str], ...] = (
    ("suffix", lambda r: not r.suffix, "fill-in-the-middle is not supported"),
    ("echo", lambda r: not (r.echo and r.logprobs is not None), "echo with logprobs needs the prompt's "
     "log-probabilities, which are not computed"),
    ("prompt_embeds", lambda r: r.prompt_embeds is None, "prompts are text or token ids"),
)

REFUSED_CHAT: tuple[tuple[str, Any, str], ...] = (
    ("top_logprobs", lambda r: r.top_logprobs is None or r.logprobs, "top_logprobs needs logprobs: true"),
    ("functions", lambda r: not r.functions, "the deprecated functions field is not served: use tools"),
    ("function_call", lambda r: r.function_call in (None, "none"), "the deprecated function_call field is not "
     "served: use tool_choice"),
    ("audio", lambda r: r.audio is None, "audio output is not supported"),
    ("modalities", lambda r: r.modalities in (None, ["text"]), "only text output is supported"),
    ("prediction", lambda r: r.prediction is None,
     "predicted outputs are not used for drafting (the server's drafter is fixed at start-up)"),
    ("reasoning_effort", lambda r: r.reasoning_effort is None, "the model has no reasoning setting"),
    ("verbosity", lambda r: r.verbosity is None, "the model has no verbosity setting"),
    ("web_search_options", lambda r: r.web_search_options is None, "there is no web search"),
    ("echo", lambda r: not r.echo, "echo is a completions option"),
    ("continue_final_message", lambda r: not r.continue_final_message, "not supported"),
    ("chat_template", lambda r: r.chat_template is None,
     "a request may not bring its own template (the server's is set with --chat-template)"),
    ("chat_template_kwargs", lambda r: not r.chat_template_kwargs, "the chat template gets no extra variables"),
    ("documents", lambda r: r.documents is None, "the chat template gets no documents"),
    ("mm_processor_kwargs", lambda r: r.mm_processor_kwargs is None, "the model takes text only"),
)


def _no_stream_options(options: StreamOptions) -> bool:
    return not (options.include_usage or options.continuous_usage_stats or options.include_obfuscation)


def refusal(request: CompletionRequest | ChatRequest) -> tuple[str, str] | None:
    """(field, message) for the first field whose value specdec cannot honour, or None."""
    extra = REFUSED_CHAT if isinstance(request, ChatRequest) else REFUSED_COMPLETION
    for name, honoured, why in (*REFUSED, *extra):
        if not honoured(request):
            value = _value(request, name)
            return name, f"{name}={value} is not supported by specdec serve: {why}"
    if isinstance(request, ChatRequest):
        for i, m in enumerate(request.messages):
            for name in ("function_call", "audio"):
                if getattr(m, name):
                    return "messages", f"messages[{i}].{name} is not supported by specdec serve (function_call: " \
                                       "use tool_calls; audio: text only)"
            if m.role == "function":
                return "messages", f"messages[{i}]: role 'function' (deprecated) is not supported; use 'tool'"
    return None


def _value(request, dotted: str) -> str:
    import json

    value = request
    for part in dotted.split("."):
        value = getattr(value, part, None)
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
