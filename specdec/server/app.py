"""The OpenAI-compatible HTTP app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics, /.

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
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from specdec.server import choices as C
from specdec.server import protocol as P
from specdec.server import responses as R
from specdec.server.guard import GuardConfig, GuardMiddleware
from specdec.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specdec.server.runs import Health, Mailbox, Run, SeedSource, describe
from specdec.server.structured import compile_on, constraint_of

logger = logging.getLogger(__name__)

__all__ = ["create_app"]

PLAYGROUND = Path(__file__).resolve().parent / "static" / "playground.html"
#: prompts up to this many characters are tokenized on the event loop (about a millisecond); longer ones on
#: the worker threads, so that small requests never queue behind large ones and no stream stalls
INLINE_TOKENIZE_CHARS = 1024


def create_app(llm, *, model_name: str = "specdec", max_tokens_limit: int | None = None,
               metrics_prefix: str = "specdec:", guard: GuardConfig | None = None, tokenize_workers: int = 2,
               default_seed: int | None = None, grammar_compiles=None):
    """A FastAPI app serving `llm` (a `specdec.text.LLM`).

    guard: Host / Origin / API key / content-type checks (`guard.GuardConfig`; default: loopback hosts and
    origins only, no key). tokenize_workers: threads that tokenize and render chat templates (off the loop).
    default_seed: requests that send no seed get seeds drawn from it in arrival order (None = fresh randomness).
    grammar_compiles: the `constrain.GrammarCompiles` pool structured outputs compile on (default: its defaults)."""
    app = FastAPI(title="specdec", docs_url=None, redoc_url=None, openapi_url=None)
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
                "max_model_len": llm.max_seq_len, "num_draft_tokens": llm.num_draft_tokens}
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str):
        if name != model_name:
            raise P.APIError(f"The model `{name}` does not exist", status=404, param="model", type="NotFoundError",
                             code="model_not_found")
        return {"id": model_name, "object": "model", "created": R.created(), "owned_by": "specdec",
                "max_model_len": llm.max_seq_len, "num_draft_tokens": llm.num_draft_tokens}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _handle(request, P.CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _handle(request, P.ChatRequest)

    async def _handle(request: Request, model_cls):
        body = P.parse_body(await _read_body(request))
        typed = P.validate(model_cls, body)
        P.check_model(typed, model_name)
        P.check_refusals(typed)
        structured = constraint_of(typed)  # (field, Constraint) or None: checked before any tokenization
        sources = P.prompt_sources(typed)
        chat = model_cls is P.ChatRequest
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
        return await _serve(request, parsed, chat)

    async def _serve(request, parsed: P.ParsedRequest, chat: bool):
        run = Run(llm, metrics, parsed, mailbox(), health)
        await run.start()
        if parsed.stream:
            return StreamingResponse(_sse(run, chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(_abort_on_disconnect(request, run))
        try:
            async for _ in run.events():
                pass
        except P.APIError:
            raise
        except Exception as err:  # noqa: BLE001 - the runner failed (NaN logits...): its message, not a name
            logger.error("generation failed: %s", describe(err))
            raise P.APIError(f"generation failed: {describe(err)}", status=500, type="server_error") from None
        finally:
            watcher.cancel()
            run.abort_unfinished()
        return JSONResponse(_full_body(run, chat))

    def _full_body(run: "Run", chat: bool) -> dict:
        completions = [r.completion() for r in run.requests]
        parsed = run.parsed
        choices = []
        for i, c in enumerate(completions):
            spec = parsed.choices[i]
            logprobs = None
            prefix = parsed.echo[spec.prompt_index] if parsed.echo is not None else ""
            if parsed.logprobs is not None:
                logprobs = (R.chat_logprobs(llm.tokenizer, c.token_ids, c.logprobs or [], parsed.top_logprobs,
                                            c.top_logprobs) if chat else
                            R.completion_logprobs(llm.tokenizer, c.token_ids, c.logprobs or [], len(prefix),
                                                  c.top_logprobs))
            if chat:
                choice = {"index": i, "message": {"role": "assistant", "content": c.text},
                          "logprobs": logprobs, "finish_reason": c.finish_reason}
            else:
                choice = {"index": i, "text": prefix + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
            if c.stop_string is not None:
                choice["stop_reason"] = c.stop_string  # vLLM's field: which stop string ended the text
            if parsed.return_token_ids:
                choice["token_ids"] = list(c.token_ids)
                choice["prompt_token_ids"] = list(parsed.prompts[spec.prompt_index])
            choices.append(choice)
        stats = [c.stats for c in completions]
        return {"id": run.id(chat), "object": "chat.completion" if chat else "text_completion",
                "created": run.created, "model": model_name, "choices": choices,
                "usage": R.usage(parsed.prompts, completions),
                "speculative_decoding": R.speculative_decoding(stats),
                "specdec": R.specdec_extra(stats, run.gamma)}

    async def _sse(run: "Run", chat: bool):
        parsed = run.parsed

        def chunk(choices, **extra) -> str:
            body = {"id": run.id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": run.created, "model": model_name, "choices": choices, **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        offsets = [0] * len(run.requests)
        try:
            for i, spec in enumerate(parsed.choices):
                if chat:
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
                elif parsed.echo is not None:
                    text = parsed.echo[spec.prompt_index]
                    offsets[i] = len(text)
                    yield chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": None}])
            async for i, delta in run.events():
                if not delta.text and delta.finish_reason is None and not parsed.token_details:
                    continue
                request = run.requests[i]
                logprobs = None
                ids = [p.token_id for p in delta.pieces if p.token_id >= 0]
                if parsed.logprobs is not None and ids:
                    lps = [p.logprob for p in delta.pieces if p.token_id >= 0]
                    tops = [p.top_logprobs or () for p in delta.pieces if p.token_id >= 0]
                    logprobs = (R.chat_logprobs(llm.tokenizer, ids, lps, parsed.top_logprobs, tops) if chat else
                                R.completion_logprobs(llm.tokenizer, ids, lps, offsets[i], tops))
                offsets[i] += len(delta.text)
                if chat:
                    content = {"content": delta.text} if delta.text or delta.finish_reason is None else {}
                    choice = {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": delta.finish_reason}
                else:
                    choice = {"index": i, "text": delta.text, "logprobs": logprobs,
                              "finish_reason": delta.finish_reason}
                if parsed.return_token_ids:
                    choice["token_ids"] = ids
                extra = {"specdec": R.delta_extra(delta, parsed.token_details)}
                if delta.finish_reason is not None:
                    stats = request.stats()
                    extra["specdec"]["request"] = {**stats.to_dict(), "num_draft_tokens_per_step": run.gamma}
                    extra["speculative_decoding"] = R.speculative_decoding([stats])
                yield chunk([choice], **extra)
            if parsed.include_usage:
                yield chunk([], usage=R.usage(parsed.prompts, [r.completion() for r in run.requests]))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the stream has started: report in-band, as OpenAI does
            logger.error("generation failed mid-stream: %s", describe(err))
            yield f"data: {json.dumps(P.error_body(f'generation failed: {describe(err)}', type='server_error'))}\n\n"
        finally:
            run.abort_unfinished()
        yield "data: [DONE]\n\n"

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


