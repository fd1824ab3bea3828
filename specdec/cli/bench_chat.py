"""`specdec bench --preset chat`: chat traffic (a shared system prompt, multi-turn conversations re-sending their
history, arrivals while others run) through the engine with prefix caching on/off × speculation on/off in one run
(`specdec.bench.chat`): tiny random models with --quick (CPU), or a real model with --target and the drafter
trained for it with --draft. Writes OUT/chat.json, prints a Markdown table (and with --json one JSON object on the
last line)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.common import check_int, dumps, print_json

#: the chat preset's own options (refused with the other presets)
CHAT_ONLY = ("conversations", "turns", "system_tokens", "user_tokens", "chat_drafter", "random_prompts")
#: other presets' options the chat preset does not read (refused by name)
NOT_CHAT = ("head", "drafters", "slots", "arrival", "policy", "requests_per_slot", "prompt_tokens", "sampled_share",
            "max_seconds", "serve", "pair", "data", "train", "no_hf", "profile", "max_new_tokens", "mixed_step",
            "async_scheduling")


def add_chat_options(p) -> None:
    c = p.add_argument_group("chat (--preset chat; specdec.bench.chat; also --quick, --target/--draft, --clients, "
                             "--new-tokens, --num-draft-tokens, --repeats, --seed)")
    c.add_argument("--conversations", type=int, default=None, help="conversations served (default: 64; --quick 4)")
    c.add_argument("--turns", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                   help="turns per conversation, uniform (default: 3 8)")
    c.add_argument("--system-tokens", type=int, default=None, help="tokens of the shared system prompt (default: 1000)")
    c.add_argument("--user-tokens", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                   help="tokens of each new user message, uniform (default: 16 64)")
    c.add_argument("--chat-drafter", choices=("model", "head"), default=None,
                   help="--quick: the tiny drafter, a model or an untrained feature head (default: model)")
    c.add_argument("--random-prompts", action="store_true", default=None,
                   help="nothing shared: each turn a fresh prompt of random ids (--system-tokens + a user message "
                        "long), no history — what prefix caching costs when nothing hits")


def _given(args, name: str) -> bool:
    value = getattr(args, name, None)
    return value is not None and value is not False


def chat_spec(args: argparse.Namespace):
    """The run's `ChatSpec` from the options (the preset's defaults, --quick's for those not given); every value
    checked, each error naming its option."""
    from specdec.bench.chat import QUICK, ChatSpec

    for name in NOT_CHAT:
        if _given(args, name):
            raise CLIError(f"--{name.replace('_', '-')} does not apply to --preset chat")
    if args.quick == (args.target is not None):
        raise CLIError("--preset chat needs --quick (tiny random models on CPU) or --target MODEL with --draft")
    if args.target is not None and args.draft is None:
        raise CLIError("--preset chat --target needs --draft: the drafter trained for it (a feature head or draft "
                       "model folder)")
    if args.chat_drafter is not None and not args.quick:
        raise CLIError("--chat-drafter picks the --quick drafter; with --target, --draft is the drafter")
    base = dict(QUICK) if args.quick else {}
    clients = args.clients
    if clients is not None and len(clients) != 1:
        raise CLIError(f"--clients: --preset chat runs one level, got {len(clients)} values")
    options = {"conversations": args.conversations, "clients": clients[0] if clients else None,
               "turns": tuple(args.turns) if args.turns else None, "system_tokens": args.system_tokens,
               "user_tokens": tuple(args.user_tokens) if args.user_tokens else None,
               "answer_tokens": tuple(args.new_tokens) if args.new_tokens else None, "num_draft_tokens": args.gamma,
               "repeats": args.repeats, "seed": args.seed, "random_prompts": args.random_prompts}
    check_int("--conversations", args.conversations, 1, 100_000)
    check_int("--clients", options["clients"], 1, 256)
    check_int("--system-tokens", args.system_tokens, 1, 1 << 17)
    check_int("--num-draft-tokens", args.gamma, 1, 8)
    check_int("--repeats", args.repeats, 1, 20)
    for flag, pair in (("--turns", args.turns), ("--user-tokens", args.user_tokens), ("--new-tokens", args.new_tokens)):
        if pair is not None and not 1 <= pair[0] <= pair[1]:
            raise CLIError(f"{flag} must be LO HI with 1 <= LO <= HI, got {pair[0]} {pair[1]}")
    base.update({k: v for k, v in options.items() if v is not None})
    return ChatSpec(**base)


def run_chat_preset(args: argparse.Namespace, log) -> int:
    import torch

    from specdec.bench.chat import chat_workload, model_setup, quick_setup, run_chat
    from specdec.loading import resolve_device

    spec = chat_spec(args)
    device = torch.device("cpu") if args.quick else resolve_device(args.device)
    if args.quick:
        make, texts, vocab, eos, notes = quick_setup(spec, args.chat_drafter or "model")
    else:
        make, texts, vocab, eos, notes = model_setup(spec, Path(args.target), Path(args.draft), device)
    workload = chat_workload(spec, texts, vocab)
    shared = "random prompts (nothing shared)" if spec.random_prompts else f"system prompt {spec.system_tokens} tokens"
    log(f"chat: {spec.conversations} conversations, {spec.clients} at once, {shared}, 4 arms × {spec.repeats}")
    result = run_chat(make, spec, workload, eos, log=log)
    result["notes"] = notes
    out = Path(args.out or "runs/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "chat.json").write_text(dumps(result, indent=1) + "\n")
    print(markdown(result))
    if args.json:
        print_json({"preset": "chat", "json": str(out / "chat.json"), "summary": result["summary"],
                    "rows": [{k: r[k] for k in ("arm", "hit_rate", "ttft_p50_s", "ttft_p99_s", "itl_p99_s",
                                                "throughput_tok_s", "tokens_equal_caching_off")} for r in result["rows"]]})
    return 0


def markdown(result: dict) -> str:
    """The run's table: one row per arm."""
    def ms(v):
        return "" if v is None else f"{1000 * v:.1f}"

    lines = ["| arm | hit rate | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | tok/s | tok/CPU-s | cache ms | prefill tokens "
             "| = caching off |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['arm']} | {r['hit_rate']:.3f} | {ms(r['ttft_p50_s'])} | {ms(r['ttft_p99_s'])} | "
                     f"{ms(r['itl_p99_s'])} | {r['throughput_tok_s']:.1f} | {r['tokens_per_cpu_s']:.1f} | "
                     f"{ms(r['prefix_cache_s'])} | {r['prefill_tokens']} | {r['tokens_equal_caching_off']} |")
    return "\n".join(lines + ["", json.dumps(result["summary"])])
