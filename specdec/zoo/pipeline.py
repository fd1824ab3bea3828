"""Whole-pair recipe: target, then each drafter (pre-train, distill), saved and summarized.

`train_pair(preset, data_dir, out_dir)` writes:

    out_dir/target/          HF folder (config, safetensors, tokenizer)
    out_dir/draft0/, ...     drafters (pre-trained and/or initialized from the target, then distilled)
    out_dir/head/            optional (`head=`): a feature-level draft head (`specdec.zoo.feature_head`)
    out_dir/logs/*.csv       per-step logs (+ .json summaries) of every phase
    out_dir/summary.json     sizes, validation losses, α before/after distillation, timings
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from specdec.zoo.data import load_data
from specdec.zoo.distill import distill_draft, generate_greedy, init_from_target, prompts_from_stream
from specdec.zoo.presets import GeneratedPool, PairPreset
from specdec.zoo.models import build_model, count_params, resolve_device, save_model
from specdec.zoo.train import run_training, train_model

logger = logging.getLogger(__name__)


def train_pair(
    preset: PairPreset,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    progress: bool = True,
    head=None,
) -> dict:
    """Train `preset`'s target and drafters on the prepared folder `data_dir`; returns the summary dict.

    head: a `specdec.zoo.feature_head.HeadTrainConfig` to also train a feature head on the target (out_dir/head)."""
    device = resolve_device(device)
    data = load_data(data_dir)
    if data.meta.get("corpus") != preset.corpus:
        raise ValueError(f"preset {preset.name!r} trains on the {preset.corpus!r} corpus but {data_dir} "
                         f"holds {data.meta.get('corpus')!r}")
    vocab = int(data.meta["vocab_size"])
    out = Path(out_dir)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    summary: dict = {"preset": preset.name, "device": str(device),
                     "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "data": {k: v for k, v in data.meta.items() if not k.endswith("sources")
                                                          and k != "catalogs"},
                     "preset_config": asdict(preset)}
    try:
        import transformers

        summary["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass

    def save(model, name):
        return save_model(model, out / name, data.tokenizer_dir, dtype=preset.export_dtype,
                          max_shard_size=preset.max_shard_size)

    target, target_result = train_model(preset.target, data, preset.target_train, vocab_size=vocab,
                                        log_path=logs / "target.csv", device=device, progress=progress,
                                        desc=f"{preset.name} target")
    save(target, "target")
    summary["target"] = {"shape": asdict(preset.target), "params": count_params(target), **target_result.to_dict()}
    _write(out / "summary.json", summary)
    pool = val_pool = None
    if preset.pool is not None and any(r.distill and r.distill.generated_fraction > 0 for r in preset.drafts):
        pool, val_pool = make_pools(target, data, preset.pool, device)
        summary["generated_pool"] = {"train_sequences": len(pool), "val_sequences": len(val_pool),
                                     **asdict(preset.pool)}
    if head is not None:
        from specdec.zoo.feature_head import train_head

        trained, head_result = train_head(target, data, head, device=device, log_path=logs / "head.csv", pool=pool)
        trained.to_feature_head().save(out / "head")
        summary["head"] = head_result.to_dict()
        _write(out / "summary.json", summary)
        del trained
    summary["drafts"] = []
    for i, recipe in enumerate(preset.drafts):
        shape = recipe.shape
        draft = build_model(shape, vocab, seed=i + 1)
        entry: dict = {"shape": asdict(shape), "init": recipe.init, "params": count_params(draft),
                       "params_ratio": round(count_params(target) / count_params(draft), 1)}
        if recipe.init == "target":
            entry["copied_from_target"] = init_from_target(draft, target)
            if not entry["copied_from_target"]:
                logger.warning("draft%d: shapes differ from the target's, nothing copied (random init)", i)
        elif recipe.init != "scratch":
            raise ValueError(f"draft{i}: init must be 'scratch' or 'target', got {recipe.init!r}")
        if recipe.pretrain is not None:
            pre = run_training(draft, data, recipe.pretrain, log_path=logs / f"draft{i}.csv", device=device,
                               progress=progress, desc=f"{preset.name} draft{i}")
            entry.update(pre.to_dict())
        if recipe.distill is not None:
            distilled = distill_draft(target, draft, data, recipe.distill, log_path=logs / f"distill{i}.csv",
                                      device=device, progress=progress, desc=f"{preset.name} distill{i}",
                                      pool=pool, val_pool=val_pool,
                                      prompt_len=preset.pool.prompt_len if preset.pool else 0)
            entry["distill"] = distilled.to_dict()
        save(draft, f"draft{i}")
        summary["drafts"].append(entry)
        _write(out / "summary.json", summary)
        del draft
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    _write(out / "summary.json", summary)
    return summary


def make_pools(target, data, pool_cfg: GeneratedPool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy target text from random train-stream prompts (distillation) and val-stream prompts (α)."""
    t0 = time.perf_counter()
    n_train = pool_cfg.batch_size * 64  # upper bound; max_seconds usually stops earlier
    train_prompts = prompts_from_stream(data.train, n_train, pool_cfg.prompt_len, seed=1)
    pool = generate_greedy(target, train_prompts, pool_cfg.new_tokens, batch_size=pool_cfg.batch_size,
                           max_seconds=pool_cfg.max_seconds, device=device)
    val_prompts = prompts_from_stream(data.val, pool_cfg.val_sequences, pool_cfg.prompt_len, seed=2)
    val_pool = generate_greedy(target, val_prompts, pool_cfg.new_tokens, batch_size=pool_cfg.batch_size, device=device)
    logger.info("generated %d + %d greedy sequences of %d tokens in %.1f s", len(pool), len(val_pool),
                pool.shape[1], time.perf_counter() - t0)
    return pool, val_pool


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))
