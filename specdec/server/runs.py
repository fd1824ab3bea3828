"""One HTTP request's runner requests and how their outputs reach the event loop.

`Run`: the runner requests of one HTTP request (its prompts × n choices), submitted to the LLM's driver thread
and read back as text deltas. `Mailbox`: outputs handed from the driver thread to one event loop, one wake-up
per step. `Health`: whether the latest request failed in the runner (/health answers 503 then).
`SeedSource`: seeds for requests that send none, from the server's --seed.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

from specdec.server import protocol as P
from specdec.server import responses as R
from specdec.server.metrics import ServerMetrics
from specdec.text.prompts import make_params

__all__ = ["Run", "Mailbox", "Health", "SeedSource", "describe"]


def describe(err: BaseException) -> str:
    """An exception as one line: its message (and its type where the message alone would not say what failed)."""
    text = " ".join(str(err).split())[:500]
    return text if text and isinstance(err, (ValueError, TypeError, RuntimeError)) else \
        f"{type(err).__name__}: {text or '(no message)'}"


class SeedSource:
    """Seeds for requests that send none: splitmix64 of (the server's --seed, arrival count)."""

    def __init__(self, seed: int | None):
        self.seed = seed
        self._count = itertools.count()

    def next(self) -> int | None:
        if self.seed is None:
            return None
        z = (self.seed + 0x9E3779B97F4A7C15 * (next(self._count) + 1)) & ((1 << 64) - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        return (z ^ (z >> 31)) >> 1


class Health:
    """Whether the latest finished request failed in the runner (NaN logits...): /health answers 503 then."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last_error: str | None = None

    def failed(self, err: BaseException) -> None:
        with self._lock:
            self._last_error = describe(err)

    def succeeded(self) -> None:
        with self._lock:
            self._last_error = None

    def failure(self) -> str | None:
        with self._lock:
            return self._last_error


class Run:
    """The runner requests of one HTTP request (its prompts × n choices, in `parsed.choices` order)."""

    def __init__(self, llm, metrics: ServerMetrics, parsed: P.ParsedRequest, mailbox: "Mailbox", health: "Health"):
        self.llm, self.metrics, self.parsed, self.mailbox, self.health = llm, metrics, parsed, mailbox, health
        self.requests: list = []
        self.gamma = parsed.num_draft_tokens
        self.created = R.created()
        self._id = parsed.request_id or R.new_id("x")[2:]
        self._queue: asyncio.Queue = asyncio.Queue()

    @property
    def key(self) -> str:
        """The id's random (or client-given request_id) part, shared by every object of this response."""
        return self._id

    def id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-{self._id}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.llm.runner, self.gamma)  # building a runner must not block the loop
        try:
            for i, spec in enumerate(self.parsed.choices):
                ids = self.parsed.prompts[spec.prompt_index]
                try:
                    sampling, stop, gamma = make_params(self.llm, len(ids), spec.params)
                    if spec.eos_token_ids is not None:
                        sampling = replace(sampling, eos_token_ids=spec.eos_token_ids)
                except (TypeError, ValueError) as err:
                    raise P.APIError(str(err)) from None
                rid = R.new_id("req")

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
        """(choice index, TextDelta) as outputs arrive, until every request has finished."""
        pending = len(self.requests)
        while pending:
            i, item = await self._queue.get()
            request = self.requests[i]
            if isinstance(item, BaseException):
                self.metrics.failed(request.request_id)
                self.health.failed(item)
                raise item
            delta = request.feed(item)
            if item.finished:
                pending -= 1
                if item.finish_reason != "abort":
                    self.health.succeeded()
            elif request.stop_reached and not getattr(request, "abort_sent", False):
                request.abort_sent = True
                self.metrics.stopping(request.request_id)
                self.llm.abort(request.request_id)
            yield i, delta

    def abort_unfinished(self) -> None:
        for request in self.requests:
            if not request.finished:
                self.llm.abort(request.request_id)


class Mailbox:
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
