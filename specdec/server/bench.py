"""Load test of a running `specdec serve`: N concurrent streaming clients, plain vs speculative decoding.

Each of N clients sends `requests_per_client` streaming /v1/completions requests one after another (a closed
loop), all clients at once. Per request: time to first token (TTFT), the gaps between streamed chunks
(inter-token latency, ITL: a speculative step delivers its tokens in one chunk), time per output token after
the first (TPOT), and the token count from `usage`. Plain requests ask for `num_draft_tokens: 0` on the same
server, so both modes share the model, the batch limits and the machine. Returns results; never prints.

From the server's /metrics, read before and after each level: τ, the CUDA graphs captured during the level
(`specdec:graph_captures_total`: a capture while timed is a stall of ~0.1 s), the step shapes used for the
first time (`specdec:step_shapes_run`: a new batch or length bucket, its graphs' first replay), and quantiles of the level's
engine steps, of the driver thread's hand-off of a step's outputs and of their delivery to the event loop
(bucket upper bounds of the histograms), and the full garbage collections (each pauses every thread): a long
ITL with short steps is a server-side stall, a long step an engine-side one (admission prefill, capture) or a
collection that ran on the driver thread.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass

from specdec.metrics import percentile

__all__ = ["RequestTiming", "LevelResult", "run_level", "run_benchmark", "run_traffic_level", "served_model", "parse_counters",
           "level_server_stats", "markdown_table", "ServerProcess"]


@dataclass(frozen=True)
class RequestTiming:
    ttft_s: float
    chunk_gaps_s: list[float]
    e2e_s: float
    tokens: int


@dataclass(frozen=True)
class LevelResult:
    mode: str  # "plain" | "speculative"
    concurrency: int
    requests: int
    output_tokens: int
    duration_s: float
    throughput_tok_s: float  # output tokens / wall time of the level
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    tpot_p50_s: float
    accepted_per_step: float | None  # τ from the server's metrics over the level (speculative only)
    graph_captures: int | None = None  # CUDA graph pairs captured while the level ran (None: not exported)
    new_shapes: int | None = None  # step shapes used for the first time during the level (first replays)
    steps: int | None = None  # engine steps during the level
    step_p50_s: float | None = None  # engine step time quantiles (histogram bucket upper bounds)
    step_p99_s: float | None = None
    step_max_s: float | None = None  # upper bound of the slowest step's bucket
    decode_step_p99_s: float | None = None  # steps that admitted nothing
    admit_steps: int | None = None  # steps that admitted (and prefilled) requests
    admit_step_max_s: float | None = None
    handoff_p99_s: float | None = None  # driver thread: handing a step's outputs over
    delivery_p99_s: float | None = None  # a step's outputs: driver thread → event loop
    gc_full_passes: int | None = None  # full (generation 2) garbage collections during the level
    gc_full_max_s: float | None = None  # upper bound of the longest one's bucket
    prefill_budget_tokens: dict | None = None  # per runner (its γ): the chunked-prefill budget at the level's end
    arrival: str | None = None  # how the level's requests arrived ("closed:C", "poisson:R/s"); None = closed loop

    def to_dict(self) -> dict:
        return asdict(self)


async def _one(client, url: str, body: dict) -> RequestTiming:
    start = time.perf_counter()
    first = last = None
    gaps, tokens = [], 0
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                continue
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    end = time.perf_counter()
    return RequestTiming(ttft_s=(first or end) - start, chunk_gaps_s=gaps, e2e_s=end - start, tokens=tokens)


async def served_model(client, url: str) -> str:
    """The name the server serves (the first of /v1/models): requests naming another model get a 404."""
    response = await client.get(url + "/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run_level(url: str, prompts: list[str], *, mode: str, concurrency: int, requests_per_client: int,
                    max_tokens: int, num_draft_tokens: int, model: str | None = None) -> LevelResult:
    import httpx

    async def client_loop(client, index: int) -> list[RequestTiming]:
        out = []
        for r in range(requests_per_client):
            body = {"model": model, "prompt": prompts[(index + r) % len(prompts)], "max_tokens": max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                    "specdec": {"num_draft_tokens": 0 if mode == "plain" else num_draft_tokens}}
            out.append(await _one(client, url, body))
        return out

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        model = model or await served_model(client, url)
        before = await server_counters(client, url)
        start = time.perf_counter()
        per_client = await asyncio.gather(*(client_loop(client, i) for i in range(concurrency)))
        duration = time.perf_counter() - start
        after = await server_counters(client, url)
    timings = [t for ts in per_client for t in ts]
    return _level_result(mode, concurrency, timings, duration, before, after)


async def run_traffic_level(url: str, bodies: list[dict], *, mode: str, clients: int = 0, rate: float | None = None,
                            seed: int = 0, model: str | None = None) -> LevelResult:
    """Traffic with its own bodies (prompt, max_tokens, temperature, seed per request): `clients` > 0 — a closed
    loop of that many clients taking the next body as their last request finished; else Poisson arrivals at
    `rate` requests/s. mode "plain" asks each request for num_draft_tokens 0, "speculative" leaves the server's
    default (its --num-draft-tokens)."""
    import random

    import httpx

    if clients <= 0 and not (rate and rate > 0):
        raise ValueError("run_traffic_level needs clients > 0 (a closed loop) or a Poisson rate > 0")
    extra = {"specdec": {"num_draft_tokens": 0}} if mode == "plain" else {}

    def body(i: int) -> dict:
        return {"model": model, **bodies[i], "stream": True, "stream_options": {"include_usage": True}, **extra}

    limit = (clients or len(bodies)) + 4
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=limit,
                                                                  max_keepalive_connections=limit)) as client:
        model = model or await served_model(client, url)
        before = await server_counters(client, url)
        start = time.perf_counter()
        if clients > 0:
            order = iter(range(len(bodies)))

            async def client_loop() -> list[RequestTiming]:
                return [await _one(client, url, body(i)) for i in order]  # one shared iterator: next free body

            per_client = await asyncio.gather(*(client_loop() for _ in range(clients)))
            timings = [t for ts in per_client for t in ts]
        else:
            rng, offsets, t = random.Random(seed + 7), [], 0.0
            for _ in bodies:
                offsets.append(t)
                t += rng.expovariate(rate)

            async def arrive(i: int) -> RequestTiming:
                await asyncio.sleep(max(offsets[i] - (time.perf_counter() - start), 0.0))
                return await _one(client, url, body(i))

            timings = await asyncio.gather(*(arrive(i) for i in range(len(bodies))))
        duration = time.perf_counter() - start
        after = await server_counters(client, url)
    return _level_result(mode, clients, list(timings), duration, before, after,
                         arrival=f"closed:{clients}" if clients > 0 else f"poisson:{rate:g}/s")


class ServerProcess:
    """`specdec serve ARGS` on a free local port, as a context manager: `with ServerProcess([...]) as url:`.
    Waits for /health (up to `start_timeout_s`); the server's stderr lines starting with "specdec serve" (its
    warm-up report) are in `.log_lines` after exit."""

    def __init__(self, args: list[str], start_timeout_s: float = 300.0, env: dict | None = None):
        self.args, self.start_timeout_s, self.env = list(args), start_timeout_s, env
        self.proc, self.log_lines = None, []

    def __enter__(self) -> str:
        import os
        import socket
        import subprocess
        import sys
        import tempfile

        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "specdec", "serve", *self.args, "--port", str(port)]
        self.proc = subprocess.Popen(cmd, env=self.env or dict(os.environ), stdout=subprocess.DEVNULL, stderr=self._log)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + self.start_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                tail = " | ".join(self._log.read().strip().splitlines()[-3:])
                raise RuntimeError(f"specdec serve exited with {self.proc.returncode}: {tail}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"specdec serve did not start within {self.start_timeout_s:g} s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a server that does not stop is killed
                self.proc.kill()
        self._log.seek(0)
        self.log_lines = [line for line in self._log.read().splitlines() if line.startswith("specdec serve")]
        self._log.close()


_HISTOGRAMS = {"step": "specdec:engine_step_seconds", "handoff": "specdec:driver_handoff_seconds",
               "delivery": "specdec:output_delivery_seconds"}
_GC = "specdec:gc_pause_seconds"


def parse_counters(text: str) -> dict:
    """The /metrics values a level reads: drafts, accepted, captures (None when not exported) and, per histogram
    of `_HISTOGRAMS`, {upper bound: cumulative count} summed over its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {"drafts": 0.0, "accepted": 0.0, "captures": None, "shapes_run": None, "gc2": {}, "step_decode": {}, "step_admit": {},
              "prefill_budget": {}, **{k: {} for k in _HISTOGRAMS}}
    buckets = {f"{name}_bucket": key for key, name in _HISTOGRAMS.items()}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "specdec:spec_decode_num_drafts_total":
                values["drafts"] = s.value
            elif s.name == "specdec:spec_decode_num_accepted_tokens_total":
                values["accepted"] = s.value
            elif s.name == "specdec:graph_captures_total":
                values["captures"] = s.value
            elif s.name == "specdec:step_shapes_run":
                values["shapes_run"] = s.value
            elif s.name == "specdec:prefill_budget_tokens":
                values["prefill_budget"][s.labels.get("num_draft_tokens", "")] = s.value
            elif s.name == f"{_GC}_bucket" and s.labels.get("generation") == "2":
                values["gc2"][float(s.labels["le"])] = s.value
            elif s.name in buckets:
                bound = float(s.labels["le"])
                keys = [buckets[s.name]]
                if keys[0] == "step" and s.labels.get("kind") in ("decode", "admit"):
                    keys.append(f"step_{s.labels['kind']}")
                for key in keys:
                    values[key][bound] = values[key].get(bound, 0.0) + s.value
    return values


async def server_counters(client, url: str) -> dict:
    return parse_counters((await client.get(url + "/metrics")).text)


def _bucket_quantile(before: dict, after: dict, q: float) -> float | None:
    """The upper bound of the bucket holding quantile q of the observations between two cumulative histograms
    (q = 1: the slowest one's bucket; inf when it is past the last bound)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    for bound, count in zip(bounds, counts):
        if count >= q * total - 1e-9:
            return bound
    return bounds[-1]


def level_server_stats(before: dict, after: dict) -> dict:
    """LevelResult's server-side fields from the counters read before and after a level."""
    step = after["step"]
    out = {"graph_captures": None if after["captures"] is None else int(after["captures"] - (before["captures"] or 0)),
           "new_shapes": None if after["shapes_run"] is None else int(after["shapes_run"] - (before["shapes_run"] or 0)),
           "steps": int(step[max(step)] - before["step"].get(max(step), 0.0)) if step else None,
           "step_p50_s": _bucket_quantile(before["step"], step, 0.5),
           "step_p99_s": _bucket_quantile(before["step"], step, 0.99),
           "step_max_s": _bucket_quantile(before["step"], step, 1.0),
           "decode_step_p99_s": _bucket_quantile(before["step_decode"], after["step_decode"], 0.99),
           "admit_steps": None, "admit_step_max_s": _bucket_quantile(before["step_admit"], after["step_admit"], 1.0),
           "handoff_p99_s": _bucket_quantile(before["handoff"], after["handoff"], 0.99),
           "delivery_p99_s": _bucket_quantile(before["delivery"], after["delivery"], 0.99),
           "gc_full_passes": None, "gc_full_max_s": None}
    admit = after["step_admit"]
    if admit:
        out["admit_steps"] = int(admit[max(admit)] - before["step_admit"].get(max(admit), 0.0))
    gc2 = after["gc2"]
    if gc2:
        out["gc_full_passes"] = int(gc2[max(gc2)] - before["gc2"].get(max(gc2), 0.0))
        out["gc_full_max_s"] = _bucket_quantile(before["gc2"], gc2, 1.0)
    out["prefill_budget_tokens"] = dict(after.get("prefill_budget") or {}) or None
    return out


def run_benchmark(url: str, prompts: list[str], *, concurrency: list[int], requests_per_client: int = 2,
                  max_tokens: int = 64, num_draft_tokens: int = 4, warmup: bool = True) -> list[LevelResult]:
    """Every concurrency level, plain then speculative, against the server at `url`."""

    async def main():
        results = []
        if warmup:
            for mode in ("plain", "speculative"):
                await run_level(url, prompts, mode=mode, concurrency=1, requests_per_client=1, max_tokens=8,
                                num_draft_tokens=num_draft_tokens)
        for n in concurrency:
            for mode in ("plain", "speculative"):
                results.append(await run_level(url, prompts, mode=mode, concurrency=n,
                                               requests_per_client=requests_per_client, max_tokens=max_tokens,
                                               num_draft_tokens=num_draft_tokens))
        return results

    return asyncio.run(main())


def markdown_table(results: list[LevelResult]) -> str:
    def ms(value, digits=0):
        return "–" if value is None else "inf" if value == float("inf") else f"{1e3 * value:.{digits}f}"

    rows = ["| clients | mode | requests | tokens | throughput (tok/s) | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) "
            "| TPOT p50 (ms) | τ | captures / new shapes | steps | step p50 / p99 / max (ms ≤) | decode-step p99 (ms ≤) "
            "| admit steps (max ms ≤) | hand-off / delivery p99 (ms ≤) | full GCs (max ms ≤) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        tau = f"{r.accepted_per_step:.2f}" if r.accepted_per_step is not None else "–"
        captures = "–" if r.graph_captures is None else str(r.graph_captures)
        if r.new_shapes is not None:
            captures += f" / {r.new_shapes}"
        steps = "–" if r.steps is None else str(r.steps)
        rows.append(f"| {r.arrival or r.concurrency} | {r.mode} | {r.requests} | {r.output_tokens} | {r.throughput_tok_s:.1f} | "
                    f"{1e3 * r.ttft_p50_s:.0f} / {1e3 * r.ttft_p99_s:.0f} | {1e3 * r.itl_p50_s:.1f} / "
                    f"{1e3 * r.itl_p99_s:.1f} | {1e3 * r.tpot_p50_s:.1f} | {tau} | {captures} | {steps} | "
                    f"{ms(r.step_p50_s, 1)} / {ms(r.step_p99_s, 1)} / {ms(r.step_max_s, 1)} | "
                    f"{ms(r.decode_step_p99_s, 1)} | {'–' if r.admit_steps is None else r.admit_steps} "
                    f"({ms(r.admit_step_max_s, 1)}) | "
                    f"{ms(r.handoff_p99_s, 1)} / {ms(r.delivery_p99_s, 1)} | "
                    f"{'–' if r.gc_full_passes is None else r.gc_full_passes} ({ms(r.gc_full_max_s)}) |")
    return "\n".join(rows)


def _level_result(mode: str, concurrency: int, timings: list, duration: float, before: dict, after: dict,
                  arrival: str | None = None) -> "LevelResult":
    """One level's row from its requests' timings and the server's counters before and after it."""
    tokens = sum(t.tokens for t in timings)
    gaps = [g for t in timings for g in t.chunk_gaps_s]
    tpot = [(t.e2e_s - t.ttft_s) / (t.tokens - 1) for t in timings if t.tokens > 1]
    steps = after["drafts"] - before["drafts"]
    tau = (after["accepted"] - before["accepted"] + steps) / steps if mode != "plain" and steps else None
    return LevelResult(
        mode=mode, concurrency=concurrency, requests=len(timings), output_tokens=tokens, duration_s=duration,
        throughput_tok_s=tokens / duration if duration > 0 else 0.0,
        ttft_p50_s=percentile([t.ttft_s for t in timings], 0.5), ttft_p99_s=percentile([t.ttft_s for t in timings], 0.99),
        itl_p50_s=percentile(gaps, 0.5), itl_p99_s=percentile(gaps, 0.99), tpot_p50_s=percentile(tpot, 0.5),
        accepted_per_step=tau, arrival=arrival, **level_server_stats(before, after),
    )
