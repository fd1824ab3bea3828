"""`specdec beam`: beam search from local checkpoints, speculative when a draft model is given.

The beams are identical to transformers' `generate(num_beams=w, do_sample=False)` (see specdec/search/beam.py);
the draft model only saves target passes. They run inside the engine (specdec/engine/beam.py; --engine auto, the
default, for every model the engine runs, else the transformers loop; --engine hf: the loop).
"""

from __future__ import annotations

import argparse
import json

from specdec.cli.aliases import GAMMA_FLAGS, add_engine_argument, add_model_arguments
from specdec.cli.common import add_checkpoint_options, add_model_options, apply_model_options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("beam", help="(speculative) beam search from local checkpoints",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p, help="target checkpoint (decoder-only): a folder, a .gguf file or a cached hub id",
                        draft_help="draft checkpoint; omit for plain beam search")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, .gguf file or hub id (default: --target's)")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    p.add_argument("--num-beams", type=int, default=4, help="w")
    p.add_argument("--draft-beams", type=int, default=None, help="u ≥ w, the drafter's beam width (default: w)")
    p.add_argument(*GAMMA_FLAGS, dest="num_draft_tokens", type=int, default=3, help="γ: drafter beam levels per target pass")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--early-stopping", choices=["false", "true", "never"], default="false")
    p.add_argument("--no-eos", action="store_true", help="ignore EOS (always generate --max-new-tokens)")
    add_engine_argument(p)
    add_checkpoint_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (beams, scores, stats)")
    add_model_options(p, seed_help="unused: beam search draws nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec.cli.common import encode_prompts, loader_kwargs, model_options
    from specdec.loading import load_model, load_tokenizer, source_options

    apply_model_options(args)
    target_kwargs, draft_kwargs = loader_kwargs(args, "target"), loader_kwargs(args, "draft")  # checked first
    target = load_model(args.target, device=args.device, dtype=args.dtype, what="target", **target_kwargs)
    draft = None
    if args.draft is not None:
        draft = load_model(args.draft, device=target.device, dtype=next(target.parameters()).dtype, what="draft",
                           **draft_kwargs)
    tokenizer = load_tokenizer(args.tokenizer or args.target,
                               model_kwargs=None if args.tokenizer else source_options(model_options(args)))
    prompts = encode_prompts(tokenizer, args.prompt)
    early = {"false": False, "true": True, "never": "never"}[args.early_stopping]
    result = specdec.beam_search(
        target, prompts, draft, num_beams=args.num_beams, draft_beams=args.draft_beams,
        num_draft_tokens=args.num_draft_tokens, max_new_tokens=args.max_new_tokens,
        eos_token_id=[] if args.no_eos else None, length_penalty=args.length_penalty, early_stopping=early,
        engine=args.engine,
    )
    s = result.stats
    summary = (f"target calls={s.target_calls} (prefill + {s.passes} passes for {s.beam_steps} beam steps, "
               f"{s.steps_per_pass:.2f} per pass), drafter calls={s.drafter_calls}, {s.wall_time_s:.2f}s")
    texts = [[tokenizer.decode(beam, skip_special_tokens=True) for beam in beams] for beams in result.sequences]
    if args.json:
        print(json.dumps({"texts": texts, "sequences": result.sequences, "scores": result.scores,
                          "stats": {**s.__dict__, "steps_per_pass": s.steps_per_pass}}))
        return 0
    for prompt, beams, scores in zip(args.prompt, texts, result.scores):
        for rank, (text, score) in enumerate(zip(beams, scores), start=1):
            print(f"[beam {rank}, score {score:.4f}] {prompt}{text}")
        print("---")
    print(summary)
    return 0
