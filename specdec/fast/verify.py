"""Sync-free twins of `core.verify` / `core.verify_greedy` for a captured verification step.

Same rule, same arithmetic; the only differences: no NaN check (a host sync), and the randomness comes in
as tensors (`uniforms [B, γ]` for the accept test, `noise [B, V]` ~ Exp(1) for the residual/bonus draw),
drawn by the caller from its generator outside the graph. tests/fast pins both to the core functions.
"""

from __future__ import annotations

import torch

from specdec.core import VerifyResult, acceptance_beta
from specdec.fast.sampling import sample_with_noise


def _draft_mask(draft_tokens: torch.Tensor, draft_lengths: torch.Tensor | None) -> torch.Tensor:
    gamma = draft_tokens.shape[1]
    if draft_lengths is None:
        return torch.ones_like(draft_tokens, dtype=torch.bool)
    return torch.arange(gamma, device=draft_tokens.device)[None, :] < draft_lengths[:, None]


def verify_greedy_nosync(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                         draft_lengths: torch.Tensor | None = None) -> VerifyResult:
    """`core.verify_greedy` without the NaN check. draft_tokens [B, γ]; target_logits [B, γ+1, V]."""
    gamma = draft_tokens.shape[1]
    target_tokens = target_logits.argmax(-1)
    match = (target_tokens[:, :gamma] == draft_tokens) & _draft_mask(draft_tokens, draft_lengths)
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=match.float())


def verify_with_noise(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                      uniforms: torch.Tensor, noise: torch.Tensor,
                      draft_lengths: torch.Tensor | None = None) -> VerifyResult:
    """`core.verify` with explicit randomness: uniforms [B, γ], noise [B, V] (Exp(1)) for the next token."""
    batch, gamma = draft_tokens.shape
    drafted = _draft_mask(draft_tokens, draft_lengths)
    p_drafted = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)
    if draft_probs is None:
        q_drafted = drafted.to(p_drafted.dtype)
    else:
        q_drafted = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    accepted = (uniforms * q_drafted < p_drafted) & drafted & (q_drafted > 0)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)

    index = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next = target_probs.gather(1, index).squeeze(1)
    if gamma == 0:
        q_next = torch.zeros_like(p_next)
    elif draft_probs is None:
        at = num_accepted.clamp(max=gamma - 1)[:, None]
        has_draft = drafted.gather(1, at).squeeze(1) & (num_accepted < gamma)
        q_next = torch.zeros_like(p_next).scatter_(1, draft_tokens.gather(1, at), has_draft[:, None].to(p_next.dtype))
    else:
        q_pad = torch.cat([draft_probs * drafted[..., None], draft_probs.new_zeros(batch, 1, draft_probs.shape[-1])], 1)
        q_next = q_pad.gather(1, index).squeeze(1)
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    next_dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
    next_token = sample_with_noise(next_dist, noise)
    beta = acceptance_beta(target_probs, draft_probs, draft_tokens)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=beta)
