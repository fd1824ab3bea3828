"""Draft distillation: fine-tune the drafter q on the target's soft distribution p, and measure α.

Loss: KL(p‖q) = Σ_x p(x) (log p(x) − log q(x)), averaged over positions of corpus text (teacher forcing),
with p and q at a softening temperature (1 by default). Optionally part of every batch is text the target
generated greedily ("generated pool"), the text a greedy speculative decoder verifies; on such text plain
cross-entropy (`loss="ce"`) is hard-label distillation of the target's greedy choices. This is the quantity §3 of the paper cares about:
α = E[Σ_x min(p(x), q(x))] = 1 − E[D_TV(p, q)], and Pinsker bounds D_TV by √(KL/2).

α here is measured the same way on held-out text: mean over positions of Σ_x min(p(x), q(x)) with p, q
the standardized distributions (temperature 0: one-hot argmax, so β = [argmax p = argmax q];
temperature t > 0: softmax(logits / t)).
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from specdec.zoo.data import PairData, TokenData
from specdec.zoo.presets import DistillConfig
from specdec.zoo.models import resolve_device
from specdec.zoo.train import TrainResult, run_training
from specdec.zoo.train_steps import autocast, forward_logits, to_device

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
    first_position: int = 0,
) -> dict[float, float]:
    """α (mean β over all non-ignored positions of teacher-forced held-out batches) per temperature.

    first_position: skip the distributions before it (e.g. a prompt, to measure α on generated text only).
    """
    device = resolve_device(device)
    modes = (target.training, draft.training)
    target.eval()
    draft.eval()
    sums = {t: 0.0 for t in temperatures}
    count = 0
    for batch in batches:
        batch = to_device(batch, device)
        with autocast(device, bf16):
            p_logits, targets = forward_logits(target, batch)
            q_logits, _ = forward_logits(draft, batch)
        mask = targets != -100
        mask[:, :first_position] = False
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


@torch.no_grad()
def generate_greedy(
    target: torch.nn.Module,
    prompts: torch.Tensor,
    new_tokens: int,
    *,
    batch_size: int = 256,
    max_seconds: float | None = None,
    device: str | torch.device | None = None,
    bf16: bool = True,
) -> torch.Tensor:
    """Greedy continuations `[N', P + new_tokens]` of `prompts` `[N, P]` (a plain KV-cache loop, no EOS stop:
    the corpus joins files with </s>, so text after it is just the next file). Stops early, after the batch
    that crosses `max_seconds`; N' ≤ N rows come back (on CPU)."""
    device = resolve_device(device)
    was_training = target.training
    target.to(device).eval()
    t0 = time.perf_counter()
    rows = []
    for lo in range(0, len(prompts), batch_size):
        ids = prompts[lo : lo + batch_size].to(device)
        with autocast(device, bf16):
            out = target(input_ids=ids, use_cache=True)
            cache = _cache_of(out)
            pieces = [ids, out.logits[:, -1].argmax(-1, keepdim=True)]
            for _ in range(new_tokens - 1):
                out = target(input_ids=pieces[-1], **{_cache_kwarg(target): cache}, use_cache=True)
                cache = _cache_of(out)
                pieces.append(out.logits[:, -1].argmax(-1, keepdim=True))
        rows.append(torch.cat(pieces, 1).cpu())
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
    target.train(was_training)
    return torch.cat(rows)


def _cache_kwarg(model: torch.nn.Module) -> str:
    # transformers renamed `past_key_values` to `cache` during the 5.x series; accept both
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out) -> object:
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def prompts_from_stream(stream, count: int, prompt_len: int, seed: int = 0, document_starts: float = 0.0,
                        eos_id: int = 2) -> torch.Tensor:
    """`count` windows of `prompt_len` tokens from a token stream (numpy uint16), `[count, P]`: a fraction
    `document_starts` begin a file (right after </s>), the rest start anywhere."""
    import numpy as np

    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - prompt_len, size=count)
    n_doc = int(round(document_starts * count))
    if n_doc:
        boundaries = np.flatnonzero(stream[: len(stream) - prompt_len - 1] == eos_id) + 1
        if len(boundaries):
            starts[:n_doc] = rng.choice(boundaries, size=n_doc)
    return torch.from_numpy(stream[starts[:, None] + np.arange(prompt_len)[None, :]].astype(np.int64))


class MixedData:
    """Training batches with a fraction of rows from a pool of generated sequences, the rest corpus windows.
    Validation batches are the corpus's."""

    def __init__(self, data: TokenData, pool: torch.Tensor, fraction: float):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"generated_fraction must be in [0, 1], got {fraction}")
        self.data, self.pool, self.fraction = data, pool, fraction
        self.meta, self.tokenizer_dir = data.meta, data.tokenizer_dir

    def train_batch(self, batch_size: int, seq_len: int, rng) -> torch.Tensor:
        length = min(seq_len + 1, self.pool.shape[1])
        n_pool = int(round(self.fraction * batch_size))
        corpus = self.data.train_batch(batch_size - n_pool, length - 1, rng)
        rows = rng.integers(0, len(self.pool), size=n_pool)
        offsets = rng.integers(0, self.pool.shape[1] - length + 1, size=n_pool)
        pool = torch.stack([self.pool[r, o : o + length] for r, o in zip(rows, offsets)]) if n_pool else corpus[:0]
        return torch.cat([pool, corpus])

    def val_batches(self, batch_size: int, seq_len: int, max_batches: int) -> list:
        return self.data.val_batches(batch_size, seq_len, max_batches)


def init_from_target(draft: torch.nn.Module, target: torch.nn.Module) -> list[str]:
    """Copy the target's token embeddings (tied output head), final norm and first `len(draft layers)`
    layers into a Llama drafter of the same width; returns the names copied (empty when shapes differ)."""
    d_cfg, t_cfg = draft.config, target.config
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    if any(getattr(d_cfg, k, None) != getattr(t_cfg, k, None) for k in keys) or d_cfg.model_type != "llama":
        return []
    copied = []
    with torch.no_grad():
        for name, module in (("embed_tokens", "embed_tokens"), ("norm", "norm")):
            getattr(draft.model, module).load_state_dict(getattr(target.model, module).state_dict())
            copied.append(name)
        for i, layer in enumerate(draft.model.layers):
            layer.load_state_dict(target.model.layers[i].state_dict())
            copied.append(f"layers.{i}")
    if not getattr(d_cfg, "tie_word_embeddings", False):
        draft.lm_head.load_state_dict(target.lm_head.state_dict())
        copied.append("lm_head")
    return copied


@dataclass
class DistillResult:
    alpha_before: dict[float, float]
    alpha_after: dict[float, float]
    train: TrainResult
    alpha_generated_before: dict[float, float] | None = None  # on greedy target text from held-out prompts
    alpha_generated_after: dict[float, float] | None = None

    def to_dict(self) -> dict:
        def keyed(d):
            return None if d is None else {str(k): v for k, v in d.items()}

        return {"alpha_before": keyed(self.alpha_before), "alpha_after": keyed(self.alpha_after),
                "alpha_generated_before": keyed(self.alpha_generated_before),
                "alpha_generated_after": keyed(self.alpha_generated_after), "train": asdict(self.train)}


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
    pool: torch.Tensor | None = None,
    val_pool: torch.Tensor | None = None,
    prompt_len: int = 0,
) -> DistillResult:
    """Fine-tune `draft` in place on KL(p‖q) against the frozen `target` over corpus text (and, with
    `cfg.generated_fraction` > 0, over `pool`, the target's own greedy text); α at temperatures 0 and 1
    on held-out corpus text (and on `val_pool`, greedy text from held-out prompts) before and after."""
    device = resolve_device(device)
    tc = cfg.train
    target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    held_out = data.val_batches(tc.batch_size, tc.seq_len, cfg.alpha_batches)
    before = alpha_on_batches(target, draft.to(device), held_out, device=device, bf16=tc.bf16)
    logger.info("%s: alpha before %s", desc, before)
    gen_batches = [] if val_pool is None else [val_pool[i : i + tc.batch_size] for i in range(0, len(val_pool), tc.batch_size)]
    gen_before = None
    if gen_batches:
        gen_before = alpha_on_batches(target, draft, gen_batches, device=device, bf16=tc.bf16,
                                      first_position=prompt_len - 1)
        logger.info("%s: alpha on generated text before %s", desc, gen_before)
    if cfg.generated_fraction > 0:
        if pool is None or not isinstance(data, TokenData):
            raise ValueError("generated_fraction > 0 needs a decoder-only corpus and a pool of generated text")
        data = MixedData(data, pool, cfg.generated_fraction)

    if cfg.loss == "ce":
        # hard labels: on the target's greedy text the next token IS argmax p, so plain cross-entropy on
        # the pool distils the target's greedy choices (no teacher pass needed: cheap on a CPU)
        result = run_training(draft, data, replace(tc, z_loss=0.0), log_path=log_path, device=device,
                              progress=progress, desc=desc)
    elif cfg.loss == "kl":
        result = _train_kl(target, draft, data, cfg, log_path, device, progress, desc)
    else:
        raise ValueError(f"distillation loss must be 'kl' or 'ce', got {cfg.loss!r}")
    after = alpha_on_batches(target, draft, held_out, device=device, bf16=tc.bf16)
    logger.info("%s: alpha after %s", desc, after)
    gen_after = None
    if gen_batches:
        gen_after = alpha_on_batches(target, draft, gen_batches, device=device, bf16=tc.bf16,
                                     first_position=prompt_len - 1)
        logger.info("%s: alpha on generated text after %s", desc, gen_after)
    return DistillResult(before, after, result, gen_before, gen_after)


def _train_kl(target, draft, data, cfg: DistillConfig, log_path, device, progress, desc) -> TrainResult:
    tc = cfg.train

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
    return run_training(draft, data, tc, loss_fn=loss_fn, log_path=log_path, device=device, progress=progress,
                        desc=desc, extra_flops_per_token=teacher_fpt)
