"""What makes `specdec.zoo.train.run_training` fast on a GPU, each piece exact by construction.

- `causal_attention(model)`: decoder-only training batches are unpadded causal windows, so attention is
  `scaled_dot_product_attention(q, k, v, is_causal=True)` with no mask tensor (the flash kernel). HF Llama
  builds a `[B, 1, T, T]` mask under `torch.compile` on torch < 2.14 (transformers' `_ignore_causal_mask_sdpa`),
  which sends SDPA to a slower kernel; our implementation's mask function builds none (and refuses padding).
- `skip_non_finite_step(optimizer, loss, grad_norm)`: the optimizer step applied or skipped ON THE DEVICE
  (the `found_inf` input of fused AdamW, the mechanism `torch.amp.GradScaler` uses): no host sync per step.
- `DeviceWindows`: random training windows cut on the device from the whole token stream held there.
- `compile_model(model)`: `torch.compile` of the module (the eager module stays usable for evaluation).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

CAUSAL_ATTENTION = "specdec_causal_sdpa"
_registered = False


def causal_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """HF attention-interface function: q `[B, H, T, D]`, k/v `[B, H_kv, T, D]` → (`[B, T, H, D]`, None).

    Full causal self-attention only (training and teacher-forced evaluation without a cache): a mask or a
    query shorter than the keys is refused rather than silently mis-aligned."""
    if attention_mask is not None:
        raise ValueError("attention_mask: the causal training attention takes unpadded batches only (got a mask)")
    if query.shape[2] != key.shape[2]:
        raise ValueError(f"query: {query.shape[2]} positions against {key.shape[2]} keys; the causal training "
                         "attention has no cache")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key/value head serves H / H_kv queries
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout if module.training else 0.0,
                                         is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _no_padding_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """HF mask function for `CAUSAL_ATTENTION`: there is no mask to build; a padding mask is refused (without a
    registered mask function transformers would drop it silently)."""
    if attention_mask is not None:
        raise ValueError("attention_mask: the causal training attention takes unpadded batches only (got a mask)")
    return None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(CAUSAL_ATTENTION, causal_sdpa_attention)
        AttentionMaskInterface.register(CAUSAL_ATTENTION, _no_padding_mask)
        _registered = True


class AttentionSwap:
    """What `causal_attention` yields: `bool(swap)` says whether the model attends causally now; `restore()`
    puts its own implementation back early (the training loop's fallback when the first step fails)."""

    def __init__(self, config=None):
        self.config, self.before = config, None if config is None else config._attn_implementation
        if config is not None:
            config._attn_implementation = CAUSAL_ATTENTION

    def __bool__(self) -> bool:
        return self.config is not None

    def restore(self) -> None:
        if self.config is not None:
            self.config._attn_implementation = self.before
            self.config = None


@contextlib.contextmanager
def causal_attention(model: torch.nn.Module, enabled: bool = True) -> Iterator[AttentionSwap]:
    """Inside: a decoder-only HF model attends through `causal_sdpa_attention` (the yielded swap is true when
    it does); the model's own implementation is restored on exit, so saved checkpoints say "sdpa" as before."""
    config = getattr(model, "config", None)
    if not enabled or config is None or getattr(config, "is_encoder_decoder", False) \
            or getattr(config, "model_type", None) != "llama":
        yield AttentionSwap()
        return
    _register()
    swap = AttentionSwap(config)
    try:
        yield swap
    finally:
        swap.restore()


def skip_non_finite_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """Step `optimizer` (fused Adam/AdamW) unless `loss` or `grad_norm` is not finite, decided on the device:
    a skipped step changes no parameter, moment or step count. Returns the skip flag (0-dim float, 1 = skipped)."""
    if not optimizer.defaults.get("fused"):
        raise ValueError("optimizer: skipping on the device needs a fused Adam/AdamW (fused=True)")
    skipped = (~(torch.isfinite(loss) & torch.isfinite(grad_norm))).float().reshape(())
    optimizer.grad_scale, optimizer.found_inf = None, skipped
    try:
        optimizer.step()
    finally:
        optimizer.found_inf = None
    return skipped


class DeviceWindows:
    """Random `[B, T+1]` windows of a token stream held on `device` (int32), drawn with a device generator."""

    def __init__(self, stream: np.ndarray, device: torch.device, seed: int = 0):
        self.stream = torch.from_numpy(stream.astype(np.int32)).to(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, batch_size: int, seq_len: int) -> torch.Tensor:
        high = self.stream.numel() - seq_len - 1
        if high <= 0:
            raise ValueError(f"seq_len: the stream ({self.stream.numel()} tokens) is shorter than {seq_len + 1}")
        device = self.stream.device
        starts = torch.randint(0, high, (batch_size,), device=device, generator=self.generator)
        return self.stream[starts[:, None] + torch.arange(seq_len + 1, device=device)].long()


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile(model)`; the returned wrapper shares the parameters, the eager `model` stays usable."""
    return torch.compile(model)
