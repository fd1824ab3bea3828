"""`specdec generate`: stream a completion from local checkpoints; α, τ and tokens/s go to stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.common import add_model_options, apply_model_options, check_int, log, print_json

DRAFT_KINDS = ("ngram", "bigram", "unigram", "prompt-lookup")
POLICY_NAMES = ("fixed", "heuristic", "optimal", "threshold", "guarded")  # = specdec.policy.POLICY_NAMES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with speculative decoding from local checkpoints",
                              description=__doc__)
    p.add_argument("--target", required=True, type=Path, help="target checkpoint directory (from_pretrained)")
    p.add_argument("--draft", default=None,
                   help="draft checkpoint directory, or one of: ngram (= bigram), unigram, prompt-lookup; omit for plain decoding")
    p.add_argument("--ngram-data", type=Path, default=None,
                   help="text file to fit an n-gram drafter on (default: the prompt itself)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: --target)")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text; repeat for a batch (rows are generated together, printed in order)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default 1.0)")
    p.add_argument("--num-draft-tokens", default="4",
                   help="γ: an integer 1..64, or a policy name (heuristic, optimal, threshold, guarded) (default 4)")
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with the texts and stats (stdout)")
    p.set_defaults(run=run)


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


def _drafter(args, tokenizer, target, prompts_ids):
    import specdec
    from specdec.loading import load_model

    if args.draft is None:
        return None
    kind = args.draft.lower()
    if kind == "prompt-lookup":
        return specdec.PromptLookupDrafter()
    if kind in ("ngram", "bigram", "unigram"):
        if args.ngram_data is not None:
            if not args.ngram_data.is_file():
                raise FileNotFoundError(f"--ngram-data file not found: {args.ngram_data}")
            data = [tokenizer.encode(args.ngram_data.read_text(encoding="utf-8", errors="replace"))]
        else:
            data = prompts_ids
        vocab = target.get_output_embeddings().weight.shape[0]
        return specdec.NGramDrafter(1 if kind == "unigram" else 2).fit(data, vocab)
    return load_model(args.draft, device=target.device, dtype=next(target.parameters()).dtype, what="draft",
                      allow_pickle=args.allow_pickle)


def run(args: argparse.Namespace) -> int:
    from specdec.request import MAX_NEW_TOKENS, SamplingParams

    # every number is checked before anything is loaded
    check_int("--max-new-tokens", args.max_new_tokens, 0, MAX_NEW_TOKENS)
    gamma = _gamma(args.num_draft_tokens)
    try:
        SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, seed=args.seed)
    except ValueError as err:
        raise CLIError(f"--{str(err).split(' ')[0].replace('_', '-')}: {err}") from None
    apply_model_options(args)

    import specdec
    from specdec.loading import load_model, load_tokenizer

    target = load_model(args.target, device=args.device, dtype=args.dtype, what="target",
                        allow_pickle=args.allow_pickle)
    tokenizer = load_tokenizer(args.tokenizer or args.target)
    prompts = [tokenizer.encode(text) for text in args.prompt]
    for i, ids in enumerate(prompts):
        if not ids:
            raise CLIError(f"--prompt {i + 1} is empty after tokenization")
    drafter = _drafter(args, tokenizer, target, prompts)

    # stream() checks every argument against the model (vocabulary, context) before the first token
    run_ = specdec.stream(
        target, prompts, drafter=drafter, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, num_draft_tokens=gamma, seed=args.seed,
    )
    single = len(prompts) == 1
    echo = single and not args.json
    out = [[] for _ in prompts]
    shown = None  # the prompt is echoed with the first tokens, so a failed first step prints nothing
    for event in run_:
        for row, toks in zip(event.rows, event.tokens):
            out[row].extend(toks)
        if echo:
            if shown is None:
                sys.stdout.write(args.prompt[0])
                shown = ""
            text = tokenizer.decode(out[0], skip_special_tokens=True)
            sys.stdout.write(text[len(shown):] if text.startswith(shown) else "\n" + text)
            sys.stdout.flush()
            shown = text
    result = run_.result
    texts = [tokenizer.decode(seq, skip_special_tokens=True) for seq in result.sequences]
    s = result.stats
    if args.json:
        print_json({"texts": texts, "sequences": result.sequences, "stats": s.to_dict()})
        return 0
    if not single:
        for prompt, text in zip(args.prompt, texts):
            print(f"{prompt}{text}\n---")
    else:
        print(args.prompt[0] if shown is None else "")
    alpha = f"{s.alpha:.3f}" if s.alpha is not None else "n/a"
    log(args, f"α={alpha} τ={s.mean_accepted_length:.2f} tokens/s={s.tokens_per_second:.1f} "
              f"({s.num_generated_tokens} tokens, {s.num_steps} target calls, {s.wall_time_s:.2f}s)")
    return 0
