"""Serving benchmark: N concurrent streaming clients against `specdec serve`, plain vs speculative.

    python scripts/bench_serve.py --target specdec/assets/demo_pair/target --draft specdec/assets/demo_pair/draft \
        --concurrency 1 8 --max-tokens 64
    python scripts/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1 8 32 64   # a server already running

Starts `specdec serve` on a free local port unless --url is given; prints a markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.cli.demo import PROMPTS  # noqa: E402
from specdec.server.bench import markdown_table, run_benchmark  # noqa: E402


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specdec", "serve", "--target", str(args.target), "--port", str(port),
           "--num-draft-tokens", str(args.num_draft_tokens), "--max-batch-size", str(max(args.concurrency)),
           "--device", args.device, "--dtype", args.dtype]
    if args.draft:
        cmd += ["--draft", str(args.draft)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"specdec serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("specdec serve did not start within 300 s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--target", type=Path, default=ROOT / "specdec/assets/demo_pair/target")
    p.add_argument("--draft", default=str(ROOT / "specdec/assets/demo_pair/draft"))
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    try:
        results = run_benchmark(url, list(PROMPTS), concurrency=args.concurrency,
                                requests_per_client=args.requests_per_client, max_tokens=args.max_tokens,
                                num_draft_tokens=args.num_draft_tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(markdown_table(results))
    print(json.dumps([r.to_dict() for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
