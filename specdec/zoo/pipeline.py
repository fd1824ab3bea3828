"""Whole-pair recipe: target, then each drafter (pre-train, distill), saved and summarized.

`train_pair(preset, data_dir, out_dir)` writes:

    out_dir/target/          HF folder (config, safetensors, tokenizer)
    out_dir/draft0/, ...     distilled drafters, same format
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
from specdec.zoo.distill import distill_draft
from specdec.zoo.presets import PairPreset
from specdec.zoo.train import count_params, resolve_device, save_model, train_model

logger = logging.getLogger(__name__)


def train_pair(
    preset: PairPreset,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> dict:
    """Train `preset`'s target and drafters on the prepared folder `data_dir`; returns the summary dict."""
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
    summary["drafts"] = []
    for i, shape in enumerate(preset.drafts):
        draft, draft_result = train_model(shape, data, preset.draft_train, vocab_size=vocab,
                                          log_path=logs / f"draft{i}.csv", device=device, progress=progress,
                                          desc=f"{preset.name} draft{i}")
        entry = {"shape": asdict(shape), "params": count_params(draft),
                 "params_ratio": round(count_params(target) / count_params(draft), 1), **draft_result.to_dict()}
        if preset.distill is not None:
            distilled = distill_draft(target, draft, data, preset.distill, log_path=logs / f"distill{i}.csv",
                                      device=device, progress=progress, desc=f"{preset.name} distill{i}")
            entry["distill"] = distilled.to_dict()
        save(draft, f"draft{i}")
        summary["drafts"].append(entry)
        _write(out / "summary.json", summary)
        del draft
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    _write(out / "summary.json", summary)
    return summary


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))
