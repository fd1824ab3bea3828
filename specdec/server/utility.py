"""The server's small endpoints, in vLLM's shapes: /version, /tokenize, /detokenize; and the request schemas that
/openapi.json (and /docs) show for the generation endpoints, whose handlers read raw bodies.

  POST /tokenize    {"prompt": str, "add_special_tokens": true}  or  {"messages": [...], "add_generation_prompt":
                    true, "add_special_tokens": false, "tools": [...]} (rendered by the chat template), each with
                    "return_token_strs": false  →  {"count", "max_model_len", "tokens", "token_strs"}
  POST /detokenize  {"tokens": [ids]}  →  {"prompt": text}
  GET  /version     {"version": specdec's}
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from pydantic import Field

from specdec.server import protocol as P
from specdec.server.schema import Message, _Strict

__all__ = ["add_utility_routes", "add_request_schemas", "TokenizeCompletionRequest", "TokenizeChatRequest",
           "DetokenizeRequest", "MAX_DETOKENIZE_TOKENS"]

MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Strict):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool = False
    tools: list[Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def add_utility_routes(app, llm, model_name: str, read_body, tokenize_pool, version: str) -> None:
    """/version, /tokenize and /detokenize on `app` (`read_body`: the app's bounded body reader)."""
    @app.get("/version")
    async def server_version():
        return {"version": version}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = P.parse_body(await read_body(request))
        chat = "messages" in body
        typed = P.validate(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)
        P.check_model(typed, model_name)
        fields = typed.model_dump(exclude={"model", "return_token_strs"}, exclude_none=True)
        as_request = P.validate(P.ChatRequest if chat else P.CompletionRequest, fields)
        sources = P.prompt_sources(as_request)
        P.check_length(sources, llm.max_seq_len, 1 << 16, "messages" if chat else "prompt")
        ids = (await asyncio.get_running_loop().run_in_executor(tokenize_pool, P.encode, llm, as_request, sources))[0]
        strs = llm.tokenizer.convert_ids_to_tokens(ids) if typed.return_token_strs else None
        return {"count": len(ids), "max_model_len": llm.max_seq_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        typed = P.validate(DetokenizeRequest, P.parse_body(await read_body(request)))
        P.check_model(typed, model_name)
        bad = next((t for t in typed.tokens if not 0 <= t < llm.vocab_size), None)
        if bad is not None:
            raise P.APIError(f"tokens: {bad} is outside the vocabulary [0, {llm.vocab_size})", param="tokens")
        if len(typed.tokens) > MAX_DETOKENIZE_TOKENS:
            raise P.APIError(f"tokens: at most {MAX_DETOKENIZE_TOKENS} ids", param="tokens")
        return {"prompt": llm.tokenizer.decode(typed.tokens)}


def add_request_schemas(app, bodies: dict) -> None:
    """Show each route's request body ({path: pydantic model}) in /openapi.json: the handlers read the raw body
    (strict JSON, a size bound) and validate it themselves, so FastAPI would not know it."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in bodies.items():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
                operation = schema.get("paths", {}).get(path, {}).get("post")
                if operation is not None:
                    operation["requestBody"] = {"required": True, "content": {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
