"""Training a feature-level draft head (`specdec.fast.head.FeatureHead`) on a frozen target (EAGLE's recipe).

Per batch of corpus tokens x_0..x_{N−1}, the frozen target gives its final-normed features f_t and logits
(p_t: the law of x_{t+1}). The head reads (f_t, x_{t+1}) at position t and predicts f̂_{t+1}:

    loss = smooth-L1(f̂_{t+1}, f_{t+1}) + kl_weight · KL(p_{t+1} ‖ softmax(lm_head(f̂_{t+1})))

averaged over t = 0..N−2. Teacher forcing with true features matches only the first draft step; later steps
read the head's own predictions, so `feature_noise` adds U(−a, a) to the input features (EAGLE: a = 0.1)
to make it robust to its own errors. α is reported like `specdec.zoo.distill` does (β = Σ min(p, q) per
position on held-out batches, temperatures 0 and 1), for the first draft step.

The trainable head is a transformers one-layer Llama (vocabulary 1: it reads `inputs_embeds`) plus `fc`;
`TrainableHead.to_feature_head` converts it with `FastLlama.from_hf` (one weight mapping, not two).
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

from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.zoo.data import TokenData
from specdec.zoo.distill import MixedData, acceptance_per_position, kl_loss
from specdec.zoo.presets import TrainConfig
from specdec.zoo.train import TrainLog, _autocast, lr_at, make_optimizer, resolve_device

__all__ = ["HeadTrainConfig", "HeadTrainResult", "TrainableHead", "train_head", "head_alpha", "DEFAULT_HEAD"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadTrainConfig:
    train: TrainConfig  # steps (upper bound), batch_size, seq_len, lr, max_seconds, warm-up, AdamW, clip, seed, bf16
    kl_weight: float = 0.5  # weight of KL(p‖q) next to the feature regression
    feature_noise: float = 0.1  # input features + U(−a, a) during training (0 = off)
    alpha_batches: int = 4  # held-out batches for α before/after
    init: str = "last-layer"  # "last-layer": the head's layer starts as a copy of the target's last; "random"
    generated_fraction: float = 0.0  # share of each batch from the target's own greedy text (`pool` of train_head)
    batch_reuse: int = 1  # head steps per target pass (the frozen target's forward dominates a step's cost)
    depth: int = 3  # draft steps unrolled in training (1 = teacher forcing only; `TrainableHead.unrolled`)

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
        if self.init not in ("last-layer", "random"):
            raise ValueError(f"init must be 'last-layer' or 'random', got {self.init!r}")


# The GPU default (one H200, the zoo `gpu` target): ~90 s.
DEFAULT_HEAD = HeadTrainConfig(TrainConfig(steps=100_000, max_seconds=90, batch_size=32, seq_len=512, lr=1e-3,
                                           warmup_steps=100, min_lr_ratio=0.05, weight_decay=0.0, z_loss=0.0))


@dataclass
class HeadTrainResult:
    steps: int
    seconds: float
    first_loss: float
    final_loss: float
    tokens_per_s: float
    alpha_before: dict[float, float]
    alpha_after: dict[float, float]
    params: int
    alpha_after_by_step: dict[int, dict[float, float]] = field(default_factory=dict)  # draft step → α per T
    log_path: str | None = None
    losses: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("losses")
        out["alpha_before"] = {str(k): v for k, v in self.alpha_before.items()}
        out["alpha_after"] = {str(k): v for k, v in self.alpha_after.items()}
        out["alpha_after_by_step"] = {str(s): {str(k): v for k, v in a.items()} for s, a in self.alpha_after_by_step.items()}
        return out


class TrainableHead(torch.nn.Module):
    """fc + a transformers one-layer Llama; `forward(features, next_tokens, embed) -> f̂` (differentiable)."""

    def __init__(self, config: HeadConfig, seed: int = 0):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.fc = torch.nn.Linear(2 * config.dim, config.dim, bias=False)
        hf = LlamaConfig(vocab_size=1, hidden_size=config.dim, intermediate_size=config.intermediate_size,
                         num_hidden_layers=1, num_attention_heads=config.n_heads,
                         num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
                         max_position_embeddings=config.max_positions or 4096, rms_norm_eps=config.rms_norm_eps,
                         rope_theta=config.rope_theta, tie_word_embeddings=True, attn_implementation="sdpa",
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
        self.decoder = LlamaForCausalLM(hf)
        self.decoder.model.embed_tokens.weight.requires_grad_(False)  # a placeholder: the head reads vectors

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """(f_t `[B, T, dim]`, x_{t+1} `[B, T]`) at positions 0..T−1 → f̂_{t+1} `[B, T, dim]` (final-normed)."""
        x = self.fc(torch.cat([F.embedding(next_tokens, embed).to(features.dtype), features], -1))
        return self.decoder.model(inputs_embeds=x, use_cache=False).last_hidden_state

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor, depth: int) -> list:
        """Draft steps 1..depth from every origin at once (EAGLE-3's "training-time test").

        features `[B, N, dim]` (f_0..f_{N−1}), tokens `[B, N]` → [f̂ of step s: `[B, N−s, dim]` for s = 1..depth],
        row t of step s predicting f_{t+s}. Step 1 reads the true features; step s reads step s−1's predictions
        at position t+s−1 and attends, as when drafting, to the true entries at positions ≤ t and to its own
        chain (a block mask over the concatenated steps; positions as in the engine's head cache).
        """
        n = features.shape[1]
        embedded = F.embedding(tokens, embed).to(features.dtype)
        device = features.device
        blocks = [self.fc(torch.cat([embedded[:, 1:], features[:, :-1]], -1))]
        origins, steps = [torch.arange(n - 1, device=device)], [torch.ones(n - 1, dtype=torch.long, device=device)]
        outputs = []
        for s in range(1, depth + 1):
            origin, step = torch.cat(origins), torch.cat(steps)
            true_key = (step[None, :] == 1) & (origin[None, :] <= origin[:, None])
            own_chain = (step[None, :] > 1) & (step[None, :] <= step[:, None]) & (origin[None, :] == origin[:, None])
            mask = (true_key | own_chain)[None, None].expand(features.shape[0], 1, -1, -1)
            positions = (origin + step - 1)[None].expand(features.shape[0], -1)
            hidden = self.decoder.model(inputs_embeds=torch.cat(blocks, 1), attention_mask=mask,
                                        position_ids=positions, use_cache=False).last_hidden_state
            out = hidden[:, -blocks[-1].shape[1]:]
            outputs.append(out)
            width = n - 1 - s  # origins 0..N−2−s have a token x_{t+s+1} to feed
            if s == depth or width <= 0:
                break
            blocks.append(self.fc(torch.cat([embedded[:, s + 1 :], out[:, :width]], -1)))
            origins.append(torch.arange(width, device=device))
            steps.append(torch.full((width,), s + 1, dtype=torch.long, device=device))
        return outputs

    def init_from(self, target: torch.nn.Module) -> None:
        """The layer starts as the target's last layer; fc passes the features through (identity on f_t)."""
        with torch.no_grad():
            self.decoder.model.layers[0].load_state_dict(target.model.layers[-1].state_dict())
            self.decoder.model.norm.load_state_dict(target.model.norm.state_dict())
            dim = self.config.dim
            self.fc.weight.zero_()
            self.fc.weight[:, dim:].copy_(torch.eye(dim))
            self.fc.weight[:, :dim].normal_(0.0, 0.02)

    def to_feature_head(self, device="cpu", dtype: torch.dtype = torch.float32) -> FeatureHead:
        """The engine's `FeatureHead` with these weights (unbound)."""
        layer = FastLlama.from_hf(self.decoder, device=device, dtype=dtype)
        head = FeatureHead(self.config, layer=layer)
        with torch.no_grad():
            head.fc.copy_(self.fc.weight)
        return head.eval()


def _target_pass(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen target: (final-normed features `[B, N, dim]`, logits `[B, N, V]`) of tokens `[B, N]`."""
    hidden = target.model(input_ids=batch, use_cache=False).last_hidden_state  # LlamaModel applies the final norm
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
    return [(f, target.lm_head(f.to(hidden.dtype))) for f in predicted]


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
        with _autocast(device, bf16):
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

    Returns the trainable head (`.to_feature_head()` for the engine) and a summary with α before/after.
    bf16 autocast and fused AdamW on CUDA; fp32 on CPU.
    """
    if not isinstance(data, TokenData):
        raise TypeError(f"data must be a decoder-only corpus (TokenData), got {type(data).__name__}")
    device = resolve_device(device)
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
    if cfg.generated_fraction > 0:
        if pool is None:
            raise ValueError("generated_fraction > 0 needs a pool of generated text (pool=)")
        data = MixedData(data, pool, cfg.generated_fraction)
    before = head_alpha(target, head, held_out, device=device, bf16=tc.bf16)
    logger.info("head: alpha before %s", before)
    optimizer = make_optimizer(head, tc, device)
    params = [p for p in head.parameters() if p.requires_grad]
    rng = np.random.default_rng(tc.seed)
    noise_gen = torch.Generator(device=device).manual_seed(tc.seed)
    log = TrainLog(Path(log_path) if log_path else None,
                   columns=("step", "tokens", "loss", "regression", "kl", "lr", "grad_norm", "elapsed_s"))
    total_steps, losses, tokens = tc.steps, [], 0
    t0 = time.perf_counter()
    t_calib = t0
    step = 0
    while step < total_steps:
        if step == 5:
            t_calib = time.perf_counter()
        if step == 15 and tc.max_seconds is not None:  # fix the schedule's length to the time budget
            per_step = (time.perf_counter() - t_calib) / 10
            fit = int((tc.max_seconds - (time.perf_counter() - t0)) / per_step)
            total_steps = max(step + 1, min(tc.steps, step + fit))
            logger.info("head: %.1f ms/step -> %d steps in %.0f s", 1e3 * per_step, total_steps, tc.max_seconds)
        lr = lr_at(step, total_steps, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if step % cfg.batch_reuse == 0:
            batch = data.train_batch(tc.batch_size, tc.seq_len, rng).to(device, non_blocking=True)
            tokens += batch.shape[0] * (batch.shape[1] - 1)  # target tokens seen
            with _autocast(device, tc.bf16), torch.no_grad():
                hidden, p_logits = _target_pass(target, batch)
        with _autocast(device, tc.bf16):
            regression = kl = 0.0
            for s, (predicted, q_logits) in enumerate(_head_pass(head, target, hidden, batch, cfg.depth,
                                                                 cfg.feature_noise, noise_gen), 1):
                regression = regression + F.smooth_l1_loss(predicted.float(), hidden[:, s:].float()) / cfg.depth
                mask = torch.ones(q_logits.shape[:2], dtype=torch.bool, device=device)
                kl = kl + kl_loss(p_logits[:, s:], q_logits, mask) / cfg.depth
            loss = regression + cfg.kl_weight * kl
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        if bool(torch.isfinite(loss) & torch.isfinite(grad_norm)):  # one host sync per step
            optimizer.step()
        else:
            logger.warning("head step %d: non-finite loss/grad; step skipped", step)
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses.append(float(loss.detach()))
        log.write({"step": step, "tokens": tokens, "loss": round(losses[-1], 5),
                   "regression": round(float(regression.detach()), 5), "kl": round(float(kl.detach()), 5), "lr": f"{lr:.3e}",
                   "grad_norm": round(float(grad_norm), 4), "elapsed_s": round(time.perf_counter() - t0, 2)})
        if tc.max_seconds is not None and time.perf_counter() - t0 > 1.1 * tc.max_seconds:
            logger.warning("head: over the time budget, stopping at step %d of %d", step, total_steps)
            break
    log.close()
    seconds = time.perf_counter() - t0
    after = head_alpha(target, head, held_out, device=device, bf16=tc.bf16)
    by_step = {s: head_alpha(target, head, held_out, device=device, bf16=tc.bf16, step=s) for s in (2, 3)}
    logger.info("head: %d steps in %.1f s, loss %.4f -> %.4f, alpha after %s", step, seconds, losses[0],
                losses[-1], after)
    result = HeadTrainResult(steps=step, seconds=round(seconds, 2), first_loss=losses[0], final_loss=losses[-1],
                             tokens_per_s=round(tokens / max(seconds, 1e-9), 1), alpha_before=before,
                             alpha_after=after, alpha_after_by_step={1: after, **by_step},
                             params=sum(p.numel() for p in params),
                             log_path=None if log_path is None else str(log_path), losses=losses)
    return head, result
