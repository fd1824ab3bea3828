"""Serving benchmark: N concurrent streaming clients against `specdec serve`, plain vs speculative.

    python scripts/bench_serve.py --target specdec/assets/demo_pair/target --draft specdec/assets/demo_pair/draft \
        --concurrency 1 8 --max-tokens 64
    python scripts/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1 8 32 64   # a server already running
    python scripts/bench_serve.py --random-pair --device cuda --dtype bfloat16 --concurrency 1 8 32 64 \
        --max-tokens 128 --out serve.json   # zoo-gpu-shaped random pair, drafts accepted with probability 0.75

Starts `specdec serve` on a free local port unless --url is given; prints the server's warm-up line, a markdown
table (with the CUDA graphs captured during each level and the server's step quantiles) and a JSON line.
--random-pair [PRESET] saves a random pair of the zoo preset's shapes (default gpu: the 317M Llama target and
its 2-layer drafter) with the demo tokenizer to a temporary folder and serves it with --synthetic-acceptance
(default 0.75, BENCHMARK ONLY: random weights have no meaningful α), so it needs no trained pair.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS  # noqa: E402
from specdec.server.bench import markdown_table, run_benchmark  # noqa: E402


def save_random_pair(preset: str, folder: Path) -> tuple[Path, Path]:
    """A random target and drafter of the zoo preset's shapes (bf16 safetensors), with the demo tokenizer."""
    import shutil

    import torch

    from specdec.zoo.presets import get_preset
    from specdec.zoo.models import build_model

    demo = ROOT / "specdec/assets/demo_pair/target"
    shapes = get_preset(preset)
    for name, shape, seed in (("target", shapes.target, 0), ("draft", shapes.drafts[0].shape, 1)):
        model = build_model(shape, 8192, seed=seed).to(torch.bfloat16)  # the demo tokenizer's vocabulary
        model.save_pretrained(folder / name)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(demo / file, folder / name / file)
    return folder / "target", folder / "draft"


def start_server(args, log) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specdec", "serve", "--target", str(args.target), "--port", str(port),
           "--num-draft-tokens", str(args.num_draft_tokens),
           "--max-batch-size", str(args.max_batch_size or max(args.concurrency)), "--device", args.device,
           "--dtype", args.dtype]
    if args.draft:
        cmd += ["--draft", str(args.draft)]
    if args.synthetic_acceptance is not None:
        cmd += ["--synthetic-acceptance", str(args.synthetic_acceptance)]
    if args.switch_interval is not None:
        cmd += ["--switch-interval", str(args.switch_interval)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"specdec serve exited with {proc.returncode}:\n{Path(log.name).read_text()[-4000:]}")
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
    p.add_argument("--max-batch-size", type=int, default=None, help="the server's (default: the largest --concurrency)")
    p.add_argument("--random-pair", nargs="?", const="gpu", default=None, metavar="PRESET",
                   help="serve a random pair of this zoo preset's shapes (default gpu) instead of --target/--draft")
    p.add_argument("--synthetic-acceptance", type=float, default=None, metavar="ALPHA",
                   help="BENCHMARK ONLY, passed to the server (default 0.75 with --random-pair)")
    p.add_argument("--switch-interval", type=float, default=None, help="the server's --switch-interval")
    p.add_argument("--out", type=Path, default=None, help="write the results (and the server's log lines) as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        if args.random_pair is not None and args.url is None:
            start = time.perf_counter()
            args.target, args.draft = save_random_pair(args.random_pair, Path(tmp))
            if args.synthetic_acceptance is None:
                args.synthetic_acceptance = 0.75
            print(f"random {args.random_pair} pair saved in {time.perf_counter() - start:.1f} s; drafts accepted "
                  f"with probability {args.synthetic_acceptance} (BENCHMARK ONLY)", file=sys.stderr)
        proc, url, lines = None, args.url, []
        with open(Path(tmp) / "serve.log", "w+") as log:
            if url is None:
                start = time.perf_counter()
                proc, url = start_server(args, log)
                print(f"server ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            try:
                results = run_benchmark(url, list(PROMPTS), concurrency=args.concurrency,
                                        requests_per_client=args.requests_per_client, max_tokens=args.max_tokens,
                                        num_draft_tokens=args.num_draft_tokens)
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
                log.flush()
                lines = [line for line in Path(log.name).read_text().splitlines() if line.startswith("specdec serve")]
    for line in lines:
        print(line, file=sys.stderr)
    print(markdown_table(results))
    print(json.dumps([r.to_dict() for r in results]))
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "server_log": lines,
                                        "results": [r.to_dict() for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
