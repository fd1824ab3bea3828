"""How long a trivial `guided_choice` request takes while two slow-to-compile JSON schemas are in flight (issue 35,
item 2: one lock for every compile made it wait 12.9 s instead of 0.31 s). A benchmark, not a test: it starts
`specdec serve` on the demo pair, prints JSON and asserts nothing.

    python scripts/bench_grammar_stall.py [--repeat 3] [--serve-arg=--grammar-compile-timeout --serve-arg=60]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import httpx

from specdec.server.bench import ServerProcess

DEMO = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair"


def _slow(i: int) -> dict:
    pattern = "((r{50}){50}){20}".replace("r", "rstuvwxyz"[i % 9])  # a new schema each time: no cache hit
    return {"model": "demo", "prompt": "x = ", "max_tokens": 4,
            "guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}}


def _choice(i: int) -> dict:
    return {"model": "demo", "prompt": "x = ", "max_tokens": 4, "guided_choice": [f"yes{i}", f"no{i}"]}


def _timed(url: str, body: dict, out: list) -> None:
    start = time.perf_counter()
    status = httpx.post(url + "/v1/completions", json=body, timeout=600).status_code
    out.append((time.perf_counter() - start, status))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve-arg", action="append", default=[])
    args = parser.parse_args()
    serve = ["--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"), "--served-model-name", "demo",
             *args.serve_arg]
    rows = []
    with ServerProcess(serve, env={**os.environ, "OMP_NUM_THREADS": "1"}) as url:
        _timed(url, _choice(-1), [])  # the first compile reads the vocabulary
        for r in range(args.repeat):
            alone: list = []
            _timed(url, _choice(2 * r), alone)
            slow: list = []
            threads = [threading.Thread(target=_timed, args=(url, _slow(2 * r + k), slow)) for k in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.3)  # both slow compiles under way
            during: list = []
            _timed(url, _choice(2 * r + 1), during)
            slow_done_when_choice_done = len(slow)
            for t in threads:
                t.join()
            rows.append({"choice_alone_s": round(alone[0][0], 3), "choice_during_two_slow_s": round(during[0][0], 3),
                         "slow_finished_before_choice": slow_done_when_choice_done,
                         "slow_s": [round(s, 2) for s, _ in slow], "slow_status": [c for _, c in slow]})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
