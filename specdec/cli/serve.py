"""`specdec serve`: an OpenAI-compatible server (completions, chat, SSE streaming, /metrics, playground at /)."""

from __future__ import annotations

import argparse
import gc
import math
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server with Prometheus metrics and a playground",
                              description=__doc__)
    p.add_argument("--target", required=True, type=Path, help="target checkpoint directory")
    p.add_argument("--draft", default=None, help="draft checkpoint directory, prompt-lookup or ngram (with --ngram-data)")
    p.add_argument("--ngram-data", type=Path, default=None, help="text file the ngram drafter is fitted on")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: --target)")
    p.add_argument("--chat-template", type=Path, default=None, help="Jinja chat template file (default: the tokenizer's)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model name in responses (default: the target folder's)")
    p.add_argument("--num-draft-tokens", default="4", help="γ for speculative requests (requests may ask for 0 = plain)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=None, help="context per request (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=None, help="largest max_tokens a request may ask for")
    p.add_argument("--runner", default="auto", choices=("auto", "engine", "fallback"),
                   help="auto: the request-level engine where it covers the model, else the eager loop")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--allow-pickle", action="store_true", help="allow .bin/.pt weights (pickle can run code)")
    p.add_argument("--synthetic-acceptance", type=float, default=None, metavar="ALPHA",
                   help="BENCHMARK ONLY: accept each draft with probability ALPHA (a random pair at a known α); "
                        "the output is then NOT the target's distribution")
    p.add_argument("--switch-interval", type=float, default=None, metavar="SECONDS",
                   help="Python's thread switch interval (sys.setswitchinterval; Python's default 0.005)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(run=run)


def build(args: argparse.Namespace):
    """(app, llm) from the parsed arguments (the tests use it without starting uvicorn)."""
    import specdec
    from specdec.cli import CLIError
    from specdec.server import create_app

    for name in ("port", "max_batch_size", "max_seq_len", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "port" else 1):
            raise CLIError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    interval = getattr(args, "switch_interval", None)
    if interval is not None and not (math.isfinite(interval) and 0 < interval <= 1):
        raise CLIError(f"--switch-interval must be a number of seconds in (0, 1], got {interval}")
    if args.ngram_data is not None and not args.ngram_data.is_file():
        raise FileNotFoundError(f"--ngram-data file not found: {args.ngram_data}")
    gamma = args.num_draft_tokens.strip()
    gamma = int(gamma) if gamma.isdigit() else gamma
    llm = specdec.load(args.target, args.draft, tokenizer=args.tokenizer, device=args.device, dtype=args.dtype,
                       num_draft_tokens=gamma, chat_template=str(args.chat_template) if args.chat_template else None,
                       allow_pickle=args.allow_pickle, runner=args.runner, max_batch_size=args.max_batch_size,
                       max_seq_len=args.max_seq_len, ngram_data=args.ngram_data,
                       synthetic_acceptance=getattr(args, "synthetic_acceptance", None))
    name = args.served_model_name or Path(args.target).resolve().name
    return create_app(llm, model_name=name, max_tokens_limit=args.max_tokens), llm


def run(args: argparse.Namespace) -> int:
    from specdec.cli import CLIError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise CLIError(f"specdec serve needs {err.name}: pip install 'specdec[serve]'") from None
    app, llm = build(args)
    for gamma in {llm.num_draft_tokens, 0} if llm.drafter is not None else {0}:
        llm.runner(gamma)  # build (and on CUDA, capture) before the first request, not during it
    for gamma, r in sorted(llm.warmups.items(), key=lambda kv: str(kv[0])):
        print(f"specdec serve: warm-up num_draft_tokens={gamma}: {r['shapes']} decode step shapes captured in "
              f"{r['seconds']:.1f} s (batch sizes {r['batch_sizes']}, γ {r['gammas']}, {r['length_buckets']} length "
              f"buckets, T=0 and T=1)" + ("" if r["complete"] else f"; requests past {r['max_length']} tokens capture "
                                          "on first use (warm-up bound)"), file=sys.stderr)
    # Everything alive now (torch, transformers, the models, the captured steps: ~0.4M objects) lives as long as
    # the server: frozen, the collector's full passes skip it. Unfrozen, each full pass walks it all and pauses
    # every thread for 0.1-0.7 s (measured on the demo pair), a gap every running stream sees.
    gc.collect()
    gc.freeze()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    print(f"specdec serve: {gc.get_freeze_count()} start-up objects frozen (out of the garbage collector's passes)",
          file=sys.stderr)
    if llm.synthetic_acceptance is not None:
        print(f"specdec serve: BENCHMARK ONLY: drafts accepted with probability {llm.synthetic_acceptance} "
              "(the output is not the target's distribution)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"specdec serve: listening on {args.host}: reachable from other machines, with no authentication",
              file=sys.stderr)
    print(f"specdec serve: {app.state.model_name} ({llm.runner_kind} runner, γ={llm.num_draft_tokens}) on "
          f"http://{args.host}:{args.port}  (playground at /, metrics at /metrics)", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        llm.close()
    return 0
