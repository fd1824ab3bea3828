"""Training a feature-level draft head (`specdec.fast.head.FeatureHead`) on a frozen target (EAGLE's recipe).

Per batch of corpus tokens x_0..x_{N−1}, the frozen target gives its final-normed features f_t and logits
(p_t: the law of x_{t+1}). The head reads (f_t, x_{t+1}) at position t and predicts f̂_{t+1}:

    loss = smooth-L1(f̂_{t+1}, f_{t+1}) + kl_weight · KL(p_{t+1} ‖ softmax(lm_head(f̂_{t+1})))

averaged over t = 0..N−2. Teacher forcing with true features matches only the first draft step; later steps
read the head's own predictions, so `feature_noise` adds U(−a, a) to the input features (EAGLE: a = 0.1)
to make it robust to its own errors. α is reported like `specdec.zoo.distill` does (β = Σ min(p, q) per
position on held-out batches, temperatures 0 and 1), for the first draft step.

The trainable head (`specdec.zoo.trainable_head.TrainableHead`) is a transformers one-layer Llama plus `fc`;
`TrainableHead.to_feature_head` converts it with `FastLlama.from_hf` (one weight mapping, not two).

Speed (α per second is what a short budget buys): `feature_cache_tokens` > 0 runs the frozen target once over
a pool of rows and trains from its cached features (`specdec.zoo.head_cache`; p = the target's LM head on them);
`TrainableHead.unrolled` keeps earlier draft steps' keys/values (the layer runs on N rows per step, not s·N);
the KL and its gradient come from one fused pass over the logits (`head_kl.kl_rows`); on CUDA the optimizer
step is skipped on the device and the host syncs once per `log_every` steps.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specdec.analysis import drain
from specdec.fast.head import HeadConfig
from specdec.fast.kernels.select import check_kernel
from specdec.fast.model import LlamaShape
from specdec.zoo.data import TokenData
from specdec.zoo.distill import MixedData, acceptance_per_position
from specdec.zoo.head_cache import build_feature_cache, target_features
from specdec.zoo.head_kl import kl_rows
from specdec.zoo.presets import TrainConfig
from specdec.zoo.models import resolve_device
from specdec.zoo.speed import skip_non_finite_step
from specdec.zoo.train_steps import TrainLog, autocast, lr_at, make_optimizer, to_device
from specdec.zoo.trainable_head import TrainableHead

__all__ = ["HeadTrainConfig", "HeadTrainResult", "TrainableHead", "train_head", "head_alpha", "head_loss",
           "DEFAULT_HEAD"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadTrainConfig:
    train: TrainConfig  # steps (upper bound), batch_size, seq_len, lr, max_seconds, warm-up, AdamW, clip, seed, bf16
    kl_weight: float = 0.5  # weight of KL(p‖q) next to the feature regression
    feature_noise: float = 0.1  # input features + U(−a, a) during training (0 = off)
    alpha_batches: int = 4  # held-out batches for α before/after
    init: str = "last-layer"  # "last-layer": the head's layer starts as a copy of the target's last; "random"
    generated_fraction: float = 0.0  # share of each batch from the target's own greedy text (`pool` of train_head)
    batch_reuse: int = 1  # head steps per target pass, without the cache (the target's forward is most of a step)
    depth: int = 3  # draft steps unrolled in training (1 = teacher forcing only; `TrainableHead.unrolled`)
    feature_cache_tokens: int = 0  # > 0: run the target once over this many positions (`head_cache`); 0 = per step
    feature_cache_refresh: int = 0  # > 0: every this many head steps, one target pass replaces batch_size corpus rows
    log_every: int = 25  # CUDA: one host sync per this many steps (CSV rows are still written for every step)
    kl_kernel: str = "auto"  # `head_kl.kl_rows`: "auto" (Triton on CUDA), "triton", "reference" (eager)

    def __post_init__(self) -> None:
        if self.kl_weight < 0 or not math.isfinite(self.kl_weight):
            raise ValueError(f"kl_weight must be a finite number ≥ 0, got {self.kl_weight}")
        if self.feature_noise < 0 or not math.isfinite(self.feature_noise):
            raise ValueError(f"feature_noise must be a finite number ≥ 0, got {self.feature_noise}")
        if not 0.0 <= self.generated_fraction <= 1.0:
            raise ValueError(f"generated_fraction must be in [0, 1], got {self.generated_fraction}")
        if isinstance(self.batch_reuse, bool) or not isinstance(self.batch_reuse, int) or self.batch_reuse < 1:
            raise ValueError(f"batch_reuse must be an integer ≥ 1, got {self.batch_reuse!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or not 1 <= self.depth <= 16:
            raise ValueError(f"depth must be an integer in [1, 16], got {self.depth!r}")
        for name in ("feature_cache_tokens", "feature_cache_refresh", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (name == "log_every"):
                raise ValueError(f"{name} must be an integer ≥ {int(name == 'log_every')}, got {value!r}")
        if self.feature_cache_refresh and not self.feature_cache_tokens:
            raise ValueError("feature_cache_refresh needs the feature cache (feature_cache_tokens > 0)")
        if self.feature_cache_tokens and self.batch_reuse > 1:
            raise ValueError("batch_reuse applies without the feature cache only (feature_cache_tokens=0)")
        check_kernel(self.kl_kernel, "kl_kernel")
        if self.init not in ("last-layer", "random"):
            raise ValueError(f"init must be 'last-layer' or 'random', got {self.init!r}")


# The GPU default (one H200, the zoo `gpu` target): ~90 s.
DEFAULT_HEAD = HeadTrainConfig(TrainConfig(steps=100_000, max_seconds=90, batch_size=32, seq_len=512, lr=1e-3,
                                           warmup_steps=100, min_lr_ratio=0.05, weight_decay=0.0, z_loss=0.0))


CALIBRATE = (5, 15)  # the steps whose timing fixes the schedule's length under max_seconds


@dataclass
class HeadTrainResult:
    steps: int
    seconds: float
    first_loss: float
    final_loss: float
    tokens_per_s: float  # head training positions per second (batch rows × (L − 1) per step), cache fill included
    alpha_before: dict[float, float]
    alpha_after: dict[float, float]
    params: int
    alpha_after_by_step: dict[int, dict[float, float]] = field(default_factory=dict)  # draft step → α per T
    cache_seconds: float = 0.0  # filling the feature cache (inside `seconds`)
    step_ms: float | None = None  # steady time per head step (synchronized, after the first CALIBRATE[0] steps)
    log_path: str | None = None
    losses: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("losses")
        out["alpha_before"] = {str(k): v for k, v in self.alpha_before.items()}
        out["alpha_after"] = {str(k): v for k, v in self.alpha_after.items()}
        out["alpha_after_by_step"] = {str(s): {str(k): v for k, v in a.items()} for s, a in self.alpha_after_by_step.items()}
        return out


def _target_pass(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen target: (final-normed features `[B, N, dim]`, logits `[B, N, V]`) of tokens `[B, N]`."""
    hidden = target_features(target, batch)
    return hidden, target.lm_head(hidden)


def _head_pass(head: TrainableHead, target, hidden: torch.Tensor, batch: torch.Tensor, depth: int = 1,
               noise: float = 0.0, generator: torch.Generator | None = None) -> list:
    """Per draft step s = 1..depth: (f̂ `[B, N−s, dim]` predicting f_{s..N−1}, its logits through the target's
    LM head `[B, N−s, V]`)."""
    features = hidden
    if noise > 0:
        u = torch.rand(features.shape, device=features.device, generator=generator, dtype=torch.float32)
        features = features + ((2 * u - 1) * noise).to(features.dtype)
    embed = target.get_input_embeddings().weight
    if depth == 1:
        predicted = [head(features[:, :-1], batch[:, 1:], embed)]
    else:
        predicted = head.unrolled(features, batch, embed, depth)
    return [(f, target.lm_head(f.to(target.lm_head.weight.dtype))) for f in predicted]


def head_loss(head: TrainableHead, target, features: torch.Tensor, tokens: torch.Tensor, p_logits: torch.Tensor,
              cfg: HeadTrainConfig, generator: torch.Generator | None = None) -> tuple:
    """(loss, regression, kl) of one batch: features `[B, N, dim]` and logits `[B, N, V]` of the frozen target on
    tokens `[B, N]`, averaged over the `cfg.depth` unrolled draft steps (call under the training autocast)."""
    regression = kl = 0.0
    for s, (predicted, q_logits) in enumerate(_head_pass(head, target, features, tokens, cfg.depth,
                                                         cfg.feature_noise, generator), 1):
        regression = regression + F.smooth_l1_loss(predicted.float(), features[:, s:].float()) / cfg.depth
        kl = kl + kl_rows(q_logits, p_logits[:, s:], kernel=cfg.kl_kernel).mean() / cfg.depth  # = distill.kl_loss; fused on CUDA
    return regression + cfg.kl_weight * kl, regression, kl


@torch.no_grad()
def head_alpha(target, head: TrainableHead, batches: list, *, temperatures=(0.0, 1.0), device=None,
               bf16: bool = True, step: int = 1) -> dict[float, float]:
    """α of draft step `step` (1: mean β(p_{t+1}, q(f̂_{t+1})), teacher-forced; s > 1: the head's own predicted
    features for steps 1..s−1, the true tokens) over held-out batches, per temperature."""
    device = resolve_device(device)
    was_training = head.training
    head.eval()
    sums, count = {t: 0.0 for t in temperatures}, 0
    for batch in batches:
        batch = batch.to(device)
        with autocast(device, bf16):
            hidden, p_logits = _target_pass(target, batch)
            _, q_logits = _head_pass(head, target, hidden, batch, step)[-1]
        p, q = p_logits[:, step:].float().flatten(0, 1), q_logits.float().flatten(0, 1)
        for t in temperatures:
            sums[t] += float(acceptance_per_position(p, q, t).sum())
        count += p.shape[0]
    head.train(was_training)
    return {t: s / max(1, count) for t, s in sums.items()}


def train_head(target: torch.nn.Module, data: TokenData, cfg: HeadTrainConfig, *, device=None,
               log_path: str | os.PathLike | None = None, head: TrainableHead | None = None,
               pool: torch.Tensor | None = None) -> tuple[TrainableHead, HeadTrainResult]:
    """Train a head on `target` (a transformers Llama-family causal LM, kept frozen) over `data`'s corpus
    (and, with `cfg.generated_fraction` > 0, over `pool`: the target's greedy text, `distill.generate_greedy`).

    With `cfg.feature_cache_tokens` > 0 the target runs once, filling a `FeatureCache` (inside the time budget),
    and head steps read batches from it; otherwise every `cfg.batch_reuse` head steps run the target on a batch.
    Returns the trainable head (`.to_feature_head()` for the engine) and a summary with α before/after.
    bf16 autocast and fused AdamW stepped/skipped on the device (one host sync per `log_every` steps) on CUDA;
    fp32 on CPU.
    """
    if not isinstance(data, TokenData):
        raise TypeError(f"data must be a decoder-only corpus (TokenData), got {type(data).__name__}")
    device = resolve_device(device)
    cuda = device.type == "cuda"
    tc = cfg.train
    target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    if head is None:
        head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=tc.seed)
        if cfg.init == "last-layer":
            head.init_from(target)
    head.to(device).train()
    held_out = data.val_batches(tc.batch_size, tc.seq_len, cfg.alpha_batches)
    if cfg.generated_fraction > 0 and pool is None:
        raise ValueError("generated_fraction > 0 needs a pool of generated text (pool=)")
    before = head_alpha(target, head, held_out, device=device, bf16=tc.bf16)
    logger.info("head: alpha before %s", before)
    optimizer = make_optimizer(head, tc, device)
    params = [p for p in head.parameters() if p.requires_grad]
    rng = np.random.default_rng(tc.seed)
    noise_gen = torch.Generator(device=device).manual_seed(tc.seed)
    log = TrainLog(Path(log_path) if log_path else None,
                   columns=("step", "tokens", "loss", "regression", "kl", "lr", "grad_norm", "skipped", "elapsed_s"))
    log_every = cfg.log_every if cuda else 1
    t0 = time.perf_counter()
    cache = None
    if cfg.feature_cache_tokens:
        with autocast(device, tc.bf16), torch.no_grad():
            cache = build_feature_cache(target, data, max_tokens=cfg.feature_cache_tokens, batch_size=tc.batch_size,
                                        seq_len=tc.seq_len, rng=rng, device=device, pool=pool,
                                        generated_fraction=cfg.generated_fraction,
                                        dtype=torch.bfloat16 if cuda and tc.bf16 else torch.float32)
        drain(device)
        if tc.max_seconds is not None and time.perf_counter() - t0 > 0.5 * tc.max_seconds:
            logger.warning("head: filling the feature cache took %.0f s of the %.0f s budget; lower "
                           "feature_cache_tokens", time.perf_counter() - t0, tc.max_seconds)
        logger.info("head: feature cache of %d tokens (%.2f GiB) in %.1f s", cache.tokens_held, cache.nbytes / 2**30,
                    time.perf_counter() - t0)
    elif cfg.generated_fraction > 0:
        data = MixedData(data, pool, cfg.generated_fraction)
    cache_seconds = time.perf_counter() - t0
    total_steps, losses, tokens, pending = tc.steps, [], 0, []
    t_calib = t0
    step = 0

    def flush() -> None:  # one host sync for the buffered steps' numbers
        values = torch.stack([row.pop("values") for row in pending]).tolist()
        for row, (loss_v, regression_v, kl_v, norm_v, skipped_v) in zip(pending, values):
            losses.append(loss_v)
            if skipped_v:
                logger.warning("head step %d: non-finite loss/grad; step skipped", row["step"])
            log.write({**row, "loss": round(loss_v, 5), "regression": round(regression_v, 5), "kl": round(kl_v, 5),
                       "grad_norm": round(norm_v, 4), "skipped": int(skipped_v)})
        pending.clear()

    while step < total_steps:
        if step == CALIBRATE[0]:
            drain(device)
            t_calib = time.perf_counter()
        if step == CALIBRATE[1] and tc.max_seconds is not None:  # fix the schedule's length to the time budget
            drain(device)
            per_step = (time.perf_counter() - t_calib) / (CALIBRATE[1] - CALIBRATE[0])
            fit = int((tc.max_seconds - (time.perf_counter() - t0)) / per_step)
            total_steps = max(step + 1, min(tc.steps, step + fit))
            logger.info("head: %.1f ms/step -> %d steps in %.0f s", 1e3 * per_step, total_steps, tc.max_seconds)
        lr = lr_at(step, total_steps, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if cache is not None:
            refresh = cfg.feature_cache_refresh
            if refresh and step and step % refresh == 0 and cache.corpus is not None:
                with autocast(device, tc.bf16):
                    cache.refresh(target, data, rng, tc.batch_size)
            batch, hidden = cache.sample(tc.batch_size, noise_gen)
            with autocast(device, tc.bf16), torch.no_grad():
                p_logits = target.lm_head(hidden)  # the target's logits = its LM head on its final-normed features
        elif step % cfg.batch_reuse == 0:
            batch = to_device(data.train_batch(tc.batch_size, tc.seq_len, rng), device)  # pinned: no host sync
            with autocast(device, tc.bf16), torch.no_grad():
                hidden, p_logits = _target_pass(target, batch)
        tokens += batch.shape[0] * (batch.shape[1] - 1)  # positions the head trained on
        with autocast(device, tc.bf16):
            loss, regression, kl = head_loss(head, target, hidden, batch, p_logits, cfg, noise_gen)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        if optimizer.defaults.get("fused"):
            skipped = skip_non_finite_step(optimizer, loss, grad_norm)  # decided on the device: no host sync
        else:
            skipped = torch.tensor(0.0 if bool(torch.isfinite(loss) & torch.isfinite(grad_norm)) else 1.0)
            if not skipped:
                optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        values = torch.stack([loss.detach(), regression.detach(), kl.detach(), grad_norm, skipped]).float()
        pending.append({"step": step, "tokens": tokens, "lr": f"{lr:.3e}", "values": values,
                        "elapsed_s": round(time.perf_counter() - t0, 2)})
        if step % log_every == 0 or step == total_steps:
            flush()
            if tc.max_seconds is not None and time.perf_counter() - t0 > 1.1 * tc.max_seconds:
                logger.warning("head: over the time budget, stopping at step %d of %d", step, total_steps)
                break
    if pending:
        flush()
    log.close()
    drain(device)
    seconds = time.perf_counter() - t0
    step_ms = 1e3 * (time.perf_counter() - t_calib) / (step - CALIBRATE[0]) if step > CALIBRATE[0] else None
    del cache
    after = head_alpha(target, head, held_out, device=device, bf16=tc.bf16)
    by_step = {s: head_alpha(target, head, held_out, device=device, bf16=tc.bf16, step=s) for s in (2, 3)}
    logger.info("head: %d steps in %.1f s, loss %.4f -> %.4f, alpha after %s", step, seconds, losses[0],
                losses[-1], after)
    result = HeadTrainResult(steps=step, seconds=round(seconds, 2), first_loss=losses[0], final_loss=losses[-1],
                             tokens_per_s=round(tokens / max(seconds, 1e-9), 1), alpha_before=before,
                             alpha_after=after, alpha_after_by_step={1: after, **by_step},
                             params=sum(p.numel() for p in params), cache_seconds=round(cache_seconds, 2),
                             step_ms=None if step_ms is None else round(step_ms, 3),
                             log_path=None if log_path is None else str(log_path), losses=losses)
    return head, result
