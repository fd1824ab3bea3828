"""The OpenAI-compatible HTTP app: /v1/models, /v1/completions, /v1/chat/completions (tool calls), /v1/responses,
/tokenize, /detokenize, /version, /health, /metrics, /docs, /openapi.json, / (docs/SERVING.md lists them).

A request passes `guard.py` (Host, Origin, API key, JSON content type), then `protocol.py` (typed, bounded,
refusals, a cheap length bound); tokenization and chat templates run on worker threads; model steps run on the
LLM's driver thread; this event loop only parses, detokenizes and writes. Each
request's outputs arrive on an asyncio queue through a `runs.Mailbox`: one loop wake-up per step's outputs, not
one per output (each wake-up makes the loop thread take the GIL while the driver thread prepares the next
step). A client that disconnects has its requests aborted at once (the runner frees their slots at its next
step).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI, Request

from specdec import __version__
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from specdec.server import bodies as B
from specdec.server import choices as C
from specdec.server import protocol as P
from specdec.server import responses_api as RA
from specdec.server import responses as R
from specdec.server.guard import GuardConfig, GuardMiddleware
from specdec.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specdec.server.runs import Health, Mailbox, Run, SeedSource, describe
from specdec.text.prompts import gamma_label
from specdec.server.structured import compile_on, constraint_of
from specdec.server.tool_parsers import FORMATS, ToolCallStream, detect_format, marker_ids
from specdec.server.tools import ToolPlan, plan_tools
from specdec.server.utility import DetokenizeRequest, TokenizeChatRequest, add_request_schemas, add_utility_routes

logger = logging.getLogger(__name__)

__all__ = ["create_app"]

PLAYGROUND = Path(__file__).resolve().parent / "static" / "playground.html"
#: prompts up to this many characters are tokenized on the event loop (about a millisecond); longer ones on
#: the worker threads, so that small requests never queue behind large ones and no stream stalls
INLINE_TOKENIZE_CHARS = 1024


def create_app(llm, *, model_name: str = "specdec", max_tokens_limit: int | None = None,
               metrics_prefix: str = "specdec:", guard: GuardConfig | None = None, tokenize_workers: int = 2,
               default_seed: int | None = None, tool_call_parser: str = "auto", docs: bool = True,
               grammar_compiles=None):
    """A FastAPI app serving `llm` (a `specdec.text.LLM`).

    guard: Host / Origin / API key / content-type checks (`guard.GuardConfig`; default: loopback hosts and
    origins only, no key). tokenize_workers: threads that tokenize and render chat templates (off the loop).
    default_seed: requests that send no seed get seeds drawn from it in arrival order (None = fresh randomness).
    tool_call_parser: how tool_choice "auto" reads calls in the output ("auto": the chat template's family,
    `tool_parsers.detect_format`; or one of `tool_parsers.FORMATS`). docs: serve /docs and /openapi.json.
    grammar_compiles: the `constrain.GrammarCompiles` pool structured outputs compile on (default: its defaults)."""
    if tool_call_parser not in ("auto", *FORMATS):
        raise ValueError(f"tool_call_parser must be auto or one of {', '.join(FORMATS)}, got {tool_call_parser!r}")
    tool_format = detect_format(llm.tokenizer) if tool_call_parser == "auto" else tool_call_parser
    tool_markers = marker_ids(llm.tokenizer, tool_format)
    app = FastAPI(title="specdec", version=__version__, docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    app.add_middleware(GuardMiddleware, config=guard or GuardConfig())
    metrics = ServerMetrics(llm, prefix=metrics_prefix, model_name=model_name)
    llm.driver.add_listener(metrics.on_output)
    llm.driver.add_step_listener(metrics.on_step)
    mailboxes: dict = {}  # event loop → its _Mailbox (one per loop serving this app)
    lock = threading.Lock()
    tokenize_pool = ThreadPoolExecutor(max_workers=tokenize_workers, thread_name_prefix="specdec-tokenize")
    max_token_chars = _max_token_chars(llm.tokenizer)
    health = Health()
    seeds = SeedSource(default_seed)
    if grammar_compiles is None:
        from specdec.constrain.compiles import GrammarCompiles

        grammar_compiles = GrammarCompiles()

    def mailbox() -> "Mailbox":
        loop = asyncio.get_running_loop()
        with lock:
            for closed in [k for k in mailboxes if k.is_closed()]:
                del mailboxes[closed]
            box = mailboxes.get(loop)
            if box is None:
                box = mailboxes[loop] = Mailbox(loop, metrics)
        return box

    def flush(timing) -> None:  # driver thread, once per step: one wake-up of each loop for all its outputs
        with lock:
            boxes = list(mailboxes.values())
        for box in boxes:
            box.flush()

    llm.driver.add_step_listener(flush)
    limit = llm.max_seq_len if max_tokens_limit is None else min(max_tokens_limit, llm.max_seq_len)
    app.state.llm, app.state.metrics, app.state.model_name = llm, metrics, model_name
    app.state.tokenize_pool, app.state.health, app.state.grammar_compiles = tokenize_pool, health, grammar_compiles

    def error(status: int, message: str, **kw) -> JSONResponse:
        return JSONResponse(P.error_body(message, **kw), status_code=status)

    @app.exception_handler(P.APIError)
    async def _api_error(request, err: P.APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request, err: HTTPException):
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return error(err.status_code, str(err.detail), type=kind)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, err):
        return error(400, f"invalid request: {err.errors()}")

    @app.exception_handler(Exception)
    async def _internal_error(request, err: Exception):
        logger.exception("internal error")
        return error(500, f"internal server error: {describe(err)}", type="server_error")

    @app.get("/health")
    async def health_check():
        failure = health.failure()
        if failure is not None:
            return JSONResponse({"status": "error", "runner": llm.runner_kind, "error": failure}, status_code=503)
        return {"status": "ok", "runner": llm.runner_kind}

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": R.created(), "owned_by": "specdec",
                "max_model_len": llm.max_seq_len, "num_draft_tokens": gamma_label(llm.num_draft_tokens)}
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str):
        if name != model_name:
            raise P.APIError(f"The model `{name}` does not exist", status=404, param="model", type="NotFoundError",
                             code="model_not_found")
        return {"id": model_name, "object": "model", "created": R.created(), "owned_by": "specdec",
                "max_model_len": llm.max_seq_len, "num_draft_tokens": gamma_label(llm.num_draft_tokens)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.post("/v1/responses")
    async def responses(request: Request):
        typed, chat_request = RA.to_chat(P.parse_body(await _read_body(request)))
        parsed, _ = await _prepare(chat_request, True)
        run = Run(llm, metrics, parsed, mailbox(), health)
        await run.start()
        if parsed.stream:
            return StreamingResponse(RA.response_events(typed, run, model_name), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await _finish(request, run)
        return JSONResponse(RA.response_body(typed, run, model_name))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _handle(request, P.CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _handle(request, P.ChatRequest)

    async def _handle(request: Request, model_cls):
        typed = P.validate(model_cls, P.parse_body(await _read_body(request)))
        chat = model_cls is P.ChatRequest
        parsed, tools = await _prepare(typed, chat)
        return await _serve(request, parsed, chat, tools)

    async def _prepare(typed, chat: bool) -> tuple[P.ParsedRequest, ToolPlan | None]:
        """A typed request → its checked, tokenized runner requests and tool plan (every refusal first)."""
        P.check_model(typed, model_name)
        P.check_refusals(typed)
        structured = constraint_of(typed)  # (field, Constraint) or None: checked before any tokenization
        tools = plan_tools(typed) if chat else None
        if tools is not None and tools.mode == "auto" and tool_format is None:
            raise P.APIError("tool_choice=auto: this model's chat template writes no tool-call format specdec "
                             f"parses ({', '.join(FORMATS)}; --tool-call-parser names one); use tool_choice "
                             '"required" or a named function (decoded under a JSON-schema constraint)',
                             param="tool_choice")
        if tools is not None and tools.constraint is not None:
            if structured is not None:
                raise P.APIError(f"tool_choice={tools.mode!r} decodes under a JSON-schema constraint of its own: "
                                 f"it cannot be combined with {structured[0]}", param=structured[0])
            structured = ("tool_choice", tools.constraint)
        sources = P.prompt_sources(typed)
        P.check_length(sources, llm.max_seq_len, max_token_chars, "messages" if chat else "prompt")
        if P.source_chars(sources) <= INLINE_TOKENIZE_CHARS:  # no hand-off, no queue behind big ones
            prompts = P.encode(llm, typed, sources)
        else:
            prompts = await asyncio.get_running_loop().run_in_executor(tokenize_pool, P.encode, llm, typed, sources)
        echo = P.prompt_texts(llm, sources) if not chat and typed.echo else None
        grammar = None
        if structured is not None:  # on the compile pool: bounded, timed, never behind another request's compile
            grammar = await compile_on(grammar_compiles, llm, *structured, C.eos_ids(typed, llm))
        parsed = C.build(typed, llm, prompts, limit, echo, seeds.next() if typed.seed is None else None,
                         constraint=grammar)
        return parsed, tools

    async def _serve(request, parsed: P.ParsedRequest, chat: bool, tools: ToolPlan | None = None):
        run = Run(llm, metrics, parsed, mailbox(), health)
        await run.start()
        tool_streams = None
        if chat and tools is not None:
            tool_streams = [ToolCallStream(tools, tool_format, tool_markers) for _ in parsed.choices]
        if parsed.stream:
            return StreamingResponse(B.sse(run, chat, llm, model_name, tool_streams), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await _finish(request, run, tool_streams)
        return JSONResponse(B.full_body(run, chat, llm, model_name, tool_streams))

    async def _finish(request, run: Run, tool_streams=None) -> None:
        """Read the run to its end (aborted if the client leaves); a runner failure is a 500 with its message."""
        watcher = asyncio.create_task(_abort_on_disconnect(request, run))
        try:
            async for i, delta in run.events():
                if tool_streams is not None:
                    tool_streams[i].feed(delta)
        except P.APIError:
            raise
        except Exception as err:  # noqa: BLE001 - the runner failed (NaN logits...): its message, not a name
            logger.error("generation failed: %s", describe(err))
            raise P.APIError(f"generation failed: {describe(err)}", status=500, type="server_error") from None
        finally:
            watcher.cancel()
            run.abort_unfinished()

    add_utility_routes(app, llm, model_name, _read_body, tokenize_pool, __version__)
    if docs:
        add_request_schemas(app, {"/v1/completions": P.CompletionRequest, "/v1/chat/completions": P.ChatRequest,
                                  "/v1/responses": RA.ResponsesRequest, "/tokenize": TokenizeChatRequest,
                                  "/detokenize": DetokenizeRequest})
    return app


def _max_token_chars(tokenizer) -> int:
    """The most characters one token covers (the longest vocabulary entry; byte-level entries count bytes)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: no cheap bound
        return 1 << 20
    longest = max((len(t) for t in vocab), default=1)
    return max(longest, 1)


async def _read_body(request) -> bytes:
    """The body, refused with 413 past `MAX_BODY_BYTES` without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > P.MAX_BODY_BYTES:
        raise P.APIError(f"request body is larger than {P.MAX_BODY_BYTES} bytes", status=413)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > P.MAX_BODY_BYTES:
                raise P.APIError(f"request body is larger than {P.MAX_BODY_BYTES} bytes", status=413)
    except ClientDisconnect:  # the client left mid-body: nobody reads the answer, nothing to log
        raise P.APIError("the client disconnected before sending the whole body", status=400) from None
    return bytes(body)


async def _abort_on_disconnect(request, run: "Run") -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.abort_unfinished()
            return


