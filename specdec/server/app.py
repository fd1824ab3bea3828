"""The OpenAI-compatible HTTP app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics, /.

Model steps run on the LLM's driver thread; this event loop only parses, detokenizes and writes. Each
request's outputs arrive on an asyncio queue through a `_Mailbox`: one loop wake-up per step's outputs, not
one per output (each wake-up makes the loop thread take the GIL while the driver thread prepares the next
step). A client that disconnects has its requests aborted at once (the runner frees their slots at its next
step).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from specdec.server import protocol as P
from specdec.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specdec.text.prompts import make_params

logger = logging.getLogger(__name__)

__all__ = ["create_app"]

PLAYGROUND = Path(__file__).resolve().parent / "static" / "playground.html"


def create_app(llm, *, model_name: str = "specdec", max_tokens_limit: int | None = None):
    """A FastAPI app serving `llm` (a `specdec.text.LLM`)."""
    app = FastAPI(title="specdec", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(llm)
    llm.driver.add_listener(metrics.on_output)
    llm.driver.add_step_listener(metrics.on_step)
    mailboxes: dict = {}  # event loop → its _Mailbox (one per loop serving this app)
    lock = threading.Lock()

    def mailbox() -> "_Mailbox":
        loop = asyncio.get_running_loop()
        with lock:
            for closed in [k for k in mailboxes if k.is_closed()]:
                del mailboxes[closed]
            box = mailboxes.get(loop)
            if box is None:
                box = mailboxes[loop] = _Mailbox(loop, metrics)
        return box

    def flush(timing) -> None:  # driver thread, once per step: one wake-up of each loop for all its outputs
        with lock:
            boxes = list(mailboxes.values())
        for box in boxes:
            box.flush()

    llm.driver.add_step_listener(flush)
    limit = llm.max_seq_len if max_tokens_limit is None else min(max_tokens_limit, llm.max_seq_len)
    app.state.llm, app.state.metrics, app.state.model_name = llm, metrics, model_name

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
        return error(500, f"internal server error: {type(err).__name__}", type="server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "runner": llm.runner_kind}

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": P.created(), "owned_by": "specdec",
                "max_model_len": llm.max_seq_len, "num_draft_tokens": llm.num_draft_tokens}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.post("/v1/completions")
    async def completions(request: Request):
        parsed = P.parse_completion(P.parse_body(await _read_body(request)), llm, limit)
        return await _serve(request, parsed, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        parsed = P.parse_chat(P.parse_body(await _read_body(request)), llm, limit)
        return await _serve(request, parsed, chat=True)

    async def _serve(request, parsed: P.ParsedRequest, chat: bool):
        run = _Run(llm, metrics, parsed, mailbox())
        await run.start()
        if parsed.stream:
            return StreamingResponse(_sse(run, chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(_abort_on_disconnect(request, run))
        try:
            async for _ in run.events():
                pass
        finally:
            watcher.cancel()
            run.abort_unfinished()
        return JSONResponse(_full_body(run, chat))

    def _full_body(run: "_Run", chat: bool) -> dict:
        completions = [r.completion() for r in run.requests]
        choices = []
        for i, c in enumerate(completions):
            logprobs = None
            if run.parsed.logprobs is not None:
                make = P.chat_logprobs if chat else P.completion_logprobs
                logprobs = make(llm.tokenizer, c.token_ids, c.logprobs or [])
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": c.text},
                                "logprobs": logprobs, "finish_reason": c.finish_reason})
            else:
                choices.append({"index": i, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason})
        return {"id": run.id(chat), "object": "chat.completion" if chat else "text_completion",
                "created": run.created, "model": model_name, "choices": choices, "usage": P.usage(completions),
                "specdec": P.specdec_extra([c.stats for c in completions], run.gamma)}

    async def _sse(run: "_Run", chat: bool):
        def chunk(choices, **extra) -> str:
            body = {"id": run.id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": run.created, "model": model_name, "choices": choices, **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        try:
            if chat:
                for i in range(len(run.requests)):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
            async for i, delta in run.events():
                if not delta.text and delta.finish_reason is None and not run.parsed.token_details:
                    continue
                request = run.requests[i]
                logprobs = None
                if run.parsed.logprobs is not None and delta.pieces:
                    ids = [p.token_id for p in delta.pieces if p.token_id >= 0]
                    lps = [p.logprob for p in delta.pieces if p.token_id >= 0]
                    logprobs = (P.chat_logprobs if chat else P.completion_logprobs)(llm.tokenizer, ids, lps)
                if chat:
                    content = {"content": delta.text} if delta.text or delta.finish_reason is None else {}
                    choice = {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": delta.finish_reason}
                else:
                    choice = {"index": i, "text": delta.text, "logprobs": logprobs,
                              "finish_reason": delta.finish_reason}
                extra = {"specdec": P.delta_extra(delta, run.parsed.token_details)}
                if delta.finish_reason is not None:
                    extra["specdec"]["request"] = {**request.stats().to_dict(), "num_draft_tokens_per_step": run.gamma}
                yield chunk([choice], **extra)
            if run.parsed.include_usage:
                yield chunk([], usage=P.usage([r.completion() for r in run.requests]))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the stream has started: report in-band, as OpenAI does
            logger.exception("generation failed mid-stream")
            yield f"data: {json.dumps(P.error_body(f'generation failed: {type(err).__name__}: {err}', type='server_error'))}\n\n"
        finally:
            run.abort_unfinished()
        yield "data: [DONE]\n\n"

    return app


async def _read_body(request) -> bytes:
    """The body, refused with 413 past `MAX_BODY_BYTES` without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > P.MAX_BODY_BYTES:
        raise P.APIError(f"request body is larger than {P.MAX_BODY_BYTES} bytes", status=413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > P.MAX_BODY_BYTES:
            raise P.APIError(f"request body is larger than {P.MAX_BODY_BYTES} bytes", status=413)
    return bytes(body)


async def _abort_on_disconnect(request, run: "_Run") -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.abort_unfinished()
            return


class _Run:
    """The runner requests of one HTTP request (several prompts → several requests)."""

    def __init__(self, llm, metrics: ServerMetrics, parsed: P.ParsedRequest, mailbox: "_Mailbox"):
        self.llm, self.metrics, self.parsed, self.mailbox = llm, metrics, parsed, mailbox
        self.requests: list = []
        self.gamma = parsed.params[0]["num_draft_tokens"]
        self.created = P.created()
        self._id = P.new_id("x")[2:]
        self._queue: asyncio.Queue = asyncio.Queue()

    def id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-{self._id}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.llm.runner, self.gamma)  # building a runner must not block the loop
        try:
            for i, (ids, params) in enumerate(zip(self.parsed.prompts, self.parsed.params)):
                try:
                    sampling, stop, gamma = make_params(self.llm, len(ids), params)
                except (TypeError, ValueError) as err:
                    raise P.APIError(str(err)) from None
                rid = P.new_id("req")

                def sink(item, i=i):
                    self.mailbox.put(self._queue, (i, item))

                self.metrics.admitted(rid, len(ids))
                try:
                    self.requests.append(self.llm.submit(ids, sampling, stop, gamma, sink, request_id=rid))
                except (TypeError, ValueError) as err:
                    self.metrics.failed(rid)
                    raise P.APIError(str(err)) from None
        except BaseException:
            self.abort_unfinished()
            raise

    async def events(self):
        """(prompt index, TextDelta) as outputs arrive, until every request has finished."""
        pending = len(self.requests)
        while pending:
            i, item = await self._queue.get()
            request = self.requests[i]
            if isinstance(item, BaseException):
                self.metrics.failed(request.request_id)
                raise item
            delta = request.feed(item)
            if item.finished:
                pending -= 1
            elif request.stop_reached and not getattr(request, "abort_sent", False):
                request.abort_sent = True
                self.metrics.stopping(request.request_id)
                self.llm.abort(request.request_id)
            yield i, delta

    def abort_unfinished(self) -> None:
        for request in self.requests:
            if not request.finished:
                self.llm.abort(request.request_id)


class _Mailbox:
    """Outputs handed from the driver thread to one event loop: `put` collects a step's outputs, `flush` (at the
    end of the step) schedules one drain for all of them (`call_soon_threadsafe`: one wake-up of the loop)."""

    def __init__(self, loop, metrics: ServerMetrics):
        self.loop, self.metrics = loop, metrics
        self._lock = threading.Lock()
        self._items: list = []  # (asyncio queue, item)
        self._since: float | None = None  # when the pending items were flushed
        self._scheduled = False

    def put(self, queue: asyncio.Queue, item) -> None:
        """Driver thread: an output (or an exception) for `queue`, delivered at the next `flush`."""
        with self._lock:
            self._items.append((queue, item))

    def flush(self) -> None:
        """Driver thread: deliver what `put` collected (one drain on the loop)."""
        with self._lock:
            if not self._items or self._scheduled:
                return
            self._scheduled, self._since = True, time.perf_counter()
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._scheduled, since = self._items, [], False, self._since
        if since is not None:
            self.metrics.delivered(time.perf_counter() - since)
        for queue, item in items:
            queue.put_nowait(item)
