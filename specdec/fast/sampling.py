"""Sync-free twins of `core.standardize_logits` / `core.sample`, usable inside a CUDA graph.

The math is the core's, line for line (temperature → top-k → top-p → softmax; exponential race), minus the
NaN check (a host sync) and with the exponential noise drawn outside the graph, from the caller's
generator, so the captured step needs no random state of its own. tests/fast checks both against the core.
"""

from __future__ import annotations

import torch

from specdec.core import SamplingConfig


def standardize_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """`core.standardize_logits` without the NaN check: logits `[..., V]` → float32 probabilities."""
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample_with_noise(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """`core.sample` with its Exp(1) noise given: argmax_x p(x)/E_x ~ p."""
    return (probs.float() / noise).argmax(-1)
