"""`specdec generate --leniency L` / `--draft-tree 2,2,1`: these run on `specdec.generate` directly.

(The text API behind plain `specdec generate` takes sampling parameters only; lenience and token trees are
arguments of the eager loop, see docs/EXTENSIONS.md.)
"""

from __future__ import annotations

import json
import sys


def parse_draft_tree(text: str | None) -> list[int] | None:
    """`--draft-tree 2,2,1` → [2, 2, 1] (None stays None); the error names the flag."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--draft-tree must be comma-separated integers like 2,2,1, got {text!r}") from None


def run_generate(args, target, tokenizer, drafter, prompts: list[list[int]], gamma) -> int:
    """Generate with lenience and/or a draft tree, print like `specdec generate` (text, then stats or JSON)."""
    import specdec

    tree = parse_draft_tree(args.draft_tree)
    if tree is not None and drafter is None:
        raise ValueError("--draft-tree needs --draft (a draft model checkpoint)")
    from specdec.text.prompts import GenerationDefaults

    defaults = GenerationDefaults.from_model(target, ())  # as plain `specdec generate`: the generation_config
    sampling = {name: getattr(defaults, name) if getattr(args, name) is None else getattr(args, name)
                for name in ("temperature", "top_k", "top_p")}
    result = specdec.generate(
        target, prompts, drafter=drafter, max_new_tokens=args.max_new_tokens, num_draft_tokens=gamma if drafter else 4,
        seed=args.seed, leniency=args.leniency, draft_tree=tree, engine=getattr(args, "engine", "auto"), **sampling,
    )
    texts = [tokenizer.decode(seq, skip_special_tokens=True) for seq in result.sequences]
    s = result.stats
    if args.json:
        print(json.dumps({"texts": texts, "sequences": result.sequences, "stats": s.to_dict()}))
        return 0
    for prompt, text in zip(args.prompt, texts):
        sys.stdout.write(f"{prompt}{text}\n" + ("---\n" if len(texts) > 1 else ""))
    alpha = f"{s.alpha:.3f}" if s.alpha is not None else "n/a"
    print(f"α={alpha} τ={s.mean_accepted_length:.2f} tokens/s={s.tokens_per_second:.1f} "
          f"({s.num_generated_tokens} tokens, {s.num_steps} target calls, {s.wall_time_s:.2f}s)")
    return 0
