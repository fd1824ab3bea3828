"""Resident memory of `specdec serve` and its answers under concurrency (issue 36's serving target), measured
through the real entry point: start the server, send each prompt alone (the reference), then all of them at once,
check every concurrent answer equals its lone one, and read the server process's memory from /proc.

    python scripts/serve_memory.py --target SmolLM2-135M-Instruct.Q4_1.gguf --draft specdec/assets/smol_head \
        --serve-arg=--max-batch-size --serve-arg=256 --serve-arg=--max-seq-len --serve-arg=8192

(default target: the shipped demo pair.) Greedy completions of `--max-tokens` tokens over `--requests` distinct
prompts (`specdec.bench.demo_pair.PAIR_PROMPTS`, each behind a numbered comment line); the concurrent burst is one
asyncio client with a connection per request, and /metrics is polled while it runs for the most requests running
at once. Prints one JSON line: the server's VmRSS / VmHWM / RssAnon / RssFile (GB, /proc/PID/status) when ready,
after the lone requests and after the burst; the KV cache line of its start-up report; matches = concurrent answers
equal to the lone ones (`mismatched`: the prompts whose answers differ); `peak_running`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair"
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def proc_memory(pid: int) -> dict:
    """VmRSS, VmHWM, RssAnon and RssFile of process `pid`, in GB (Linux /proc)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            values[key] = round(int(rest.split()[0]) * 1024 / 1e9, 3)
    return values


def prompts(count: int) -> list[str]:
    """`count` distinct code prompts (the demo pair's, each behind `# task i`)."""
    from specdec.bench.demo_pair import PAIR_PROMPTS

    return [f"# task {i}\n{PAIR_PROMPTS[i % len(PAIR_PROMPTS)]}" for i in range(count)]


async def _complete(client, url: str, model: str, prompt: str, max_tokens: int) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = await client.post(url + "/v1/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    return response.json()["choices"][0]["text"]


def _running(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("specdec:num_requests_running") and not line.startswith("#"):
            return int(float(line.split()[-1]))
    return 0


async def measure(url: str, pid: int, texts: list[str], max_tokens: int) -> dict:
    """Lone requests, then all at once; memory after each phase (see the module doc)."""
    import httpx

    limits = httpx.Limits(max_connections=len(texts) + 4, max_keepalive_connections=len(texts) + 4)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        row = {"ready": proc_memory(pid)}
        start = time.perf_counter()
        alone = [await _complete(client, url, model, p, max_tokens) for p in texts]
        row["alone_s"] = round(time.perf_counter() - start, 1)
        row["after_alone"] = proc_memory(pid)
        peak = [0]

        async def watch():
            while True:
                peak[0] = max(peak[0], _running((await client.get(url + "/metrics")).text))
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        start = time.perf_counter()
        together = await asyncio.gather(*(_complete(client, url, model, p, max_tokens) for p in texts))
        row["concurrent_s"] = round(time.perf_counter() - start, 1)
        watcher.cancel()
        row["after_concurrent"] = proc_memory(pid)
    row["peak_running"] = peak[0]
    row["matches"] = sum(a == b for a, b in zip(alone, together))
    row["mismatched"] = [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    row["sample"] = together[0]
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=str(DEMO / "target"))
    parser.add_argument("--draft", default=None, help="default: the demo pair's draft with the default target")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the server (default: as set)")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `specdec serve` argument")
    args = parser.parse_args(argv)
    from specdec.server.bench import ServerProcess

    draft = args.draft or (str(DEMO / "draft") if args.target == str(DEMO / "target") else None)
    serve = ["--target", args.target, *(["--draft", draft] if draft else []), *args.serve_arg]
    env = dict(os.environ)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    server = ServerProcess(serve, start_timeout_s=900, env=env)
    with server as url:
        row = asyncio.run(measure(url, server.proc.pid, prompts(args.requests), args.max_tokens))
    row = {"serve": serve, "requests": args.requests, "max_tokens": args.max_tokens, **row,
           "kv_cache": next((line.split(": ", 1)[1] for line in server.log_lines if "KV cache:" in line), None)}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
