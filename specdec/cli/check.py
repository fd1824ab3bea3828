"""`specdec check`: prove that speculative decoding is exact on YOUR pair, sampling settings and runner.

Runs `specdec.check` (specdec/exactness): many seeded requests of a few new tokens, tested position by
position with chi-square against the target's exact law from plain forward passes; the same trials judged
against two deliberately wrong laws (the drafter's q, and "resample from p after a rejection") must be
rejected, or the test lacks power on this pair; then greedy speculative vs plain decoding, token for token.
Prints a short certificate (stdout), `--json` one strict-JSON object instead.

Exit status: 0 pass, 1 fail (a law rejected, or greedy output differs), 3 underpowered (nothing failed, but
a wrong law was not rejected: raise --trials), 2 usage error.

    specdec check                                       # the shipped demo pair, CPU
    specdec check --target T --draft D --temperature 0.7 --top-p 0.9 --engine fast --json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.aliases import GAMMA_FLAGS, add_model_arguments
from specdec.cli.common import add_model_options, apply_model_options, check_float, check_int, log, print_json

EXIT = {"pass": 0, "fail": 1, "underpowered": 3}
EXTRA_PROMPTS = ("The capital of France is", "Once upon a time, there was a", "Q: What is the sum of 2 and 3?\nA:")


def add_parser(subparsers) -> None:
    from specdec.exactness.limits import DEFAULT_POSITIONS, DEFAULT_TRIALS, ENGINES, MAX_POSITIONS, MAX_TRIALS

    p = subparsers.add_parser("check", help="certify that speculative decoding samples the target's law on your pair",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", type=Path, default=None,
                   help="folder with target/ and draft/ (default: the shipped demo pair, unless --target is given)")
    add_model_arguments(p, required=False, target_type=Path,
                        help="target checkpoint directory (default: the shipped demo pair)",
                        draft_help="draft checkpoint directory, a feature-head folder, or one of: ngram (= bigram), "
                                   "unigram, prompt-lookup (needed with a model)")
    p.add_argument("--ngram-data", type=Path, default=None, help="text file to fit an n-gram drafter on")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: the target's)")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text (repeatable; default: a built-in mix of code and prose)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy only (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    p.add_argument(*GAMMA_FLAGS, dest="num_draft_tokens", default="4", help="γ: an integer 1..64 or a policy name (default 4)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="the runner: auto (the engine on CUDA for covered models, else hf), fast, hf (default auto)")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS,
                   help=f"seeded requests for the law test, 1..{MAX_TRIALS} (default {DEFAULT_TRIALS})")
    p.add_argument("--positions", type=int, default=DEFAULT_POSITIONS,
                   help=f"new tokens per trial, each position tested, 2..{MAX_POSITIONS}: a step drafts at most "
                        f"positions − 1 (default {DEFAULT_POSITIONS})")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts the law test uses, 1..64 (default 4)")
    p.add_argument("--max-prompt-tokens", type=int, default=8,
                   help="longest prompt prefix the law test considers (default 8: prefill is most of a trial's cost)")
    p.add_argument("--greedy-tokens", type=int, default=32,
                   help="tokens per prompt for the greedy comparison; 0 = skip it (default 32)")
    p.add_argument("--level", type=float, default=1e-4, help="test level: fail below this p-value (default 1e-4)")
    add_model_options(p, seed=0, seed_help="seed of the trials (a fixed seed makes the check repeatable)")
    p.add_argument("--json", action="store_true", help="print one strict-JSON object instead of the certificate")
    p.set_defaults(run=run)


def _paths(args) -> tuple[Path, str]:
    if args.target is None:
        if args.draft is not None:
            raise CLIError("--draft needs --target (or give --pair)")
        from specdec.cli.demo import DEMO_PAIR

        pair = args.pair or DEMO_PAIR
        return pair / "target", str(pair / "draft")
    if args.pair is not None:
        raise CLIError("give either --pair or --target/--draft, not both")
    if args.draft is None:
        raise CLIError("--target needs --draft (the check tests speculative decoding)")
    return args.target, args.draft


def _default_prompts() -> list[str]:
    from specdec.cli.demo import PROMPTS

    return [*PROMPTS, *EXTRA_PROMPTS]


def run(args: argparse.Namespace) -> int:
    from specdec.cli.generate import _gamma
    from specdec.exactness.limits import MAX_GREEDY_TOKENS, MAX_POSITIONS, MAX_PROMPT_TOKENS, MAX_PROMPTS, MAX_TRIALS

    # every number is checked before anything is loaded
    check_int("--trials", args.trials, 1, MAX_TRIALS)
    check_int("--positions", args.positions, 2, MAX_POSITIONS)  # with 1 new token a step drafts nothing
    check_int("--num-prompts", args.num_prompts, 1, MAX_PROMPTS)
    check_int("--max-prompt-tokens", args.max_prompt_tokens, 1, MAX_PROMPT_TOKENS)
    check_int("--greedy-tokens", args.greedy_tokens, 0, MAX_GREEDY_TOKENS)
    check_float("--level", args.level, 0.0, 0.5, open_low=True)
    if args.level >= 0.5:
        raise CLIError(f"--level must be < 0.5, got {args.level}")
    check_float("--temperature", args.temperature, 0.0)
    check_int("--top-k", args.top_k, 0)
    check_float("--top-p", args.top_p, 0.0, 1.0, open_low=True)
    gamma = _gamma(args.num_draft_tokens)
    if args.prompt is not None and len(args.prompt) > MAX_PROMPTS:
        raise CLIError(f"at most {MAX_PROMPTS} --prompt, got {len(args.prompt)}")
    target_path, draft = _paths(args)
    apply_model_options(args)

    import specdec
    from specdec.cli.common import encode_prompts, load_drafter
    from specdec.request import vocab_size
    from specdec.loading import load_model, load_tokenizer

    target = load_model(target_path, device=args.device, dtype=args.dtype, what="target",
                        allow_pickle=args.allow_pickle)
    tokenizer = load_tokenizer(args.tokenizer or target_path)
    texts = args.prompt or _default_prompts()
    prompts = encode_prompts(tokenizer, texts)
    args.draft = draft
    drafter = load_drafter(args, tokenizer, vocab_size(target), prompts, target.device,
                           next(target.parameters()).dtype)
    log(args, f"checking {target_path} with drafter {draft}: {args.trials} trials × {args.positions} tokens, "
              f"engine={args.engine}, γ={gamma}, temperature {args.temperature}")
    result = specdec.check(target, drafter, prompts, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, num_draft_tokens=gamma, engine=args.engine, trials=args.trials,
                           positions=args.positions, num_prompts=args.num_prompts,
                           max_prompt_tokens=args.max_prompt_tokens, greedy_tokens=args.greedy_tokens,
                           level=args.level, seed=args.seed)
    if args.json:
        print_json({"target": str(target_path), "draft": str(draft), "device": str(target.device),
                    "dtype": str(next(target.parameters()).dtype).removeprefix("torch."), **result.to_dict()})
    else:
        print(certificate(result, str(target_path), str(draft), tokenizer))
    return EXIT[result.status]


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def certificate(result, target: str, draft: str, tokenizer=None) -> str:
    """The human-readable certificate of a `CheckResult`."""
    r = result
    sampling = f"temperature {r.temperature:g}, top-k {r.top_k or 'off'}, top-p {r.top_p if r.top_p < 1 else 'off'}"
    lines = [f"specdec check: {r.status.upper()}",
             f"  pair      target {target}",
             f"            drafter {draft}",
             f"  runner    engine={r.engine}{f' → {r.runner}' if r.runner and r.runner != r.engine else ''}, "
             f"γ={r.num_draft_tokens}, {sampling}"]
    if r.positions:
        shown = [repr(tokenizer.decode(list(p))) if tokenizer is not None else str(list(p)) for p in r.prompts]
        lines += [f"  law       {r.trials} trials over {len(r.prompts)} prompts ({', '.join(shown)}), "
                  f"{len(r.positions)} new tokens each; chi-square per position at level {r.level:g}",
                  "            pos  cells  dof   p-value  │ wrong laws (must reject): q   resample-from-p   0.8×T"]
        for pos in r.positions:
            wrong_q = pos.drafter.p_value if pos.drafter else None
            wrong_rule = pos.resample_from_p.p_value if pos.resample_from_p else None
            cooler = pos.cooler.p_value if pos.cooler else None
            law = pos.law
            lines.append(f"            {pos.position:>3}  {law.cells:>5}  {law.dof:>3}  {_p(law.p_value):>8}"
                         f"  │ {_p(wrong_q):>29}  {_p(wrong_rule):>15}  {_p(cooler):>7}")
        side = "≥" if r.worst_p_value >= r.level else "<"
        lines.append(f"  worst     p-value {_p(r.worst_p_value)} ({side} {r.level:g})")
        generic = r.positions[0].drafter is None
        power = {True: "ok: the " + ("generic wrong law (0.8×T; q unknown)" if generic else "q-based wrong laws")
                       + " rejected at every position",
                 False: "LACKING (see below)", None: "not assessed"}[r.power]
        lines.append(f"  power     {power}")
    else:
        lines.append("  law       not tested (temperature 0: greedy decoding is tested token for token)")
    if r.greedy is not None:
        g = r.greedy
        ties = f"; {g.ties} differ at near-ties (rounding, not a failure)" if g.ties else ""
        lines.append(f"  greedy    {g.identical}/{g.prompts} prompts identical to plain decoding "
                     f"({g.new_tokens} tokens each){ties}")
    t = r.timings
    lines.append(f"  time      {t.total_s:.1f} s (trials {t.trials_s:.1f} s, laws {t.laws_s:.1f} s, "
                 f"greedy {t.greedy_s:.1f} s)")
    lines += [f"  !         {why}" for why in r.reasons]
    return "\n".join(lines)
