"""Draft distillation: fine-tune the drafter q on the target's soft distribution p, and measure α.

Loss: KL(p‖q) = Σ_x p(x) (log p(x) − log q(x)), averaged over positions of corpus text (teacher forcing),
with p and q at a softening temperature (1 by default). This is the quantity §3 of the paper cares about:
α = E[Σ_x min(p(x), q(x))] = 1 − E[D_TV(p, q)], and Pinsker bounds D_TV by √(KL/2).

α here is measured the same way on held-out text: mean over positions of Σ_x min(p(x), q(x)) with p, q
the standardized distributions (temperature 0: one-hot argmax, so β = [argmax p = argmax q];
temperature t > 0: softmax(logits / t)).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from specdec.zoo.data import PairData, TokenData
from specdec.zoo.presets import DistillConfig
from specdec.zoo.train import TrainResult, _autocast, _to, forward_logits, resolve_device, run_training

logger = logging.getLogger(__name__)


def standardized_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`[..., V]` logits → probabilities; temperature 0 is the one-hot argmax."""
    logits = logits.float()
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def acceptance_per_position(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) for each position: `[..., V]`, `[..., V]` → `[...]`."""
    if temperature == 0:  # avoid materializing one-hots: β is 1 exactly when the argmaxes agree
        return (target_logits.argmax(-1) == draft_logits.argmax(-1)).float()
    p = standardized_probs(target_logits, temperature)
    q = standardized_probs(draft_logits, temperature)
    return torch.minimum(p, q).sum(-1)


@torch.no_grad()
def alpha_on_batches(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    batches: list,
    *,
    temperatures: tuple[float, ...] = (0.0, 1.0),
    device: str | torch.device | None = None,
    bf16: bool = True,
) -> dict[float, float]:
    """α (mean β over all non-ignored positions of teacher-forced held-out batches) per temperature."""
    device = resolve_device(device)
    modes = (target.training, draft.training)
    target.eval()
    draft.eval()
    sums = {t: 0.0 for t in temperatures}
    count = 0
    for batch in batches:
        batch = _to(batch, device)
        with _autocast(device, bf16):
            p_logits, targets = forward_logits(target, batch)
            q_logits, _ = forward_logits(draft, batch)
        mask = targets != -100
        for t in temperatures:
            sums[t] += float(acceptance_per_position(p_logits.float()[mask], q_logits.float()[mask], t).sum())
        count += int(mask.sum())
    target.train(modes[0])
    draft.train(modes[1])
    return {t: s / max(1, count) for t, s in sums.items()}


def kl_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(p‖q) averaged over positions where mask is true; fp32."""
    log_p = F.log_softmax(target_logits.float()[mask] / temperature, dim=-1)
    log_q = F.log_softmax(draft_logits.float()[mask] / temperature, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


@dataclass
class DistillResult:
    alpha_before: dict[float, float]
    alpha_after: dict[float, float]
    train: TrainResult

    def to_dict(self) -> dict:
        return {"alpha_before": {str(k): v for k, v in self.alpha_before.items()},
                "alpha_after": {str(k): v for k, v in self.alpha_after.items()},
                "train": asdict(self.train)}


def distill_draft(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    data: TokenData | PairData,
    cfg: DistillConfig,
    *,
    log_path: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    desc: str = "distill",
) -> DistillResult:
    """Fine-tune `draft` in place on KL(p‖q) against the frozen `target` over corpus text;
    α at temperatures 0 and 1 on held-out text before and after."""
    device = resolve_device(device)
    tc = cfg.train
    target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    held_out = data.val_batches(tc.batch_size, tc.seq_len, cfg.alpha_batches)
    before = alpha_on_batches(target, draft.to(device), held_out, device=device, bf16=tc.bf16)
    logger.info("%s: alpha before %s", desc, before)

    def loss_fn(model, batch):
        with torch.no_grad():
            p_logits, targets = forward_logits(target, batch)
        q_logits, _ = forward_logits(model, batch)
        mask = targets != -100
        kl = kl_loss(p_logits, q_logits, mask, cfg.temperature)
        ce = F.cross_entropy(q_logits.float()[mask], targets[mask])  # logged only
        return kl, ce.detach()

    # the teacher's forward costs 2 FLOPs per parameter per token on top of the student's training
    teacher_fpt = 2.0 * sum(p.numel() for p in target.parameters())
    result = run_training(draft, data, tc, loss_fn=loss_fn, log_path=log_path, device=device, progress=progress,
                          desc=desc, extra_flops_per_token=teacher_fpt)
    after = alpha_on_batches(target, draft, held_out, device=device, bf16=tc.bf16)
    logger.info("%s: alpha after %s", desc, after)
    return DistillResult(before, after, result)
