"""Prometheus metrics of the server: vLLM's spec-decode names under a prefix (`specdec:` by default; `vllm:` makes
vLLM's dashboards read them unchanged), each with vLLM's `model_name` label, plus request counts,
running/waiting requests and latency histograms. One registry per app (no global state); no `_created` series.

Counted from every runner output on the driver thread, so the spec-decode counters equal the sums of the
`specdec` objects in the responses:
  spec_decode_num_drafts               request-steps with at least one draft
  spec_decode_num_draft_tokens         drafts proposed
  spec_decode_num_accepted_tokens      drafts accepted
  spec_decode_num_accepted_tokens_per_pos{position}   drafts accepted at position i (0-based)

and where serving time goes (to tell an engine stall from a server one):
  graph_captures_total                 CUDA graph pairs the runners have captured (start-up warm-up included: a
                                       rise while serving is a capture a request in flight waited for)
  step_shapes                          distinct decode step shapes the runners have built (eager ones too)
  step_shapes_run                      those that have served a step (a rise: shapes used for the first time)
  engine_step_seconds{num_draft_tokens, kind}  time of each runner step on the driver thread (admission +
                                       prefill + the decode step + any capture); kind "admit" when requests were
                                       waiting at its start (it prefilled), else "decode"
  driver_handoff_seconds               driver thread time spent handing one step's outputs over (metrics, sinks)
  output_delivery_seconds              driver thread → event loop: from a step's hand-off to its outputs' queues
  prefill_budget_tokens{num_draft_tokens}  the prompt tokens a runner's next step may prefill (chunked prefill:
                                       a fixed budget, or "auto"'s from the measured decode step; unset: off)
  kv_cache_usage_perc                  fraction of the engine's KV cache held by requests, in [0, 1] (vLLM's name;
                                       paged: blocks, static: slots)
  kv_cache_free_blocks / kv_cache_used_blocks  the paged pool's blocks (kv_layout="paged")
  num_preemptions_total                requests whose KV blocks were taken back to make room (paged pool)
  spec_decode_collapses{kind}          acceptance collapses the engine's γ policy saw (engine.acceptance): kind
                                       "request" (it fell back to plain decoding for a cool-down) or "drafter"
  prefix_cache_queries_total / prefix_cache_hits_total  prompt tokens looked up in the engine's prefix cache, and
                                       those found cached (vLLM's names; `--enable-prefix-caching`): hits / queries
                                       is the hit rate; both 0 with caching off
  gc_pause_seconds{generation}         Python garbage collections: each pauses every thread (the driver's steps
                                       and the event loop alike); a full (generation 2) pass over a heap holding
                                       torch, transformers and the captured steps takes ~0.1-0.7 s unless the
                                       start-up heap is frozen (`specdec serve` calls gc.freeze() after warm-up)
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["ServerMetrics", "CONTENT_TYPE_LATEST", "PREFIX_PATTERN"]

_STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
                 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


#: a Prometheus metric-name prefix: letters, digits, _ and : (vLLM's dashboards read "vllm:")
PREFIX_PATTERN = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


class ServerMetrics:
    """Every metric carries a `model_name` label (the served model name, as vLLM's do), under `prefix`."""

    def __init__(self, llm, prefix: str = "specdec:", model_name: str = "specdec"):
        import re

        if not isinstance(prefix, str) or not re.fullmatch(PREFIX_PATTERN, prefix):
            raise ValueError(f"metrics prefix must match {PREFIX_PATTERN} (e.g. 'vllm:'), got {prefix!r}")
        self.llm = llm
        self.prefix, self.model_name = prefix, model_name
        self.registry = r = CollectorRegistry(auto_describe=True)
        p = prefix
        m = {"model_name": model_name}

        def counter(name, doc, labels=()):
            metric = Counter(f"{p}{name}", doc, ["model_name", *labels], registry=r)
            return metric if labels else metric.labels(**m)

        def histogram(name, doc, buckets, labels=()):
            metric = Histogram(f"{p}{name}", doc, ["model_name", *labels], buckets=buckets, registry=r)
            return metric if labels else metric.labels(**m)

        def gauge(name, doc, function):
            Gauge(f"{p}{name}", doc, ["model_name"], registry=r).labels(**m).set_function(function)

        self.num_drafts = counter("spec_decode_num_drafts", "Request-steps with at least one draft.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position (0-based).", ["position"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated (every runner output).")
        self.request_success = counter("request_success", "Finished requests by finish reason (stop, length).",
                                       ["finished_reason"])
        self.request_aborted = counter("request_aborted", "Requests aborted (client disconnects).")
        self.request_failed = counter("request_failed", "Requests that failed with a server error.")
        self.requests_received = counter("requests_received", "Requests admitted to a runner.")
        gauge("num_requests_running", "Requests in the running batch.", lambda: llm.num_running)
        gauge("num_requests_waiting", "Requests waiting for a slot.", lambda: llm.num_waiting)
        self.ttft = histogram("time_to_first_token_seconds", "Time from admission to the first token.",
                              _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Time between successive outputs of a request (a step's tokens arrive together).",
                             _LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Time from admission to the last token.", _LATENCY_BUCKETS)
        self.step_seconds = histogram("engine_step_seconds", "Time of one runner step on the driver thread "
                                      "(admission, prefill, decode step, graph capture).", _STEP_BUCKETS,
                                      ["num_draft_tokens", "kind"])
        self.delivery = histogram("output_delivery_seconds", "From the end of a step to its outputs reaching "
                                  "their requests on the event loop.", _STEP_BUCKETS)
        self.handoff_seconds = histogram("driver_handoff_seconds", "Driver thread time handing one step's "
                                         "outputs to metrics and requests (the device waits meanwhile).", _STEP_BUCKETS)
        self.graph_captures = counter("graph_captures", "CUDA graph pairs captured by the runners (start-up "
                                      "warm-up included).")
        gauge("step_shapes", "Distinct decode step shapes the runners have built.",
              lambda: getattr(llm, "step_shapes", 0))
        gauge("step_shapes_run", "Decode step shapes that have served a step (a shape's first step is its first "
              "replay).", lambda: getattr(llm, "step_shapes_run", 0))
        self.prefill_budget = Gauge(f"{p}prefill_budget_tokens", "Prompt tokens the runner's next step may prefill "
                                    "(chunked prefill: a fixed budget, or prefill_budget='auto''s measured one).",
                                    ["num_draft_tokens", "model_name"], registry=r)
        kv = ["model_name"]
        self.kv_usage = Gauge(f"{p}kv_cache_usage_perc", "Fraction of the KV cache held by requests (paged: blocks, "
                              "static: slots).", kv, registry=r).labels(**m)
        self.kv_free = Gauge(f"{p}kv_cache_free_blocks", "Free blocks of the paged KV pool.", kv, registry=r)
        self.kv_used = Gauge(f"{p}kv_cache_used_blocks", "Blocks of the paged KV pool held by requests.", kv, registry=r)
        self.preemptions = counter("num_preemptions", "Requests whose KV blocks were taken back to make room.")
        collapses = Gauge(f"{p}spec_decode_collapses", "Acceptance collapses the γ policy saw (kind=request: a "
                          "request fell back to plain decoding; drafter: speculation off).", kv + ["kind"], registry=r)
        for kind, key in (("request", "collapses"), ("drafter", "drafter_collapses")):
            collapses.labels(kind=kind, **m).set_function(lambda key=key: self._collapses(key))
        self._preemptions_seen = 0
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache (of the queries).")
        self._prefix_seen = (None, 0, 0)  # (the runner, its queries and hits exported so far)
        self._kv_runner = None  # the engine runner whose KV cache usage is exported
        self.gc_pause = histogram("gc_pause_seconds", "Python garbage collection pauses (every thread waits).",
                                  _STEP_BUCKETS, ["generation"])
        self._gc_children = [self.gc_pause.labels(generation=str(g), **m) for g in range(3)]
        _watch_gc(self)
        self._captures_seen = 0
        self._runner_labels: dict[int, str] = {}
        self._per_pos: list = []  # accepted_per_pos children by position (labels() is a locked lookup)
        # this step's counts (driver thread): drafting outputs, drafts, accepted, generated; accepted per position
        self._step_sums = [0, 0, 0, 0]
        self._step_per_pos: list[int] = []
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
        """Driver-thread listener: one RequestOutput. Its draft and token counts are summed and added to the
        counters once per step (`on_step`, before the step's outputs reach the event loop): on this thread the
        device waits, and locked counter updates per accepted token cost ~4x a plain output's."""
        now = time.perf_counter()
        drafted, accepted, n = int(out.num_drafted), int(out.num_accepted), len(out.new_token_ids)
        sums = self._step_sums
        if drafted:
            sums[0] += 1
            sums[1] += drafted
        if accepted:
            sums[2] += accepted
            per_pos = self._step_per_pos
            if len(per_pos) < accepted:
                per_pos.extend([0] * (accepted - len(per_pos)))
            for i in range(accepted):
                per_pos[i] += 1
        sums[3] += n
        if not n and not out.finished:
            return
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
                self.request_success.labels(finished_reason="stop", model_name=self.model_name).inc()
            elif out.finish_reason == "abort":
                self.request_aborted.inc()
            else:
                self.request_success.labels(finished_reason=str(out.finish_reason), model_name=self.model_name).inc()

    def watch_runner(self, runner) -> None:
        """Export `runner`'s KV cache usage (an engine's; the eager loop has none) from now on (a runner is also
        watched from its first step on: a runner rebuilt after a failure replaces the old one)."""
        from specdec.engine import Engine

        if isinstance(runner, Engine):
            with self._lock:
                self._kv_runner = runner

    def on_step(self, timing) -> None:
        """Driver-thread step listener (`text.driver.StepTiming`): the step's time, under the γ its runner serves."""
        label = self._runner_labels.get(id(timing.runner))
        if label is None:
            key = getattr(self.llm, "runner_key", lambda runner: None)(timing.runner)
            label = self._runner_labels[id(timing.runner)] = str(key)
            self.watch_runner(timing.runner)
        self._add_step_sums()
        kind = "admit" if timing.admitted else "decode"
        self.step_seconds.labels(num_draft_tokens=label, kind=kind, model_name=self.model_name).observe(timing.step_s)
        budget = getattr(timing.runner, "step_prefill_budget", None)
        if budget is not None:
            self.prefill_budget.labels(num_draft_tokens=label, model_name=self.model_name).set(budget)
        self.handoff_seconds.observe(timing.deliver_s)

    def _add_step_sums(self) -> None:
        drafts, draft_tokens, accepted, generated = self._step_sums
        if drafts:
            self.num_drafts.inc(drafts)
            self.num_draft_tokens.inc(draft_tokens)
        if accepted:
            self.num_accepted_tokens.inc(accepted)
        if generated:
            self.generation_tokens.inc(generated)
        children = self._per_pos
        for i, count in enumerate(self._step_per_pos):
            if len(children) <= i:
                children.append(self.accepted_per_pos.labels(position=str(i), model_name=self.model_name))
            if count:
                children[i].inc(count)
        self._step_sums = [0, 0, 0, 0]
        self._step_per_pos = []

    def _collapses(self, key: str) -> int:
        watch = getattr(getattr(self._kv_runner, "policy", None), "watch", None)  # (the engine's γ policy)
        return watch.report()[key] if watch is not None else 0

    def delivered(self, seconds: float) -> None:
        self.delivery.observe(seconds)

    def render(self) -> bytes:
        captures = getattr(self.llm, "graph_captures", 0)  # a count read from the runners, exported as a counter
        with self._lock:
            runner = self._kv_runner
        usage = runner.kv_cache_usage if runner is not None else None
        preemptions = usage.num_preemptions if usage is not None else 0
        with self._lock:
            if captures > self._captures_seen:
                self.graph_captures.inc(captures - self._captures_seen)
                self._captures_seen = captures
            if preemptions > self._preemptions_seen:
                self.preemptions.inc(preemptions - self._preemptions_seen)
                self._preemptions_seen = preemptions
            self._add_prefix_counts(runner)
        if usage is not None:
            self.kv_usage.set(usage.usage_perc)
            if usage.num_free_blocks is not None:
                self.kv_free.labels(model_name=self.model_name).set(usage.num_free_blocks)
                self.kv_used.labels(model_name=self.model_name).set(usage.num_used_blocks)
        return _without_created(generate_latest(self.registry))


    def _add_prefix_counts(self, runner) -> None:
        """The runner's prefix-cache counters (cumulative, per runner) into ours: what they gained since the last
        render (a runner rebuilt after a failure starts from 0)."""
        queries, hits = getattr(runner, "prefix_cache_queries", 0), getattr(runner, "prefix_cache_hits", 0)
        seen, seen_queries, seen_hits = self._prefix_seen
        if seen is not runner:
            seen_queries = seen_hits = 0
        if queries > seen_queries:
            self.prefix_queries.inc(queries - seen_queries)
        if hits > seen_hits:
            self.prefix_hits.inc(hits - seen_hits)
        self._prefix_seen = (runner, max(queries, seen_queries), max(hits, seen_hits))


def _without_created(text: bytes) -> bytes:
    """The exposition without prometheus_client's `_created` series (a timestamp per counter and histogram child,
    a third of the series and no information a dashboard uses). Filtered here rather
    than with `prometheus_client.disable_created_metrics()`, which would change every registry in the process."""
    kept = []
    for line in text.split(b"\n"):
        if line.startswith((b"# HELP ", b"# TYPE ")):
            name = line.split(b" ", 3)[2]
        else:
            name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        if not name.endswith(b"_created"):
            kept.append(line)
    return b"\n".join(kept)


def _watch_gc(metrics: ServerMetrics) -> None:
    """Time every garbage collection into `metrics.gc_pause` (gc.callbacks is process-wide: the callback holds the
    metrics weakly and does nothing once they are gone)."""
    ref = weakref.ref(metrics)
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        target = ref()
        if target is None:  # (not removed here: the collector is iterating over gc.callbacks)
            return
        target._gc_children[min(int(info.get("generation", 2)), 2)].observe(time.perf_counter() - started[0])

    gc.callbacks.append(callback)
