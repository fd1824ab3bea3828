"""`specdec generate --tensor-parallel-size N` under `torchrun --nproc-per-node N -m specdec generate ...`.

Every rank joins the process group (gloo on CPU, nccl on CUDA), loads its shard of the target
(`specdec.distributed.load_sharded`: only its safetensors slices) and a full copy of the drafter, and runs
the same `specdec.generate(..., engine="fast")` on token ids with the same seed (rank 0's, broadcast), so
all ranks commit the same tokens (an "auto" γ or a draft-length policy: each rank's chooses, and every rank runs
rank 0's choice, `engine.agreement`). Only rank 0 prints; the text is decoded as the single-process command does.
"""

from __future__ import annotations

import argparse
import sys

from specdec.cli import CLIError
from specdec.cli.common import log, print_json

__all__ = ["run_tensor_parallel"]


def _check(args: argparse.Namespace, gamma) -> None:
    from specdec.policy import POLICY_NAMES

    if not isinstance(gamma, int) and gamma != "auto" and gamma not in POLICY_NAMES:  # (a policy: rank 0's γ runs)
        raise CLIError(f"--tensor-parallel-size needs an integer, 'auto' or a policy name --num-draft-tokens, got "
                       f"{gamma!r}")
    if args.leniency != 1.0 or args.draft_tree is not None:
        raise CLIError("--leniency and --draft-tree run on the transformers loop, not with --tensor-parallel-size")
    if args.allow_pickle:
        raise CLIError("--tensor-parallel-size loads safetensors checkpoints only (drop --allow-pickle)")


def _text(tokenizer, prompt: list[int], tokens: list[int]) -> str:
    from specdec.text.detokenize import IncrementalText

    text = IncrementalText(tokenizer, prompt)
    for token in tokens:
        text.add(token)
    text.finish()
    return text.text


def run_tensor_parallel(args: argparse.Namespace, gamma) -> int:
    """The tensor-parallel `generate` (options already range-checked by `specdec.cli.generate.run`)."""
    _check(args, gamma)
    import specdec
    from specdec.distributed import (init_tensor_parallel, is_main_rank, load_sharded, shared_seed,
                                     shutdown_tensor_parallel)
    from specdec.loading import load_tokenizer, resolve_device, resolve_dtype
    from specdec.request import resolve_eos
    from specdec.text.prompts import GenerationDefaults

    device = init_tensor_parallel(args.tensor_parallel_size, resolve_device(args.device))
    models = []  # released before the group is destroyed (their CUDA graphs captured its all-reduces)
    try:
        dtype = resolve_dtype(args.dtype, device)
        target = load_sharded(args.target, device=device, dtype=dtype, all_reduce=args.tensor_parallel_all_reduce)
        models.append(target)
        tokenizer = load_tokenizer(args.tokenizer or args.target)
        from specdec.cli.common import encode_prompts, load_drafter

        prompts = encode_prompts(tokenizer, args.prompt)

        drafter = load_drafter(args, tokenizer, target.shape.vocab_size, prompts, device, dtype)
        if drafter is not None and isinstance(gamma, int) and gamma < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 with a draft (got {gamma}); omit --draft for plain decoding")
        defaults = GenerationDefaults.from_model(target, resolve_eos(None, target))
        pick = lambda given, default: default if given is None else given  # noqa: E731
        result = specdec.generate(
            target, prompts, drafter, max_new_tokens=args.max_new_tokens,
            temperature=pick(args.temperature, defaults.temperature), top_k=pick(args.top_k, defaults.top_k),
            top_p=pick(args.top_p, defaults.top_p), num_draft_tokens=gamma if drafter is not None else 0,
            seed=shared_seed(args.seed, device), engine="fast",
        )
        if is_main_rank():
            _report(args, tokenizer, prompts, result)
    except BaseException:
        shutdown_tensor_parallel(*models)  # the error in flight is the one to report
        raise
    if not shutdown_tensor_parallel(*models):
        raise CLIError("tensor parallel: the process group did not shut down in time (a rank failed or is gone)")
    return 0


def _report(args, tokenizer, prompts, result) -> None:
    texts = [_text(tokenizer, p, seq) for p, seq in zip(prompts, result.sequences)]
    stats = result.stats.to_dict()
    stats["tensor_parallel_size"] = args.tensor_parallel_size
    if args.json:
        print_json({"texts": texts, "sequences": result.sequences, "stats": stats})
        return
    if len(texts) == 1:
        sys.stdout.write(f"{args.prompt[0]}{texts[0]}\n")
    else:
        for prompt, text in zip(args.prompt, texts):
            print(f"{prompt}{text}\n---")
    sys.stdout.flush()
    alpha = f"{stats['alpha']:.3f}" if stats["alpha"] is not None else "n/a"
    log(args, f"α={alpha} τ={stats['mean_accepted_length']:.2f} tokens/s={stats['tokens_per_second']:.1f} "
              f"({stats['num_generated_tokens']} tokens, {stats['num_steps']} target calls, "
              f"{stats['wall_time_s']:.2f}s, tensor parallel {args.tensor_parallel_size})")
