"""`specdec serve`: an OpenAI-compatible server (completions, chat with tool calls, responses, SSE streaming,
/tokenize, /metrics, API docs at /docs, playground at /).

Every option is checked, and the port bound, before the model loads: a bad value or a busy port is one line
and exit code 2. By default only this machine can connect and only loopback Host / Origin headers are served
(DNS rebinding); --api-key requires `Authorization: Bearer KEY` on every route but /health, /, /version and
the API docs. Start-up says each phase on stderr (loading, the KV cache, the warm-up, ready; --quiet: silent).
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import sys
from pathlib import Path

from specdec.cli.aliases import GAMMA_FLAGS, RUNNER_OF_ENGINE, add_engine_argument, add_model_arguments
from specdec.cli.common import add_checkpoint_options, add_model_options, apply_model_options, check_int
from specdec.cli.engine_flags import add_engine_flags, check_engine_flags

MAX_CONNECTIONS = 1 << 16



def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server with Prometheus metrics and a playground",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p, draft_help="draft checkpoint (a model folder, .gguf file or cached hub id; or a head "
                        "folder: EAGLE-1/2, EAGLE-3, Medusa, speculators, specdec train head), prompt-lookup or ngram "
                        "(with --ngram-data)")
    p.add_argument("--ngram-data", type=Path, default=None, help="text file the ngram drafter is fitted on")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, .gguf file or hub id (default: --target's)")
    p.add_argument("--chat-template", type=Path, default=None, help="Jinja chat template file (default: the tokenizer's)")
    p.add_argument("--served-model-name", default=None,
                   help="model name in responses (default: the hub id, the .gguf file's stem or the folder's name)")
    p.add_argument(*GAMMA_FLAGS, dest="num_draft_tokens", default="4",
                   help="γ for speculative requests (requests may ask for 0 = plain; llama.cpp's --draft-max)")
    p.add_argument("--max-tokens", type=int, default=None, help="largest max_tokens a request may ask for "
                   "(default: the context)")
    add_engine_argument(p, legacy_runner=True)
    add_engine_flags(p)
    add_model_options(p, seed_help="seed for requests that send none: with it, the n-th such request gets the same "
                      "draws on every run (default: fresh randomness per request)")
    add_checkpoint_options(p)
    grammar = p.add_argument_group("structured outputs (grammar compiles: their own worker threads, off the request path)")
    grammar.add_argument("--grammar-compile-workers", type=int, default=4, metavar="N",
                         help="grammars compiled at once (default: 4)")
    grammar.add_argument("--grammar-compile-timeout", type=float, default=30.0, metavar="SECONDS",
                         help="a request whose grammar does not compile in this time gets a 400 (default: 30)")
    grammar.add_argument("--grammar-cache-mb", type=float, default=512, metavar="MB",
                         help="compiled-grammar cache, LRU (vLLM's VLLM_XGRAMMAR_CACHE_MB; default: 512; 0 = none)")
    net = p.add_argument_group("network and security")
    net.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1: this machine only)")
    net.add_argument("--port", type=int, default=8000, help="TCP port, 1-65535")
    net.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                     help="require Authorization: Bearer KEY on /v1/* and /metrics (default: $SPECDEC_API_KEY, "
                          "else none)")
    net.add_argument("--allowed-hosts", nargs="+", default=[], metavar="NAME",
                     help="Host header names served besides localhost, 127.0.0.1, ::1 and the bind address "
                          "('*' = any; default none)")
    net.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                     help="browser origins (scheme://host[:port]) whose pages may call the API, with CORS headers "
                          "('*' = any; default: pages of allowed hosts only)")
    net.add_argument("--timeout-keep-alive", type=float, default=5.0,
                     help="seconds an idle keep-alive connection stays open")
    net.add_argument("--timeout-read", type=float, default=30.0,
                     help="seconds a request's headers and body may take to arrive (slow or half-sent requests "
                          "are closed)")
    net.add_argument("--max-connections", type=int, default=512,
                     help="open connections at most; more get 503 and are closed")
    net.add_argument("--metrics-prefix", default="specdec:",
                     help="prefix of every Prometheus metric name ('vllm:' for vLLM's dashboards)")
    p.add_argument("--switch-interval", type=float, default=None, metavar="SECONDS",
                   help="Python's thread switch interval (sys.setswitchinterval; default: Python's 0.005)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="shard the target over N GPUs: launch with torchrun --nproc-per-node N -m specdec serve ...; "
                        "rank 0 serves HTTP, the other ranks follow its steps (γ must be an integer)")
    p.add_argument("--tensor-parallel-all-reduce", choices=("auto", "group", "one_shot"), default="auto",
                   help="how the ranks sum partial products: group (NCCL/gloo), one_shot (symmetric memory over "
                        "NVLink, CUDA) or auto (one_shot where the GPUs reach each other by P2P) (default: auto)")
    p.add_argument("--tool-call-parser", default="auto", choices=("auto", "hermes", "mistral", "llama3_json"),
                   help="how tool_choice auto reads calls in the output: auto = the chat template's family "
                        "(Hermes <tool_call>, Mistral [TOOL_CALLS], Llama-3 JSON)")
    p.add_argument("--disable-fastapi-docs", action="store_true",
                   help="do not serve /docs and /openapi.json (served by default)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level")
    p.set_defaults(run=run)


def check_args(args: argparse.Namespace) -> None:
    """Every option's range, before anything loads (CLIError: one line, exit 2)."""
    import re

    from specdec.cli import CLIError
    from specdec.server.metrics import PREFIX_PATTERN

    check_int("--port", args.port, 1, 65535)
    if getattr(args, "tensor_parallel_all_reduce", "auto") != "auto" and getattr(args, "tensor_parallel_size", 1) == 1:
        raise CLIError(f"--tensor-parallel-all-reduce {args.tensor_parallel_all_reduce} needs --tensor-parallel-size > 1")
    if check_int("--tensor-parallel-size", getattr(args, "tensor_parallel_size", 1), 1, 1024) > 1:
        from specdec.policy import POLICY_NAMES

        gamma = args.num_draft_tokens.strip()
        if not gamma.isdigit() and gamma.lower() not in ("auto", *POLICY_NAMES):  # (a policy: rank 0's γ runs)
            raise CLIError(f"--tensor-parallel-size needs an integer, 'auto' or a policy name --num-draft-tokens, "
                           f"got {gamma!r}")
    check_int("--max-tokens", args.max_tokens, 1)
    options = _engine_options(args)
    if options.get("bitwise") and getattr(args, "tensor_parallel_size", 1) > 1:
        raise CLIError("--bitwise needs the request-level engine on one device (not --tensor-parallel-size > 1)")
    check_int("--max-connections", getattr(args, "max_connections", 512), 1, MAX_CONNECTIONS)
    for flag, name in (("--timeout-keep-alive", "timeout_keep_alive"), ("--timeout-read", "timeout_read")):
        value = getattr(args, name, 1.0)
        if not (math.isfinite(value) and 0 < value <= 3600):
            raise CLIError(f"{flag} must be a number of seconds in (0, 3600], got {value}")
    check_int("--grammar-compile-workers", getattr(args, "grammar_compile_workers", 4), 1, 64)
    timeout = getattr(args, "grammar_compile_timeout", 30.0)
    if not (math.isfinite(timeout) and 0 < timeout <= 3600):
        raise CLIError(f"--grammar-compile-timeout must be a number of seconds in (0, 3600], got {timeout}")
    cache_mb = getattr(args, "grammar_cache_mb", 512)
    if not (math.isfinite(cache_mb) and 0 <= cache_mb <= 1 << 20):
        raise CLIError(f"--grammar-cache-mb must be a number of MB in [0, {1 << 20}], got {cache_mb}")
    interval = getattr(args, "switch_interval", None)
    if interval is not None and not (math.isfinite(interval) and 0 < interval <= 1):
        raise CLIError(f"--switch-interval must be a number of seconds in (0, 1], got {interval}")
    prefix = getattr(args, "metrics_prefix", "specdec:")
    if not re.fullmatch(PREFIX_PATTERN, prefix):
        raise CLIError(f"--metrics-prefix must match {PREFIX_PATTERN} (e.g. vllm:), got {prefix!r}")
    if getattr(args, "api_key", None) == "":
        raise CLIError("--api-key must not be empty")
    if args.ngram_data is not None and not args.ngram_data.is_file():
        raise FileNotFoundError(f"--ngram-data file not found: {args.ngram_data}")
    if args.chat_template is not None and not args.chat_template.is_file():
        raise FileNotFoundError(f"--chat-template file not found: {args.chat_template}")
    from specdec.cli.common import model_options
    from specdec.loading import resolve_model_source

    resolve_model_source(args.target, what="--target", model_kwargs=model_options(args))  # exists, before loading


def build(args: argparse.Namespace):
    """(app, llm) from the parsed arguments (the tests use it without starting uvicorn)."""
    import specdec
    from specdec.cli.common import model_options
    from specdec.loading import resolve_model_source
    from specdec.server import create_app
    from specdec.server.guard import GuardConfig

    llm = specdec.load(args.target, args.draft, tokenizer=args.tokenizer, device=args.device, dtype=args.dtype,
                       num_draft_tokens=_gamma(args), chat_template=str(args.chat_template) if args.chat_template else None,
                       allow_pickle=args.allow_pickle, runner=RUNNER_OF_ENGINE[args.engine], ngram_data=args.ngram_data,
                       tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),  # ranks > 0 exit inside
                       tensor_parallel_all_reduce=getattr(args, "tensor_parallel_all_reduce", "auto"),
                       model_kwargs=model_options(args), draft_model_kwargs=model_options(args, "draft"),
                       allow_weight_mismatch=getattr(args, "allow_weight_mismatch", False), **_engine_options(args))
    name = args.served_model_name or resolve_model_source(args.target, model_kwargs=model_options(args)).display_name
    guard = GuardConfig(allowed_hosts=tuple(getattr(args, "allowed_hosts", ())),
                        allowed_origins=tuple(getattr(args, "allowed_origins", ())),
                        bind_host=getattr(args, "host", "127.0.0.1"), api_key=getattr(args, "api_key", None))
    app = create_app(llm, model_name=name, max_tokens_limit=args.max_tokens,
                     metrics_prefix=getattr(args, "metrics_prefix", "specdec:"), guard=guard,
                     default_seed=getattr(args, "seed", None), grammar_compiles=_grammar_compiles(args),
                     tool_call_parser=getattr(args, "tool_call_parser", "auto"),
                     docs=not getattr(args, "disable_fastapi_docs", False))
    return app, llm


def _drafter_name(drafter) -> str:
    """The drafter as a phrase: a draft model's class, a head folder, or the drafter's kind."""
    import torch

    if isinstance(drafter, (str, Path)):
        return f"head {drafter}"
    if isinstance(drafter, torch.nn.Module):
        return f"draft model ({type(drafter).__name__})"
    return type(drafter).__name__


def _grammar_compiles(args: argparse.Namespace):
    from specdec.constrain.compiles import GrammarCompiles

    return GrammarCompiles(workers=getattr(args, "grammar_compile_workers", 4),
                           timeout_s=getattr(args, "grammar_compile_timeout", 30.0),
                           cache_mb=getattr(args, "grammar_cache_mb", 512))


def _gamma(args: argparse.Namespace):
    gamma = args.num_draft_tokens.strip()
    return int(gamma) if gamma.isdigit() else gamma


def _engine_options(args: argparse.Namespace) -> dict:
    """The engine flags given (`cli.engine_flags`), checked as `specdec.load` checks them, naming the flag."""
    return check_engine_flags(args, num_draft_tokens=_gamma(args), loop=args.engine == "hf")


def dropped_generation_config(model) -> list[str]:
    """generation_config settings the server does not apply (repetition_penalty, min_new_tokens,
    no_repeat_ngram_size and bad_words_ids are applied): named at start-up."""
    config = getattr(model, "generation_config", None)
    dropped = []
    for name, neutral in (("encoder_repetition_penalty", 1.0),
                          ("min_length", 0),
                          ("suppress_tokens", None), ("begin_suppress_tokens", None), ("forced_bos_token_id", None),
                          ("forced_eos_token_id", None), ("sequence_bias", None), ("typical_p", 1.0),
                          ("epsilon_cutoff", 0.0), ("eta_cutoff", 0.0)):
        value = getattr(config, name, None) if config is not None else None
        if value is not None and value != neutral:
            dropped.append(f"{name}={value}")
    return dropped


#: file descriptors the process needs besides its connections (models, tokenizer, logs, pipes)
_FD_HEADROOM = 128


def _ensure_descriptors(max_connections: int) -> None:
    """Raise the soft open-files limit to fit --max-connections (up to the hard limit), or refuse: running out of
    descriptors would refuse connections at accept(), /health included, instead of answering 503."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    from specdec.cli import CLIError

    need = max_connections + _FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise CLIError(f"--max-connections {max_connections} needs {need} open files but the limit is {hard} "
                       f"(ulimit -Hn): lower --max-connections to {max(hard - _FD_HEADROOM, 1)}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def run(args: argparse.Namespace) -> int:
    from specdec.cli import CLIError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise CLIError(f"specdec serve needs {err.name}: pip install 'specdec[serve]'") from None
    from specdec.server.http import bind_socket, server_config

    check_args(args)
    _ensure_descriptors(args.max_connections)
    apply_model_options(args)
    if args.tensor_parallel_size > 1 and os.environ.get("RANK", "0") != "0":
        build(args)  # a follower: mirrors rank 0's engine until rank 0 stops serving, then exits (SystemExit)
        return 0
    try:
        sock = bind_socket(args.host, args.port)  # now: a busy port fails before minutes of loading
    except OSError as err:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    from specdec.cli.serve_startup import StartupLog

    startup = StartupLog(quiet=getattr(args, "quiet", False)).install()  # one line per phase on stderr
    try:
        app, llm = build(args)
    except BaseException:
        startup.uninstall()
        sock.close()
        raise
    try:
        return _serve(args, app, llm, sock, uvicorn, startup)
    finally:
        startup.uninstall()
        llm.close()
        sock.close()


def _serve(args, app, llm, sock, uvicorn, startup) -> int:
    from specdec.cli.serve_startup import kv_cache_line, warmup_line

    if llm.drafter is not None:
        startup.say(f"drafter: {_drafter_name(llm.drafter)}, num_draft_tokens={llm.num_draft_tokens}")
    runner = llm.runner()  # built (and on CUDA, captured) at load: every request runs on it
    app.state.metrics.watch_runner(runner)  # its KV cache usage on /metrics from the start
    startup.say(kv_cache_line(runner))
    line = warmup_line(runner, llm.warmups)
    if line is not None:
        startup.say(line)
    for gamma, r in sorted(llm.warmups.items(), key=lambda kv: str(kv[0])):
        if not r["complete"]:
            startup.say(f"warm-up num_draft_tokens={gamma}: requests past {r['max_length']} tokens capture on "
                        "first use (warm-up bound)")
    dropped = dropped_generation_config(llm.target)
    if dropped:
        # not refused: the model is served as the raw target distribution (what vLLM serves with
        # --generation-config vllm); said loudly, since transformers' generate() would apply them
        print(f"specdec serve: WARNING: the model's generation_config asks for {', '.join(dropped)}: NOT applied "
              "(logits processors are not built yet); requests get the raw target distribution", file=sys.stderr)
    # Everything alive now (torch, transformers, the models, the captured steps: ~0.4M objects) lives as long as
    # the server: frozen, the collector's full passes skip it. Unfrozen, each full pass walks it all and pauses
    # every thread for 0.1-0.7 s (measured on the demo pair), a gap every running stream sees.
    gc.collect()
    gc.freeze()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    logging.getLogger(__name__).debug("%d start-up objects frozen (out of the garbage collector's passes)",
                                      gc.get_freeze_count())
    if llm.synthetic_acceptance is not None:
        print(f"specdec serve: BENCHMARK ONLY: drafts accepted with probability {llm.synthetic_acceptance} "
              "(the output is not the target's distribution)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"specdec serve: listening on {args.host}: reachable from other machines, with no API key "
              "(--api-key)", file=sys.stderr)
    docs = "" if getattr(args, "disable_fastapi_docs", False) else ", API docs at /docs"
    startup.say(f"ready: {app.state.model_name} ({llm.runner_kind} runner, γ={llm.num_draft_tokens}) on "
                f"http://{args.host}:{args.port}  (playground at /{docs}, metrics at /metrics)")
    startup.uninstall()
    from specdec.server.http import server_config

    config = server_config(app, host=args.host, port=args.port, read_timeout=args.timeout_read,
                           keep_alive=args.timeout_keep_alive, max_connections=args.max_connections,
                           log_level=args.log_level)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
