"""The soak's full form (a benchmark, not a test): start `specdec serve` on the demo pair (or pass --url and
--pid of a running one), send N mixed requests (`specdec.server.soak.MIX`) from C clients, and print the server's
RSS slope after the warm-up as JSON. The quick form with a bound is tests/server/test_soak.py.

    python scripts/soak_server.py --requests 2000 --clients 4
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specdec.server.bench import ServerProcess
from specdec.server.soak import run_soak

DEMO = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair"
TEMPLATE = "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}def"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--sample-every", type=int, default=20)
    parser.add_argument("--url", default=None)
    parser.add_argument("--pid", type=int, default=None)
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `specdec serve` argument")
    args = parser.parse_args()
    kwargs = dict(requests=args.requests, clients=args.clients, warmup=args.warmup, sample_every=args.sample_every)
    if args.url is not None:
        result = run_soak(args.url, args.pid, **kwargs)
    else:
        template = Path(os.environ.get("TMPDIR", "/tmp")) / "specdec_soak_chat.jinja"
        template.write_text(TEMPLATE, encoding="utf-8")
        serve = ["--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"), "--chat-template", str(template),
                 "--served-model-name", "demo", "--max-batch-size", "16", *args.serve_arg]
        server = ServerProcess(serve, env={**os.environ, "OMP_NUM_THREADS": "1"})
        with server as url:
            result = run_soak(url, server.proc.pid, **kwargs)
    print(json.dumps({"requests": result.requests, "clients": args.clients, "seconds": round(result.seconds, 1),
                      "statuses": result.statuses, "rss_after_warmup_mb": round(result.rss_start_mb, 1),
                      "rss_end_mb": round(result.rss_end_mb, 1),
                      "slope_mb_per_100_requests": round(result.slope_mb_per_100, 3)}, indent=1))


if __name__ == "__main__":
    main()
