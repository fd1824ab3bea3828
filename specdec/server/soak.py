"""A soak of a running `specdec serve`: many mixed requests, the server's resident memory sampled as they complete.

The mix (`MIX`, one request per entry in turn): completions and chats, greedy and sampled, streamed (one in
`MIX` read to the end, one dropped after its first chunk: a client that disconnects), plain decoding
(`num_draft_tokens: 0`), `guided_choice`, a JSON schema (a new schema each time: one request in `len(MIX)` brings
a new grammar) and a bad request (a 400). `run_soak` sends `requests` of
them from `clients` threads and reads the server's RSS (`/proc/<pid>/status`) every `sample_every` completed
requests; `SoakResult.slope_mb_per_100` is the least-squares slope of RSS over completed requests after the
warm-up (`warmup` of them: caches, graphs and arenas filling). Used by `tests/server/test_soak.py` (its quick
form, a generous bound) and `scripts/soak_server.py` (the full form, numbers). Never prints.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MIX", "SoakResult", "run_soak", "rss_mb", "server_pid"]

MIX = ("completion", "chat", "stream", "guided_choice", "dropped_stream", "completion_sampled", "json_schema",
       "plain", "bad_request", "chat_sampled")


@dataclass(frozen=True)
class SoakResult:
    requests: int
    seconds: float
    statuses: dict  # HTTP status → count (0 = a stream the client dropped on purpose)
    samples: list = field(repr=False)  # (completed requests, RSS MB)
    slope_mb_per_100: float  # RSS growth per 100 requests after the warm-up (least squares)
    rss_start_mb: float  # at the end of the warm-up
    rss_end_mb: float


def rss_mb(pid: int) -> float:
    """The resident set of process `pid` in MB (Linux `/proc`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for process {pid}")


def server_pid(port: int) -> int | None:
    """The pid of the `specdec serve ... --port PORT` process on this machine, or None (Linux `/proc`)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and b"--port" in args and str(port).encode() in args:
            return int(proc.name)
    return None


def _body(kind: str, i: int, model: str) -> tuple[str, dict]:
    prompt = f"def f{i % 7}(x):\n    return"
    chat = [{"role": "user", "content": f"write f{i % 5}"}]
    base = {"model": model, "max_tokens": 6}
    bodies = {
        "completion": ("/v1/completions", {**base, "prompt": prompt, "temperature": 0}),
        "completion_sampled": ("/v1/completions", {**base, "prompt": prompt, "temperature": 1.0, "seed": i}),
        "chat": ("/v1/chat/completions", {**base, "messages": chat, "temperature": 0}),
        "chat_sampled": ("/v1/chat/completions", {**base, "messages": chat, "temperature": 0.8, "seed": i}),
        "stream": ("/v1/completions", {**base, "prompt": prompt, "stream": True}),
        "dropped_stream": ("/v1/completions", {**base, "prompt": prompt, "stream": True, "max_tokens": 32}),
        "plain": ("/v1/completions", {**base, "prompt": prompt, "num_draft_tokens": 0}),
        "guided_choice": ("/v1/completions", {**base, "prompt": prompt, "guided_choice": ["yes", "no"]}),
        "json_schema": ("/v1/completions", {**base, "prompt": prompt, "max_tokens": 12, "guided_json": {
            "type": "object", "properties": {f"k{i // len(MIX)}": {"type": "integer"}},
            "required": [f"k{i // len(MIX)}"]}}),
        "bad_request": ("/v1/completions", {**base, "prompt": prompt, "temperature": -1}),
    }
    return bodies[kind]


def _send(client, url: str, kind: str, i: int, model: str) -> int:
    path, body = _body(kind, i, model)
    if not body.get("stream"):
        return client.post(url + path, json=body).status_code
    with client.stream("POST", url + path, json=body) as response:
        for _ in response.iter_lines():
            if kind == "dropped_stream":
                return 0  # leaving the block closes the connection mid-stream
        return response.status_code


def run_soak(url: str, pid: int, *, requests: int = 300, clients: int = 4, sample_every: int = 10,
             warmup: int = 50, model: str = "demo", timeout_s: float = 120.0) -> SoakResult:
    """Send `requests` mixed requests (`MIX`) from `clients` threads to `url`; sample the RSS of `pid`."""
    import httpx

    counter, lock = itertools.count(), threading.Lock()
    statuses: Counter = Counter()
    samples: list[tuple[int, float]] = []
    done = [0]
    failures: list[BaseException] = []

    def worker() -> None:
        with httpx.Client(timeout=timeout_s) as client:
            while (i := next(counter)) < requests:
                try:
                    status = _send(client, url, MIX[i % len(MIX)], i, model)
                except Exception as err:  # noqa: BLE001 - reported to the caller below
                    failures.append(err)
                    return
                with lock:
                    statuses[status] += 1
                    done[0] += 1
                    if done[0] % sample_every == 0:
                        samples.append((done[0], rss_mb(pid)))

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, name=f"soak-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"soak: a request failed: {type(failures[0]).__name__}: {failures[0]}")
    after = [(n, mb) for n, mb in samples if n >= warmup] or samples
    return SoakResult(requests, time.perf_counter() - start, dict(statuses), samples, 100 * _slope(after),
                      after[0][1], after[-1][1])


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
