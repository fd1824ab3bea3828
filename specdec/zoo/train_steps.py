"""The parts of a training step that the zoo's loops share (language models, distillation, feature heads).

`forward_logits` / `lm_loss` (CE plus z-loss from one log-partition), `make_optimizer` (AdamW, decay on matrices
only) and `lr_at` (warm-up then cosine), `to_device` / `batch_tokens` / `evaluate`, `autocast` (bf16 on CUDA) and
`training_attention` (encoder-decoder attention without cuDNN), and `TrainLog` (the per-step CSV).
"""

from __future__ import annotations

import contextlib
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.zoo.data import Seq2SeqBatch
from specdec.zoo.presets import TrainConfig

__all__ = ["TrainLog", "autocast", "batch_tokens", "evaluate", "forward_logits", "lm_loss", "lr_at", "make_optimizer",
           "to_device", "training_attention"]


def forward_logits(model: torch.nn.Module, batch: torch.Tensor | Seq2SeqBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, T, V], targets [B, T] with -100 where ignored) for either kind of batch."""
    if isinstance(batch, Seq2SeqBatch):
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=batch.labels)
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    decoder_input_ids=decoder_input_ids, use_cache=False)
        return out.logits, batch.labels
    out = model(input_ids=batch[:, :-1], use_cache=False)
    return out.logits, batch[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to optimize, cross-entropy alone), both fp32 means over non-ignored positions.

    logits `[B, T, V]`, targets `[B, T]` (-100 = ignored). One log-partition `lse [B·T]` serves both terms
    (CE = lse − logit[target], z-loss = lse²), so the fp32 logits are materialized once, not once per term."""
    logits = logits.flatten(0, 1).float()
    targets = targets.flatten()
    mask = targets != -100
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
    count = mask.sum().clamp(min=1)
    ce = torch.where(mask, lse - picked, 0.0).sum() / count
    if z_loss <= 0:
        return ce, ce
    return ce + z_loss * torch.where(mask, lse.pow(2), 0.0).sum() / count, ce


@dataclass
class TrainLog:
    """CSV per step (+ JSON summary); `rows` stay in memory for tests and reports."""

    path: Path | None
    rows: list[dict] = field(default_factory=list)
    columns: tuple[str, ...] = ("step", "tokens", "loss", "ce", "lr", "grad_norm", "val_loss", "tokens_per_s",
                                "mfu", "elapsed_s", "skipped")

    def __post_init__(self) -> None:
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "w", newline="")
            self._writer = csv.DictWriter(self._fh, fieldnames=list(self.columns), extrasaction="ignore")
            self._writer.writeheader()

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if self._fh is not None:
            self._writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in self.columns})
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device,
                   fused: bool | None = None) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices (ndim ≥ 2) only, never on norms or biases; fused on CUDA (or when asked)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"fused": True} if (device.type == "cuda" if fused is None else fused) else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, **kwargs)


def lr_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at total_steps."""
    warmup = max(1, min(cfg.warmup_steps, total_steps // 2))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        if device.type == "cuda" and batch.device.type == "cpu":
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    return batch.to(device)


def batch_tokens(batch) -> int:
    if isinstance(batch, Seq2SeqBatch):
        return int((batch.labels != -100).sum()) + int(batch.attention_mask.sum())
    return batch.shape[0] * (batch.shape[1] - 1)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, device: torch.device, bf16: bool = True) -> float:
    """Token-weighted mean cross-entropy (nats) over `batches`."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        batch = to_device(batch, device)
        with autocast(device, bf16):
            logits, targets = forward_logits(model, batch)
        n = int((targets != -100).sum())
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                                       reduction="sum"))
        count += n
    model.train(was_training)
    return total / max(1, count)


def autocast(device: torch.device, bf16: bool):
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def training_attention(model: torch.nn.Module, device: torch.device):
    """Encoder-decoder training on CUDA attends without cuDNN's SDPA kernel: cuDNN builds an execution plan for
    every new shape, and pair batches come in many shapes; its planning was ~30% of a T5 step's host time and
    ruling it out doubled the pairs trained per second (H200, `scripts/ende_train_profile.py` at 26f890c)."""
    if device.type != "cuda" or not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
