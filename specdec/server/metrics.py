"""Prometheus metrics of the server: vLLM's spec-decode names under the `specdec:` prefix, plus request counts,
running/waiting requests and latency histograms. One registry per app (no global state).

Counted from every runner output on the driver thread, so the spec-decode counters equal the sums of the
`specdec` objects in the responses:
  spec_decode_num_drafts               request-steps with at least one draft
  spec_decode_num_draft_tokens         drafts proposed
  spec_decode_num_accepted_tokens      drafts accepted
  spec_decode_num_accepted_tokens_per_pos{position}   drafts accepted at position i (0-based)
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["ServerMetrics", "CONTENT_TYPE_LATEST"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, llm, prefix: str = "specdec:"):
        self.llm = llm
        self.registry = r = CollectorRegistry(auto_describe=True)
        p = prefix
        self.num_drafts = Counter(f"{p}spec_decode_num_drafts", "Request-steps with at least one draft.", registry=r)
        self.num_draft_tokens = Counter(f"{p}spec_decode_num_draft_tokens", "Draft tokens proposed.", registry=r)
        self.num_accepted_tokens = Counter(f"{p}spec_decode_num_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter(f"{p}spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position (0-based).", ["position"], registry=r)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generation_tokens = Counter(f"{p}generation_tokens", "Tokens generated (every runner output).",
                                         registry=r)
        self.request_success = Counter(f"{p}request_success", "Finished requests by finish reason (stop, length).",
                                       ["finished_reason"], registry=r)
        self.request_aborted = Counter(f"{p}request_aborted",
                                       "Requests aborted (client disconnects).", registry=r)
        self.request_failed = Counter(f"{p}request_failed", "Requests that failed with a server error.", registry=r)
        self.requests_received = Counter(f"{p}requests_received", "Requests admitted to a runner.", registry=r)
        self.running = Gauge(f"{p}num_requests_running", "Requests in the running batch.", registry=r)
        self.waiting = Gauge(f"{p}num_requests_waiting", "Requests waiting for a slot.", registry=r)
        self.running.set_function(lambda: llm.num_running)
        self.waiting.set_function(lambda: llm.num_waiting)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Time from admission to the first token.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{p}inter_token_latency_seconds",
                             "Time between successive outputs of a request (a step's tokens arrive together).",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{p}e2e_request_latency_seconds", "Time from admission to the last token.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self._lock = threading.Lock()
        self._times: dict[str, list] = {}  # request id -> [admitted at, last output at]
        # stop strings abort a request on purpose: it finishes as "stop", not as an abort
        self._stopping: set[str] = set()

    def admitted(self, request_id: str, num_prompt_tokens: int) -> None:
        now = time.perf_counter()
        with self._lock:
            self._times[request_id] = [now, None]
        self.requests_received.inc()
        self.prompt_tokens.inc(num_prompt_tokens)

    def stopping(self, request_id: str) -> None:
        self._stopping.add(request_id)

    def failed(self, request_id: str) -> None:
        self.request_failed.inc()
        with self._lock:
            self._times.pop(request_id, None)

    def on_output(self, runner, out) -> None:
        """Driver-thread listener: count one RequestOutput."""
        now = time.perf_counter()
        drafted, accepted, n = int(out.num_drafted), int(out.num_accepted), len(out.new_token_ids)
        if drafted:
            self.num_drafts.inc()
            self.num_draft_tokens.inc(drafted)
        if accepted:
            self.num_accepted_tokens.inc(accepted)
            for i in range(accepted):
                self.accepted_per_pos.labels(position=str(i)).inc()
        if n:
            self.generation_tokens.inc(n)
        with self._lock:
            times = self._times.get(out.request_id)
            if out.finished:
                self._times.pop(out.request_id, None)
        if times is not None and n:
            if times[1] is None:
                self.ttft.observe(now - times[0])
            else:
                self.itl.observe(now - times[1])
            times[1] = now
        if out.finished:
            if times is not None:
                self.e2e.observe(now - times[0])
            if out.request_id in self._stopping:
                self._stopping.discard(out.request_id)
                self.request_success.labels(finished_reason="stop").inc()
            elif out.finish_reason == "abort":
                self.request_aborted.inc()
            else:
                self.request_success.labels(finished_reason=str(out.finish_reason)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
