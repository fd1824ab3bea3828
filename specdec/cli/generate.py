"""`specdec generate`: stream a completion from local checkpoints, then print α, τ and tokens/s."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DRAFT_KINDS = ("ngram", "bigram", "unigram", "prompt-lookup")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with speculative decoding from local checkpoints")
    p.add_argument("--target", required=True, type=Path, help="target checkpoint directory (from_pretrained)")
    p.add_argument("--draft", default=None,
                   help="draft checkpoint directory, or one of: ngram (= bigram), unigram, prompt-lookup; omit for plain decoding")
    p.add_argument("--ngram-data", type=Path, default=None,
                   help="text file to fit an n-gram drafter on (default: the prompt itself)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: --target)")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text; repeat for a batch (rows are generated together, printed in order)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-draft-tokens", default="4",
                   help="γ: an integer, or a policy name (heuristic, optimal, threshold, guarded)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--json", action="store_true", help="print a JSON object with the texts and stats on the last line")
    p.set_defaults(run=run)


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
    return load_model(args.draft, device=target.device, dtype=next(target.parameters()).dtype, what="draft")


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec.loading import load_model, load_tokenizer

    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    gamma = int(args.num_draft_tokens) if args.num_draft_tokens.strip().lstrip("-").isdigit() else args.num_draft_tokens
    target = load_model(args.target, device=args.device, dtype=args.dtype, what="target")
    tokenizer = load_tokenizer(args.tokenizer or args.target)
    prompts = [tokenizer.encode(text) for text in args.prompt]
    for i, ids in enumerate(prompts):
        if not ids:
            raise ValueError(f"prompt {i} is empty after tokenization")
    drafter = _drafter(args, tokenizer, target, prompts)

    single = len(prompts) == 1
    out = [[] for _ in prompts]
    shown = [""]

    def on_tokens(event):
        for row, toks in zip(event.rows, event.tokens):
            out[row].extend(toks)
        if single and not args.json:
            text = tokenizer.decode(out[0], skip_special_tokens=True)
            sys.stdout.write(text[len(shown[0]):] if text.startswith(shown[0]) else "\n" + text)
            sys.stdout.flush()
            shown[0] = text

    if single and not args.json:
        sys.stdout.write(args.prompt[0])
    result = specdec.generate(
        target, prompts, drafter=drafter, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, num_draft_tokens=gamma, seed=args.seed, on_tokens=on_tokens,
    )
    texts = [tokenizer.decode(seq, skip_special_tokens=True) for seq in result.sequences]
    s = result.stats
    alpha = f"{s.alpha:.3f}" if s.alpha is not None else "n/a"
    summary = (f"α={alpha} τ={s.mean_accepted_length:.2f} tokens/s={s.tokens_per_second:.1f} "
               f"({s.num_generated_tokens} tokens, {s.num_steps} target calls, {s.wall_time_s:.2f}s)")
    if args.json:
        print(json.dumps({"texts": texts, "sequences": result.sequences, "stats": s.to_dict()}))
        return 0
    if not single:
        for prompt, text in zip(args.prompt, texts):
            print(f"{prompt}{text}\n---")
    else:
        print()
    print(summary)
    return 0
