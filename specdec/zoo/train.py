"""Training: one stable loop (`run_training`) for the zoo's models (built and saved by `specdec.zoo.models`).

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

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.analysis import drain
from specdec.zoo.data import PairData, TokenData
from specdec.zoo.models import build_model, count_params, flops_per_token, peak_flops, resolve_device
from specdec.zoo.presets import ModelShape, TrainConfig
from specdec.zoo.train_steps import (TrainLog, autocast, batch_tokens, evaluate, forward_logits, lm_loss, lr_at,
                                     make_optimizer, to_device, training_attention)

__all__ = ["MAX_CONSECUTIVE_SKIPS", "TrainResult", "run_training", "train_model"]

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_SKIPS = 25


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


LossFn = Callable[[torch.nn.Module, object], tuple[torch.Tensor, torch.Tensor]]


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
        return to_device(cpu_batch, device), batch_tokens(cpu_batch)

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
        drain(device)
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
    with causal_attention(model, enabled=fast and cuda) as causal, training_attention(model, device):
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
                drain(device)
                steady.update(t=time.perf_counter(), tokens=tokens, eval=eval_seconds)
            if step == calib_end and cfg.max_seconds is not None:
                replan(step)
            lr = lr_at(step, total_steps, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch, n_tok = next_batch()
            try:
                with autocast(device, cfg.bf16):
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
                with autocast(device, cfg.bf16):
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
                drain(device)
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
    drain(device)
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
