"""`specdec generate`: stream a completion from local checkpoints; α, τ and tokens/s go to stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.aliases import GAMMA_FLAGS, RUNNER_OF_ENGINE, add_engine_argument, add_model_arguments
from specdec.cli.common import (add_checkpoint_options, add_model_options, apply_model_options, check_int,
                                encode_prompts, load_drafter, loader_kwargs, log, print_json)
from specdec.cli.engine_flags import add_engine_flags, check_engine_flags

DRAFT_KINDS = ("ngram", "bigram", "unigram", "prompt-lookup")
POLICY_NAMES = ("fixed", "heuristic", "optimal", "threshold", "guarded")  # = specdec.policy.POLICY_NAMES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with speculative decoding from local checkpoints",
                              description=__doc__)
    add_model_arguments(p, draft_help="draft checkpoint (a model folder, .gguf file or cached hub id; or a head "
                        "folder: EAGLE-1/2, EAGLE-3, Medusa, speculators, specdec train head), or one of: ngram (= "
                        "bigram), unigram, prompt-lookup; omit for plain decoding")
    p.add_argument("--ngram-data", type=Path, default=None,
                   help="text file to fit an n-gram drafter on (default: the prompt itself)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, .gguf file or hub id (default: --target's)")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text; repeat for a batch (rows are generated together, printed in order)")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="a system message: each prompt becomes a chat (system + user) rendered with the chat template")
    p.add_argument("--chat", action="store_true",
                   help="render each prompt as a user message with the chat template (an instruct model's format)")
    p.add_argument("--chat-template", type=Path, default=None, metavar="FILE",
                   help="Jinja chat template file for --chat / --system (default: the tokenizer's)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop string: the text ends before it (repeatable)")
    p.add_argument("--logprobs", action="store_true",
                   help="print each generated token with its log-probability under the target (after the text)")
    p.add_argument("--max-new-tokens", "--max-tokens", dest="max_new_tokens", type=int, default=64,
                   help="tokens to generate per prompt (default: 64)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (default: the model's generation_config: greedy unless do_sample)")
    p.add_argument("--top-k", type=int, default=None, help="default: the generation_config's, else 0 (off)")
    p.add_argument("--top-p", type=float, default=None, help="default: the generation_config's, else 1.0 (off)")
    p.add_argument(*GAMMA_FLAGS, dest="num_draft_tokens", default="4",
                   help="γ: an integer 1..64, or a policy name (heuristic, optimal, threshold, guarded) (default: 4)")
    p.add_argument("--leniency", type=float, default=1.0, help="l in (0, 1]: 1 = exact; < 1 accepts more, LOSSY (A.5)")
    p.add_argument("--draft-tree", default=None, help="verify a token tree per step, e.g. 2,2,1 (needs a draft model)")
    structured = p.add_mutually_exclusive_group()
    structured.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                            help="the text is JSON matching this schema file (needs specdec[grammar]) (default: none)")
    structured.add_argument("--json-object", action="store_true", help="the text is a JSON object (default: off)")
    structured.add_argument("--regex", default=None, help="the text matches this regular expression (default: none)")
    structured.add_argument("--choice", action="append", default=None,
                            help="the text is one of these strings (repeat the option) (default: none)")
    structured.add_argument("--grammar", type=Path, default=None, metavar="FILE",
                            help="the text matches this EBNF grammar file, root rule `root` (default: none)")
    add_model_options(p)
    add_checkpoint_options(p)
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="shard the target over N ranks; launch with torchrun --nproc-per-node N (default: 1)")
    p.add_argument("--tensor-parallel-all-reduce", choices=("auto", "group", "one_shot"), default="auto",
                   help="how the ranks sum partial products: group (NCCL/gloo), one_shot (symmetric memory over "
                        "NVLink, CUDA) or auto (one_shot where the GPUs reach each other by P2P) (default: auto)")
    add_engine_argument(p)
    add_engine_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with the texts and stats (stdout)")
    p.set_defaults(run=run)


def _constraint(args):
    """(the option, its `constrain.Constraint`) or None; read and checked before any model is loaded."""
    from specdec.constrain import Constraint

    for option, value, make in (("--json-schema", args.json_schema, lambda path: Constraint.json_schema(_read(path))),
                                ("--json-object", args.json_object or None, lambda _: Constraint.json_object()),
                                ("--regex", args.regex, Constraint.regex), ("--choice", args.choice, Constraint.choice),
                                ("--grammar", args.grammar, lambda path: Constraint.grammar(_read(path)))):
        if value is not None:
            from specdec.constrain import grammar_engine_available

            if not grammar_engine_available():
                raise CLIError(f"{option}: constrained decoding needs xgrammar: pip install 'specdec[grammar]'")
            try:
                return option, make(value)
            except (TypeError, ValueError, OSError) as err:
                raise CLIError(f"{option}: {err}") from None
    return None


def _read(path: Path) -> str:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.stat().st_size > 1 << 20:
        raise ValueError(f"{path}: larger than 1 MiB")
    return path.read_text(encoding="utf-8")


def _gamma(text: str):
    """--num-draft-tokens: an integer (bounded) or a policy name, checked before anything is loaded."""
    from specdec.request import check_num_draft_tokens

    value = text.strip().lower()
    if value.lstrip("-").isdigit():
        if len(value) > 20:
            raise CLIError(f"--num-draft-tokens must be an integer 1..64 or a policy name, got {text!r}")
        try:
            return check_num_draft_tokens(int(value))
        except ValueError as err:
            raise CLIError(f"--num-draft-tokens: {err}") from None
    if value not in POLICY_NAMES:
        raise CLIError(f"--num-draft-tokens must be an integer 1..64 or a policy name ({', '.join(POLICY_NAMES)}), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from specdec.request import MAX_NEW_TOKENS, SamplingParams, context_length, vocab_size

    # every number is checked before anything is loaded
    check_int("--max-new-tokens", args.max_new_tokens, 0, MAX_NEW_TOKENS)
    gamma = _gamma(args.num_draft_tokens)
    try:
        SamplingParams(max_new_tokens=args.max_new_tokens,
                       temperature=1.0 if args.temperature is None else args.temperature,
                       top_k=0 if args.top_k is None else args.top_k,
                       top_p=1.0 if args.top_p is None else args.top_p, seed=args.seed)
    except (ValueError, TypeError) as err:
        raise CLIError(f"--{str(err).split(' ')[0].replace('_', '-')}: {err}") from None
    constraint = _constraint(args)
    from specdec.text.prompts import check_stop

    try:
        check_stop(args.stop)
    except (TypeError, ValueError) as err:
        raise CLIError(f"--stop: {err}") from None
    if (args.stop or args.logprobs) and (args.leniency != 1.0 or args.draft_tree is not None):
        raise CLIError("--stop and --logprobs cannot be combined with --leniency or --draft-tree")
    if args.chat_template is not None and not args.chat_template.is_file():
        raise CLIError(f"--chat-template: {args.chat_template}: no such file")
    apply_model_options(args)
    if constraint is not None and (args.leniency != 1.0 or args.draft_tree is not None
                                   or args.tensor_parallel_size != 1):
        raise CLIError("--json-schema / --json-object / --regex / --choice / --grammar cannot be combined with "
                       "--leniency, --draft-tree or --tensor-parallel-size")
    if args.tensor_parallel_all_reduce != "auto" and args.tensor_parallel_size == 1:
        raise CLIError(f"--tensor-parallel-all-reduce {args.tensor_parallel_all_reduce} needs --tensor-parallel-size > 1")
    options = check_engine_flags(args, num_draft_tokens=gamma, loop=args.engine == "hf")
    bitwise = bool(options.get("bitwise"))
    if bitwise and args.tensor_parallel_size != 1:
        raise CLIError("--bitwise needs one device (not --tensor-parallel-size > 1)")
    if options and (args.leniency != 1.0 or args.draft_tree is not None):
        raise CLIError(f"--leniency / --draft-tree run on specdec.generate, which takes no engine options (given: "
                       f"{', '.join(sorted(options))})")
    if check_int("--tensor-parallel-size", args.tensor_parallel_size, 1, 1024) > 1:
        if args.model_option or args.draft_model_option or args.allow_weight_mismatch:
            raise CLIError("--tensor-parallel-size reads a safetensors folder per rank: --model-option, "
                           "--draft-model-option and --allow-weight-mismatch are not supported with it")
        if options:
            raise CLIError(f"--tensor-parallel-size runs specdec.generate over the shards, which takes no engine "
                           f"options (given: {', '.join(sorted(options))})")
        from specdec.cli.tensor_parallel import run_tensor_parallel

        return run_tensor_parallel(args, gamma)

    from specdec.cli.common import model_options
    from specdec.loading import load_model, load_tokenizer, source_options
    from specdec.text import LLM

    target = load_model(args.target, device=args.device, dtype=args.dtype, what="target", **loader_kwargs(args))
    tokenizer = load_tokenizer(args.tokenizer or args.target,
                               model_kwargs=None if args.tokenizer else source_options(model_options(args)))
    chat = args.chat or args.system is not None
    prompts = _chat_prompts(args, tokenizer) if chat else encode_prompts(tokenizer, args.prompt)
    shown_prompts = [""] * len(prompts) if chat else args.prompt  # a chat's reply is printed without its template
    drafter = load_drafter(args, tokenizer, vocab_size(target), prompts, target.device,
                           next(target.parameters()).dtype)
    if drafter is not None and isinstance(gamma, int) and gamma < 1:
        raise ValueError(f"num_draft_tokens must be >= 1 with a draft (got {gamma}); omit --draft for plain decoding")

    if args.leniency != 1.0 or args.draft_tree is not None:  # run on specdec.generate (docs/EXTENSIONS.md)
        from specdec.cli.extensions import run_generate

        return run_generate(args, target, tokenizer, drafter, prompts, gamma)
    params = {"max_new_tokens": args.max_new_tokens, "seed": args.seed, "stop": args.stop, "logprobs": args.logprobs}
    if constraint is not None:
        params["constraint"] = constraint[1]
    for name in ("temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:  # explicit arguments win over the generation_config
            params[name] = getattr(args, name)
    single = len(prompts) == 1
    shown = None  # the prompt is echoed with the first text, so a failure before it prints nothing
    # the runner's cache holds exactly these prompts (not the server's 32 rows of 4096 tokens: 6 GB for SmolLM2
    # on a CPU); a request longer than the model's context is still refused by the runner, naming it
    needed = max(len(ids) for ids in prompts) + args.max_new_tokens + 1
    context = context_length(target)
    options.setdefault("max_batch_size", len(prompts))
    options.setdefault("max_seq_len", needed if context is None or needed <= context else None)
    with LLM(target, tokenizer, drafter, num_draft_tokens=gamma if drafter is not None else 0,
             runner="engine" if bitwise else RUNNER_OF_ENGINE[args.engine], **options) as llm:
        if single and not args.json:
            # deltas are whole characters and concatenate to the final text (no reprinting)
            stream = llm.stream(prompts[0], **params)
            for delta in stream:
                if shown is None:
                    sys.stdout.write(shown_prompts[0])
                    shown = ""
                sys.stdout.write(delta)
                sys.stdout.flush()
            completions = [stream.completion]
        else:
            completions = llm.generate(prompts, **params)
    texts = [c.text for c in completions]
    stats = _stats(completions)
    if args.json:
        print_json({"texts": texts, "sequences": [c.token_ids for c in completions], "stats": stats,
                    **({"logprobs": [c.logprobs for c in completions]} if args.logprobs else {})})
        return 0
    if not single:
        for prompt, text in zip(shown_prompts, texts):
            print(f"{prompt}{text}\n---")
    else:
        print(shown_prompts[0] if shown is None else "")
    if args.logprobs:
        _print_logprobs(tokenizer, completions)
    alpha = f"{stats['alpha']:.3f}" if stats["alpha"] is not None else "n/a"
    log(args, f"α={alpha} τ={stats['mean_accepted_length']:.2f} tokens/s={stats['tokens_per_second']:.1f} "
              f"({stats['num_generated_tokens']} tokens, {stats['num_steps']} target calls, {stats['wall_time_s']:.2f}s)")
    return 0


def _chat_prompts(args, tokenizer) -> list[list[int]]:
    """Each --prompt as a chat (the --system message first, then the user's), rendered with the chat template."""
    from specdec.text.prompts import read_chat_template, render_chat

    if args.chat_template is not None:
        tokenizer.chat_template = read_chat_template(args.chat_template)
    if not getattr(tokenizer, "chat_template", None):
        raise CLIError("--chat / --system: this tokenizer has no chat template (give --chat-template FILE)")
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    prompts = [tokenizer.encode(render_chat(tokenizer, system + [{"role": "user", "content": text}]),
                                add_special_tokens=False) for text in args.prompt]
    for i, ids in enumerate(prompts):
        if not ids:
            raise CLIError(f"--prompt {i + 1} is empty after the chat template")
    return prompts


def _print_logprobs(tokenizer, completions) -> None:
    """One line per generated token: its text (as Python writes it) and log p under the target."""
    for i, c in enumerate(completions):
        if len(completions) > 1:
            print(f"logprobs of prompt {i + 1}:")
        for token, logprob in zip(c.token_ids, c.logprobs or []):
            print(f"{tokenizer.decode([token])!r}\t{logprob:.4f}")


def _stats(completions) -> dict:
    """One prompt: the loop's SpecStats when the runner reports them; several: sums over the prompts."""
    if len(completions) == 1 and completions[0].stats.spec is not None:
        out = completions[0].stats.spec.to_dict()
        out["wall_time_s"] = max(out["wall_time_s"], completions[0].stats.wall_time_s)
        return out
    per = [c.stats for c in completions]
    steps = sum(s.num_steps for s in per)
    wall = max(s.wall_time_s for s in per)
    tokens = sum(s.num_generated_tokens for s in per)
    alphas = [s.alpha for s in per if s.alpha is not None]
    return {
        "alpha": sum(alphas) / len(alphas) if alphas else None,
        "mean_accepted_length": (sum(s.num_accepted_tokens for s in per) + steps) / steps if steps else 0.0,
        "tokens_per_second": tokens / wall if wall > 0 else 0.0, "num_generated_tokens": tokens, "num_steps": steps,
        "wall_time_s": wall, "per_prompt": [s.to_dict() for s in per],
    }
