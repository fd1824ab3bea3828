"""Training: build `transformers` models from a `ModelShape`, one stable loop, save like user checkpoints.

Stability measures (a 216M Llama with plain bf16 autocast went NaN within 400 steps before these):
fp32 master weights + bf16 autocast (CUDA only), AdamW with β2 = 0.95 and weight decay on matrices only,
linear warm-up then cosine decay, gradient clipping, scaled residual init (output projections × 1/√(2L)),
a small z-loss on the log-partition, and a step whose loss or gradient norm is not finite is skipped
(logged, weights untouched) instead of applied. Every step is logged to CSV (step, loss, lr, grad norm,
tokens/s, MFU; validation loss at intervals); a JSON summary sits next to it.

Speed (CUDA, `fast` mode, see `run_training`): fused AdamW whose step is skipped ON THE DEVICE when the loss or
gradient norm is not finite (no host sync per step), training windows cut on the GPU from the whole token
stream held there, `torch.compile` of the model and the loss (decoder-only batches of one fixed shape),
causal SDPA without a mask tensor (flash attention) for decoder-only training, and host reads of the loss
only every `log_every` steps. The compile time is inside the wall-clock budget; the result reports it
(`first_step_seconds`) and the steady-state throughput after it (`steady_tokens_per_s`, `steady_mfu`).
CPU runs keep the plain path: fp32, no compile, one row per step.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specdec.zoo.data import PairData, Seq2SeqBatch, TokenData
from specdec.zoo.presets import ModelShape, TrainConfig

logger = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # fixed by specdec.zoo.tokenizer.SPECIAL_TOKENS
MAX_CONSECUTIVE_SKIPS = 25

# Dense bf16 peak of known accelerators, for MFU (vendor datasheet numbers).
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


# ------------------------------------------------------------------------------------------- models


def build_model(shape: ModelShape, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """A freshly initialized HF model: LlamaForCausalLM (SDPA attention) or T5ForConditionalGeneration."""
    torch.manual_seed(seed)
    if shape.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        if shape.dim % shape.heads:
            raise ValueError(f"dim {shape.dim} is not divisible by heads {shape.heads}")
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=shape.dim,
            intermediate_size=shape.ff,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads or shape.heads,
            max_position_embeddings=shape.max_len,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            initializer_range=0.02,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            attn_implementation="sdpa",
        )
        model = LlamaForCausalLM(config)
        # scaled residual init (GPT-2): each block adds two outputs to the residual stream
        scale = 1.0 / math.sqrt(2 * shape.layers)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(scale)
                layer.mlp.down_proj.weight.mul_(scale)
    elif shape.arch == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(
            vocab_size=vocab_size,
            d_model=shape.dim,
            d_kv=shape.dim // shape.heads,
            d_ff=shape.ff,
            num_layers=shape.layers,
            num_decoder_layers=shape.layers,
            num_heads=shape.heads,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            dropout_rate=shape.dropout,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=PAD_ID,
        )
        model = T5ForConditionalGeneration(config)
        # transformers initializes an untied T5 head with std 1.0 (made for a tied head whose input is scaled
        # by d_model^-0.5): logits then have std ≈ √d_model (≈ 23 at d = 512, initial loss ≈ 170 nats instead
        # of ln V ≈ 9) and AdamW spends the whole budget shrinking the head; std d_model^-0.5 gives unit logits
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, shape.dim**-0.5)
    else:
        raise ValueError(f"unknown arch {shape.arch!r}; expected 'llama' or 't5'")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = EOS_ID, PAD_ID
    if shape.arch == "llama":
        gen.bos_token_id = BOS_ID
    else:
        gen.decoder_start_token_id = PAD_ID
    return model


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Training FLOPs per token: 6·(matmul params) + 12·L·d·T for attention (PaLM appendix B, the MFU
    convention: attention counted in full, as PaLM does, even where a causal kernel skips half of it).

    Encoder-decoder: a token passes through one of the two stacks (source tokens the encoder, target tokens
    the decoder), so per counted token it is half of the matmul parameters and of the layers."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    matmul_params = count_params(model) - emb  # input embedding is a lookup, not a matmul
    if getattr(cfg, "tie_word_embeddings", False):
        matmul_params += emb  # ...but the tied output head is
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", 0) * 2
    dim = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model")
    share = 0.5 if getattr(cfg, "is_encoder_decoder", False) else 1.0
    return share * (6.0 * matmul_params + 12.0 * layers * dim * seq_len)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            return value
    return None


# -------------------------------------------------------------------------------------------- loss


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


# ----------------------------------------------------------------------------------------- logging


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


@dataclass
class TrainResult:
    steps: int
    skipped_steps: int
    tokens: int
    seconds: float
    final_loss: float
    val_loss: float
    val_curve: list[tuple[int, float]]
    tokens_per_s: float
    mfu: float | None
    params: int
    log_path: str | None
    peak_memory_gb: float | None = None
    fast: bool = False  # the CUDA path (fused step skipped on the device, logs every cfg.log_every steps)
    compiled: bool = False  # trained through torch.compile
    causal_attention: bool = False  # decoder-only attention through causal SDPA without a mask
    first_step_seconds: float | None = None  # the first step alone (with compile: mostly compile time)
    steady_tokens_per_s: float | None = None  # from step 5 on: no compile, no evaluations
    steady_mfu: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# -------------------------------------------------------------------------------------------- loop


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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


def _to(batch, device):
    if isinstance(batch, torch.Tensor):
        if device.type == "cuda" and batch.device.type == "cpu":
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    return batch.to(device)


def _num_tokens(batch) -> int:
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
        batch = _to(batch, device)
        with _autocast(device, bf16):
            logits, targets = forward_logits(model, batch)
        n = int((targets != -100).sum())
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                                       reduction="sum"))
        count += n
    model.train(was_training)
    return total / max(1, count)


def _autocast(device: torch.device, bf16: bool):
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def _training_attention(model: torch.nn.Module, device: torch.device):
    """Encoder-decoder training on CUDA attends without cuDNN's SDPA kernel: cuDNN builds an execution plan for
    every new shape, and pair batches come in many shapes; its planning was ~30% of a T5 step's host time and
    ruling it out doubled the pairs trained per second (H200, `scripts/ende_train_profile.py` at 26f890c)."""
    if device.type != "cuda" or not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


LossFn = Callable[[torch.nn.Module, object], tuple[torch.Tensor, torch.Tensor]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_training(
    model: torch.nn.Module,
    data: TokenData | PairData,
    cfg: TrainConfig,
    *,
    loss_fn: LossFn | None = None,
    log_path: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    desc: str = "train",
    extra_flops_per_token: float = 0.0,
    fast: bool | None = None,
) -> TrainResult:
    """Train `model` in place on `data` under `cfg`. `loss_fn(model, batch) -> (loss, ce)` defaults to
    cross-entropy + z-loss; distillation passes its own (it receives the compiled module when compiling).
    Returns a summary; the CSV log is at `log_path`.

    fast (default: on for CUDA): fused AdamW stepped or skipped on the device (no host sync per step), CSV
    rows every `cfg.log_every` steps, training windows drawn on the device for a token stream; on CUDA also
    causal SDPA without a mask for decoder-only models and, with `cfg.compile`, `torch.compile` of the model
    and the loss for fixed-shape (decoder-only) batches. Evaluations run the eager model."""
    from specdec.zoo.speed import DeviceWindows, causal_attention, compile_model, skip_non_finite_step

    device = resolve_device(device)
    fast = device.type == "cuda" if fast is None else fast
    cuda = device.type == "cuda"
    model.to(device).train()
    optimizer = make_optimizer(model, cfg, device, fused=True if fast else None)
    compiled = fast and cuda and cfg.compile and not isinstance(data, PairData)
    train_model = compile_model(model) if compiled else model
    loss_of = torch.compile(lm_loss) if compiled and loss_fn is None else lm_loss
    if loss_fn is None:

        def loss_fn(m, b):
            logits, targets = forward_logits(m, b)
            return loss_of(logits, targets, cfg.z_loss)

    params = [p for p in model.parameters() if p.requires_grad]
    rng = np.random.default_rng(cfg.seed)
    windows = DeviceWindows(data.train, device, cfg.seed) if fast and cuda and isinstance(data, TokenData) else None

    def next_batch():
        if windows is not None:
            return windows(cfg.batch_size, cfg.seq_len), cfg.batch_size * cfg.seq_len
        if cfg.batch_tokens is not None and isinstance(data, PairData):
            cpu_batch = data.token_batch(cfg.batch_tokens, rng)
        else:
            cpu_batch = data.train_batch(cfg.batch_size, cfg.seq_len, rng)
        return _to(cpu_batch, device), _num_tokens(cpu_batch)

    val = data.val_batches(cfg.batch_size, cfg.seq_len, cfg.eval_batches)
    log = TrainLog(Path(log_path) if log_path else None)
    fpt = flops_per_token(model, cfg.seq_len) + extra_flops_per_token
    peak = peak_flops(device)
    log_every = max(1, cfg.log_every) if fast else 1
    calib_start, calib_end = 5, 25  # steps whose timing fixes the step count under max_seconds
    total_steps = cfg.steps
    val_curve: list[tuple[int, float]] = []
    eval_seconds = 0.0

    def run_eval(step: int) -> float:
        nonlocal eval_seconds
        t = time.perf_counter()
        v = evaluate(model, val, device, cfg.bf16)
        eval_times.append(time.perf_counter() - t)
        eval_seconds += eval_times[-1]
        val_curve.append((step, v))
        return v

    eval_times: list[float] = []

    def replan(step: int) -> None:
        """Fix the step count (and so the cosine schedule) to end at max_seconds, from the steps timed since
        calib_start; redone after each evaluation, since the first evaluation (device warm-up) overstates
        what the later ones cost, and the step time may drift."""
        nonlocal total_steps
        _sync(device)
        now = time.perf_counter()
        per_step = (now - steady["t"] - (eval_seconds - steady["eval"])) / max(1, step - calib_start)
        later = eval_times[1:] or eval_times
        eval_cost = sum(later) / max(1, len(later))
        fit = int((cfg.max_seconds - (now - t0)) / (per_step + eval_cost / max(1, cfg.eval_every)))
        total_steps = max(step + 1, min(cfg.steps, step + fit))
        if bar is not None:
            bar.total = total_steps
            bar.refresh()
        logger.info("%s: %.1f ms/step -> %d steps in %.0f s", desc, 1e3 * per_step, total_steps, cfg.max_seconds)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_steps, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)
    t0 = time.perf_counter()
    with causal_attention(model, enabled=fast and cuda) as causal, _training_attention(model, device):
        first_val = run_eval(0)
        log.write({"step": 0, "tokens": 0, "val_loss": round(first_val, 5), "elapsed_s": 0.0, "skipped": 0})
        tokens = skipped = consecutive_skips = 0
        skipped_dev = torch.zeros((), device=device)  # fast path: counted on the device, read at log steps
        consecutive_dev = torch.zeros((), device=device)
        step = 0
        last_loss = float("nan")
        t_window = time.perf_counter()
        tokens_window = 0
        first_step_s = None
        steady = {"t": None, "tokens": 0, "eval": 0.0}
        while step < total_steps:
            if step == calib_start:
                _sync(device)
                steady.update(t=time.perf_counter(), tokens=tokens, eval=eval_seconds)
            if step == calib_end and cfg.max_seconds is not None:
                replan(step)
            lr = lr_at(step, total_steps, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch, n_tok = next_batch()
            try:
                with _autocast(device, cfg.bf16):
                    loss, ce = loss_fn(train_model, batch)
                loss.backward()
            except Exception as err:  # the first step failed compiled or with causal SDPA: train plainly
                if step > 0 or not (compiled or causal):
                    raise
                logger.warning("%s: first step failed with compile=%s, causal SDPA=%s (%s: %s); training eagerly "
                               "with the model's own attention", desc, compiled, bool(causal), type(err).__name__, err)
                optimizer.zero_grad(set_to_none=True)
                causal.restore()
                train_model, loss_of, compiled = model, lm_loss, False
                with _autocast(device, cfg.bf16):
                    loss, ce = loss_fn(train_model, batch)
                loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            loss = loss.detach()
            if fast:
                flag = skip_non_finite_step(optimizer, loss, grad_norm)
                skipped_dev += flag
                consecutive_dev = (consecutive_dev + 1) * flag
            else:
                finite = bool(torch.isfinite(loss) & torch.isfinite(grad_norm))  # one host sync per step
                if finite:
                    optimizer.step()
                    consecutive_skips = 0
                else:
                    skipped += 1
                    consecutive_skips += 1
                    logger.warning("%s step %d: non-finite loss/grad (loss=%s, grad_norm=%s); step skipped",
                                   desc, step, float(loss), float(grad_norm))
            optimizer.zero_grad(set_to_none=True)
            tokens += n_tok
            tokens_window += n_tok
            step += 1
            if step == 1:
                _sync(device)
                first_step_s = time.perf_counter() - t0 - eval_seconds
            stop_for_time = cfg.max_seconds is not None and time.perf_counter() - t0 > 1.1 * cfg.max_seconds
            is_eval = step % cfg.eval_every == 0 or step == total_steps or stop_for_time
            if step % log_every and not is_eval:
                if bar is not None:
                    bar.update(1)
                continue
            if fast:  # the host reads (and waits for) the device here only
                before = skipped
                skipped, consecutive_skips = int(skipped_dev), int(consecutive_dev)
                if skipped > before:
                    logger.warning("%s: %d non-finite step(s) skipped by step %d", desc, skipped - before, step)
            if consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
                log.close()
                raise FloatingPointError(f"{desc}: {consecutive_skips} consecutive non-finite steps at step {step}")
            last_loss = float(loss)
            row = {"step": step, "tokens": tokens, "loss": round(last_loss, 5), "ce": round(float(ce.detach()), 5),
                   "lr": f"{lr:.3e}", "grad_norm": round(float(grad_norm), 4),
                   "elapsed_s": round(time.perf_counter() - t0, 2), "skipped": skipped}
            if step % 10 == 0 or step == total_steps:
                now = time.perf_counter()
                tps = tokens_window / max(1e-9, now - t_window)
                row["tokens_per_s"] = round(tps, 1)
                row["mfu"] = None if peak is None else round(tps * fpt / peak, 4)
                t_window, tokens_window = now, 0
            if is_eval:
                row["val_loss"] = round(run_eval(step), 5)
                logger.info("%s step %d/%d: loss %.4f, val %.4f, lr %.2e, grad norm %.3f, %.0f s", desc, step,
                            total_steps, last_loss, row["val_loss"], lr, float(grad_norm), time.perf_counter() - t0)
                t_window, tokens_window = time.perf_counter(), 0  # the next window excludes the evaluation
                if cfg.max_seconds is not None and calib_end < step < total_steps and not stop_for_time:
                    replan(step)
            log.write(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{last_loss:.3f}", val=f"{val_curve[-1][1]:.3f}", lr=f"{lr:.1e}")
            if stop_for_time:
                logger.warning("%s: over the time budget, stopping at step %d of %d", desc, step, total_steps)
                break
        causal_used = bool(causal)
    if bar is not None:
        bar.close()
    _sync(device)
    seconds = time.perf_counter() - t0
    log.close()
    train_seconds = max(1e-9, seconds - eval_seconds)
    tps = tokens / train_seconds
    steady_tps = None
    if steady["t"] is not None and step > calib_start:
        steady_time = seconds - (steady["t"] - t0) - (eval_seconds - steady["eval"])
        steady_tps = (tokens - steady["tokens"]) / max(1e-9, steady_time)
    result = TrainResult(
        steps=step, skipped_steps=skipped, tokens=tokens, seconds=round(seconds, 2), final_loss=last_loss,
        val_loss=val_curve[-1][1], val_curve=val_curve, tokens_per_s=round(tps, 1),
        mfu=None if peak is None else round(tps * fpt / peak, 4), params=count_params(model),
        log_path=None if log_path is None else str(log_path),
        peak_memory_gb=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
        fast=fast, compiled=compiled, causal_attention=causal_used,
        first_step_seconds=None if first_step_s is None else round(first_step_s, 2),
        steady_tokens_per_s=None if steady_tps is None else round(steady_tps, 1),
        steady_mfu=None if peak is None or steady_tps is None else round(steady_tps * fpt / peak, 4),
    )
    if log_path is not None:
        Path(log_path).with_suffix(".json").write_text(json.dumps(result.to_dict(), indent=1))
    return result


def train_model(
    shape: ModelShape,
    data: TokenData | PairData,
    cfg: TrainConfig,
    *,
    vocab_size: int,
    log_path: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    desc: str = "train",
) -> tuple[torch.nn.Module, TrainResult]:
    """Build a model of `shape` and train it from scratch; returns (model, result)."""
    model = build_model(shape, vocab_size, seed=cfg.seed)
    result = run_training(model, data, cfg, log_path=log_path, device=device, progress=progress, desc=desc)
    return model, result


# -------------------------------------------------------------------------------------------- save


def save_model(
    model: torch.nn.Module,
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None,
    *,
    dtype: str | None = None,
    max_shard_size: str | None = None,
) -> Path:
    """`save_pretrained` (safetensors) + the tokenizer, so the folder loads like any user checkpoint
    (`tokenizer_dir=None`: models over non-text tokens, e.g. `specdec.zoo.images`, have no tokenizer).

    dtype: store the weights in this dtype ("float16"/"bfloat16") to save space; config.json still says
    float32, so `from_pretrained(folder)` computes in fp32 (what CPU decoding wants).
    """
    from specdec.zoo.tokenizer import load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    to_save = copy.deepcopy(model).to("cpu").float()
    if dtype is not None:
        to_save = to_save.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    to_save.save_pretrained(str(out), safe_serialization=True, **kwargs)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = "float32"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        load_tokenizer(tokenizer_dir).save_pretrained(str(out))
    return out
