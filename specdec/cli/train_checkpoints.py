"""`specdec train distill` and `specdec train head`: the steps that start from loaded checkpoints (`--target`, `--draft`
through `specdec.loading`, so GGUF files, folders and hub ids in the local cache all work). Parsed and range-checked
by `specdec.cli.train`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specdec.cli import CLIError
from specdec.cli.common import dumps, loader_kwargs

__all__ = ["run_distill", "run_head"]


def run_distill(args) -> int:
    """`specdec train distill`: KL-distill --draft toward --target on --data, save the draft and distill.json."""
    from specdec.loading import load_model, resolve_model_source
    from specdec.zoo.data import load_data
    from specdec.zoo.distill import distill_draft
    from specdec.zoo.models import resolve_device, save_model
    from specdec.zoo.presets import get_preset

    preset = get_preset(args.preset)
    recipe = next((r for r in preset.drafts if r.distill is not None), None)
    if recipe is None:
        raise CLIError(f"preset {args.preset!r} has no distillation settings")
    fraction = args.generated_fraction if args.generated_fraction is not None else (1.0 if args.generate else 0.0)
    if fraction and not args.generate:
        raise CLIError("--generated-fraction needs --generate N")
    distill_cfg = replace(recipe.distill, generated_fraction=fraction, loss=args.loss)
    tc = distill_cfg.train
    tc = replace(tc, max_seconds=args.seconds if args.seconds is not None else tc.max_seconds,
                 steps=args.steps if args.steps is not None else tc.steps, lr=args.lr if args.lr is not None else tc.lr,
                 batch_size=args.batch_size or tc.batch_size, seq_len=args.seq_len or tc.seq_len, seed=args.seed)
    for which in ("target", "draft"):  # both exist (and their options are valid) before either loads
        options = loader_kwargs(args, which)["model_kwargs"]
        resolve_model_source(getattr(args, which), what=f"--{which}", model_kwargs=options)
    target = load_model(args.target, device="cpu", dtype="float32", what="--target", **loader_kwargs(args))
    draft = load_model(args.draft, device="cpu", dtype="float32", what="--draft", **loader_kwargs(args, "draft"))
    encdec = bool(getattr(target.config, "is_encoder_decoder", False))
    if encdec != bool(getattr(draft.config, "is_encoder_decoder", False)):
        raise CLIError("--target and --draft must both be decoder-only or both encoder-decoder models")
    data = load_data(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = val_pool = None
    if args.generate or args.val_generate:
        if encdec:
            raise CLIError("--generate/--val-generate need a decoder-only pair")
        from specdec.zoo.distill import generate_greedy, prompts_from_stream

        device = resolve_device(args.device)
        if args.generate:
            prompts = prompts_from_stream(data.train, args.generate, args.prompt_len, seed=args.seed + 1,
                                          document_starts=args.document_starts)
            pool = generate_greedy(target, prompts, args.new_tokens, batch_size=args.gen_batch_size, device=device)
        if args.val_generate:
            prompts = prompts_from_stream(data.val, args.val_generate, args.prompt_len, seed=args.seed + 2,
                                          document_starts=args.document_starts)
            val_pool = generate_greedy(target, prompts, args.new_tokens, batch_size=args.gen_batch_size, device=device)
    result = distill_draft(target, draft, data, replace(distill_cfg, train=tc), log_path=out / "distill.csv",
                           device=args.device, progress=not args.no_progress, pool=pool, val_pool=val_pool,
                           prompt_len=args.prompt_len)
    save_model(draft, out / "draft", data.tokenizer_dir, dtype=preset.export_dtype,
               max_shard_size=preset.max_shard_size)
    (out / "distill.json").write_text(dumps(result.to_dict(), indent=1))
    brief = result.to_dict()
    brief["train"] = {k: brief["train"][k] for k in ("steps", "seconds", "val_loss", "final_loss")}
    print(dumps(brief, indent=1))
    return 0


def run_head(args) -> int:
    """`specdec train head`: a feature-level draft head on the frozen --target, saved as a head folder."""
    from specdec.loading import load_model, resolve_model_source
    from specdec.zoo.data import TokenData, load_data
    from specdec.zoo.feature_head import DEFAULT_HEAD, train_head
    from specdec.zoo.models import resolve_device

    fraction = args.generated_fraction if args.generated_fraction is not None else (0.5 if args.generate else 0.0)
    if fraction and not args.generate:
        raise CLIError("--generated-fraction needs --generate N")
    resolve_model_source(args.target, what="--target", model_kwargs=loader_kwargs(args)["model_kwargs"])
    target = load_model(args.target, device="cpu", dtype="float32", what="--target", **loader_kwargs(args))
    if getattr(target.config, "model_type", None) != "llama":
        raise CLIError(f"--target: the head trainer covers Llama targets, got {target.config.model_type!r}")
    data = load_data(args.data)
    if not isinstance(data, TokenData):
        raise CLIError("--data: the head trains on a decoder-only corpus (`specdec train prepare --corpus code`)")
    if int(data.meta["vocab_size"]) != target.config.vocab_size:
        raise CLIError(f"--data: its tokenizer has {data.meta['vocab_size']} tokens, the target {target.config.vocab_size}")
    tc = replace(DEFAULT_HEAD.train, max_seconds=args.max_seconds, steps=args.steps, batch_size=args.batch_size,
                 seq_len=args.seq_len, lr=args.lr, seed=args.seed)
    cfg = replace(DEFAULT_HEAD, train=tc, kl_weight=args.kl_weight, feature_noise=args.feature_noise, init=args.init,
                  generated_fraction=fraction, batch_reuse=args.batch_reuse, depth=args.depth,
                  feature_cache_tokens=args.feature_cache_tokens, feature_cache_refresh=args.feature_cache_refresh,
                  kl_kernel=args.kl_kernel)
    device = resolve_device(args.device)
    pool = None
    if args.generate:
        from specdec.zoo.distill import generate_greedy, prompts_from_stream

        prompts = prompts_from_stream(data.train, args.generate, args.prompt_len, seed=args.seed + 1,
                                      document_starts=0.5)
        pool = generate_greedy(target, prompts, args.new_tokens, batch_size=args.gen_batch_size, device=device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head, result = train_head(target, data, cfg, device=device, log_path=out / "head.csv", pool=pool)
    head.to_feature_head().save(out)
    summary = {"target": str(args.target), "config": {"kl_weight": cfg.kl_weight, "feature_noise": cfg.feature_noise,
               "init": cfg.init, "generated_fraction": fraction,
               "generated_sequences": 0 if pool is None else len(pool),
               "depth": cfg.depth, "feature_cache_tokens": cfg.feature_cache_tokens,
               "feature_cache_refresh": cfg.feature_cache_refresh, "batch_size": tc.batch_size, "lr": tc.lr},
               **result.to_dict()}
    (out / "head_train.json").write_text(dumps(summary, indent=1))
    print(dumps(summary, indent=1))
    return 0
