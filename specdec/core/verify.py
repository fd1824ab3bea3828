"""Verification as pure tensor functions: Algorithm 1 for a batch of drafts (`verify`), the exact greedy path
(`verify_greedy`), β = Σ min(p, q) (`acceptance_beta`) and lenience's check (`check_leniency`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.core.sampling import INVALID_SCORES, _check_logits, invalid_scores, sample

__all__ = ["VerifyResult", "verify", "verify_greedy", "acceptance_beta", "check_leniency"]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one step for a batch.

    num_accepted  [B]      drafts accepted before the first rejection (0..γ)
    next_token    [B]      the residual sample at the first rejection, or the bonus token
    beta          [B, γ]   Σ min(p, q) at every drafted position (for α; see `SpecStats`)
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    beta: torch.Tensor

    def tokens(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """`[B, γ+1]`: accepted drafts then `next_token`; entries after position `num_accepted` are junk."""
        out = torch.cat([draft_tokens, draft_tokens.new_zeros(draft_tokens.shape[0], 1)], dim=1)
        return out.scatter(1, self.num_accepted[:, None], self.next_token[:, None])


def _draft_mask(draft_tokens: torch.Tensor, draft_lengths: torch.Tensor | None) -> torch.Tensor:
    batch, gamma = draft_tokens.shape
    if draft_lengths is None:
        return torch.ones(batch, gamma, dtype=torch.bool, device=draft_tokens.device)
    return torch.arange(gamma, device=draft_tokens.device)[None, :] < draft_lengths[:, None]


def _check_drafts(draft_tokens, draft_lengths, device: torch.device | None = None) -> tuple[int, int]:
    """Shapes and dtypes only (no host sync, so it may run inside a CUDA graph) → (B, γ)."""
    if not isinstance(draft_tokens, torch.Tensor):
        raise TypeError(f"draft_tokens must be a torch.Tensor [B, γ], got {type(draft_tokens).__name__}")
    if draft_tokens.dim() != 2 or draft_tokens.dtype.is_floating_point or draft_tokens.is_complex() \
            or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor [B, γ], got {draft_tokens.dtype} "
                         f"{tuple(draft_tokens.shape)}")
    batch, _ = draft_tokens.shape
    if draft_lengths is not None:
        if not isinstance(draft_lengths, torch.Tensor) or draft_lengths.shape != (batch,) \
                or draft_lengths.dtype.is_floating_point or draft_lengths.is_complex():
            shape = tuple(draft_lengths.shape) if isinstance(draft_lengths, torch.Tensor) else type(draft_lengths).__name__
            raise ValueError(f"draft_lengths must be None or an integer tensor [B] = [{batch}], got {shape}")
    for name, tensor in (("draft_tokens", draft_tokens), ("draft_lengths", draft_lengths)):
        if device is not None and tensor is not None and tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but the scores are on {device}")
    return draft_tokens.shape


def _safe_drafts(draft_tokens: torch.Tensor, drafted: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft slots that are real tokens `[B, γ]` (drafted and in [0, V)), and the tokens with every other slot
    (padding such as vLLM's -1 past a row's draft length) replaced by 0, safe to index with."""
    real = drafted & (draft_tokens >= 0) & (draft_tokens < vocab)
    return real, torch.where(real, draft_tokens, torch.zeros_like(draft_tokens)).long()


def acceptance_beta(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    *,
    leniency: float = 1.0,
) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) per drafted position → `[B, γ]` (Thm 3.5: 1 − TV distance).

    target_probs [B, γ(+1), V]; draft_probs [B, γ, V] or None for a deterministic drafter (one-hot q,
    where β is simply p(x_i); 0 for a slot that is not a token of the vocabulary, e.g. -1 padding).
    With leniency l < 1 (appendix A.5): β = Σ_x min(p(x)/l, q(x)).
    """
    gamma = draft_tokens.shape[1]
    p = target_probs[:, :gamma]
    per_row = isinstance(leniency, torch.Tensor)
    if per_row:
        p = p / leniency[:, None, None].to(p.dtype)  # (÷ 1.0 leaves an exact row's p bit for bit)
    elif leniency != 1.0:
        p = p / leniency
    if draft_probs is None:
        real, safe = _safe_drafts(draft_tokens, torch.ones_like(draft_tokens, dtype=torch.bool), p.shape[-1])
        beta = p.gather(-1, safe[..., None]).squeeze(-1) * real
        if per_row:
            return torch.where((leniency < 1.0)[:, None], beta.clamp(max=1.0), beta)
        return beta if leniency == 1.0 else beta.clamp(max=1.0)
    return torch.minimum(p, draft_probs).sum(-1)


def _check_verify_inputs(draft_tokens, draft_probs, target_probs, draft_lengths, uniforms, noise) -> None:
    if not isinstance(target_probs, torch.Tensor) or not target_probs.dtype.is_floating_point:
        kind = target_probs.dtype if isinstance(target_probs, torch.Tensor) else type(target_probs).__name__
        raise TypeError(f"target_probs must be a floating-point tensor [B, γ+1, V], got {kind}")
    batch, gamma = _check_drafts(draft_tokens, draft_lengths, target_probs.device)
    if target_probs.dim() != 3 or target_probs.shape[:2] != (batch, gamma + 1) or target_probs.shape[2] < 1:
        raise ValueError(
            f"target_probs must be [B, γ+1, V] = [{batch}, {gamma + 1}, V], got {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[2]
    expected = {"draft_probs": (batch, gamma, vocab), "uniforms": (batch, gamma), "noise": (batch, vocab)}
    for name, tensor in (("draft_probs", draft_probs), ("uniforms", uniforms), ("noise", noise)):
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or not tensor.dtype.is_floating_point:
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{name} must be None or a floating-point tensor {list(expected[name])}, got {kind}")
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name} must be {list(expected[name])}, got {tuple(tensor.shape)}")
        if tensor.device != target_probs.device:
            raise ValueError(f"{name} is on {tensor.device} but target_probs is on {target_probs.device}")


def check_leniency(leniency: "float | torch.Tensor", batch: int | None = None) -> "float | torch.Tensor":
    """Validate l ∈ (0, 1] (1 = exact); returns it as a float. A per-row tensor `[B]` (the engine's rows, each
    request its own l, validated when the request was made) is checked for shape and dtype only (no host sync)."""
    if isinstance(leniency, torch.Tensor):
        if not leniency.dtype.is_floating_point or leniency.dim() != 1 or (batch is not None and leniency.shape[0] != batch):
            raise ValueError(f"leniency must be a number in (0, 1] or a floating-point tensor [B] = [{batch}], got "
                             f"{leniency.dtype} {tuple(leniency.shape)}")
        return leniency
    if isinstance(leniency, bool) or not isinstance(leniency, (int, float)) or not (0.0 < leniency <= 1.0):
        raise ValueError(f"leniency must be a number in (0, 1] (1 = exact), got {leniency!r}")
    return float(leniency)


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    draft_lengths: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    leniency: float = 1.0,
) -> VerifyResult:
    """Speculative sampling for a batch of drafts (Algorithm 1, steps 3–5).

    draft_tokens   [B, γ]       long, x_1..x_γ (γ may be 0: plain sampling from p_1)
    draft_probs    [B, γ, V]    q_i the drafts were sampled from; None = deterministic drafter (one-hot q)
    target_probs   [B, γ+1, V]  p_1..p_{γ+1} from one target pass
    draft_lengths  [B]          optional: row b drafted only its first draft_lengths[b] tokens; the
                                position after them is treated as "no draft" (sample from p there), and
                                slots past them are never read (any value, e.g. -1 padding, is fine)
    uniforms       [B, γ]       optional explicit r_i ~ U(0,1) for the accept test
    noise          [B, V]       optional explicit Exp(1) noise for the next-token draw (see `sample`)

    leniency       l ∈ (0, 1]: 1 = exact (the default); l < 1 is lenient and LOSSY (appendix A.5); or a tensor
                   [B] of per-row values (rows with l = 1 verify exactly, bit for bit as with the float 1.0)

    Row b accepts x_i while r_i·l·q_i(x_i) < p_i(x_i) — i.e. r_i < p/(l·q), so p(x) = 0 is never accepted —
    then samples its next token from norm(max(0, p − q)) at the first rejection, or from p_{γ+1}.
    With l < 1 a position emits x with probability min(q(x), p(x)/l) + (1 − β_l)·norm(max(0, p − q))(x),
    β_l = Σ min(p/l, q): never more than p(x)/l (where p > q never more than p(x) itself).
    A drafted id outside [0, V) has p = 0: it is rejected like any token the target cannot produce (the runners
    refuse such a proposal, and a q that is not a distribution, before: `core.proposals`).
    Shapes are checked (no host sync); values are not.
    """
    _check_verify_inputs(draft_tokens, draft_probs, target_probs, draft_lengths, uniforms, noise)
    batch, gamma = draft_tokens.shape
    leniency = check_leniency(leniency, batch)
    per_row = isinstance(leniency, torch.Tensor)
    vocab = target_probs.shape[-1]
    drafted = _draft_mask(draft_tokens, draft_lengths)
    real, safe_tokens = _safe_drafts(draft_tokens, drafted, vocab)
    p_drafted = target_probs[:, :gamma].gather(-1, safe_tokens[..., None]).squeeze(-1)  # [B, γ]
    if draft_probs is None:
        q_drafted = real.to(p_drafted.dtype)
    else:
        q_drafted = draft_probs.gather(-1, safe_tokens[..., None]).squeeze(-1)
    if uniforms is None:
        uniforms = torch.rand(batch, gamma, generator=generator, device=draft_tokens.device)
    if per_row:
        q_scaled = q_drafted * leniency[:, None].to(q_drafted.dtype)  # (× 1.0 leaves an exact row's q bit for bit)
    else:
        q_scaled = q_drafted if leniency == 1.0 else q_drafted * leniency
    accepted = (uniforms * q_scaled < p_drafted) & real & (q_drafted > 0)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [B]

    # Distribution of the next token: residual at the first rejection, p itself after the last draft
    # (or where the row did not draft): pad q with zeros at position γ and where nothing was drafted.
    index = num_accepted[:, None, None].expand(-1, 1, vocab)
    p_next = target_probs.gather(1, index).squeeze(1)  # [B, V]
    if gamma == 0:
        q_next = torch.zeros_like(p_next)
    elif draft_probs is None:
        # one-hot q at the rejected draft; zero where the row proposed nothing (position ≥ its length or γ)
        at = num_accepted.clamp(max=gamma - 1)[:, None]
        has_draft = real.gather(1, at).squeeze(1) & (num_accepted < gamma)
        q_next = torch.zeros_like(p_next).scatter_(1, safe_tokens.gather(1, at), has_draft[:, None].to(p_next.dtype))
    else:
        # where, not a product: a drafter may leave anything (even NaN) in the q of slots it did not draft
        q_drafted_only = torch.where(drafted[..., None], draft_probs, torch.zeros_like(draft_probs))
        q_pad = torch.cat([q_drafted_only, draft_probs.new_zeros(batch, 1, vocab)], 1)
        q_next = q_pad.gather(1, index).squeeze(1).to(p_next.dtype)
    residual = (p_next - q_next).clamp_min(0)
    # If max(0, p − q) vanishes then p = q there and the position cannot have rejected; fall back to p
    # so that float round-off can never produce an all-zero distribution. Left unnormalized: the race draws x with
    # probability r(x)/Σr all the same, and no sum over V (whose rounding follows the batch on CUDA) enters the draw.
    next_dist = torch.where(residual.amax(-1, keepdim=True) > 0, residual, p_next)
    next_token = sample(next_dist, generator, noise=noise)

    if draft_probs is None:
        beta = torch.where(real, p_drafted, torch.zeros_like(p_drafted))
        if per_row:
            beta = torch.where((leniency < 1.0)[:, None], (beta / leniency[:, None]).clamp(max=1.0), beta)
        elif leniency != 1.0:
            beta = (beta / leniency).clamp(max=1.0)
    else:
        beta = acceptance_beta(target_probs, draft_probs, draft_tokens, leniency=leniency)
        beta = torch.where(drafted, beta, torch.zeros_like(beta))
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=beta)


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_lengths: torch.Tensor | None = None,
    check_nan: bool = True,
    leniency: float = 1.0,
    target_tokens: torch.Tensor | None = None,
) -> VerifyResult:
    """The exact argmax path: accept drafts while they equal the target's argmax.

    draft_tokens [B, γ]; target_logits [B, γ+1, V]. The output is token for token the target's own
    greedy decoding. β is 1 where the draft equals the target argmax, else 0 (one-hot p and q). Slots past
    `draft_lengths` are never read. Raises ValueError when `invalid_scores(target_logits)` (a host sync;
    `check_nan=False` skips it for callers that check `invalid_scores` themselves).
    leniency l < 1 (LOSSY, appendix A.5, applied before standardizing): also accept x when
    p(x) ≥ l·max p under softmax(logits), i.e. logit(x) ≥ max logit + log l; a rejection still emits the argmax.
    A tensor `[B]` gives each row its own l (as `verify`).
    target_tokens [B, γ+1] (optional): `target_logits.argmax(-1)`, when the caller has it already (the engine
    computes it with its NaN check in one kernel, `fast.kernels.argmax`); it must BE that argmax.
    """
    _check_logits(target_logits, "target_logits")
    batch, gamma = _check_drafts(draft_tokens, draft_lengths, target_logits.device)
    leniency = check_leniency(leniency, batch)
    if target_logits.dim() != 3 or target_logits.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"target_logits must be [B, γ+1, V] = [{batch}, {gamma + 1}, V], got {tuple(target_logits.shape)}"
        )
    if check_nan and bool(invalid_scores(target_logits)):
        raise ValueError(f"target logits {INVALID_SCORES}")
    if target_tokens is None:
        target_tokens = target_logits.argmax(-1)  # [B, γ+1]
    elif target_tokens.shape != target_logits.shape[:2]:
        raise ValueError(f"target_tokens must be [B, γ+1] = {list(target_logits.shape[:2])}, got "
                         f"{list(target_tokens.shape)}")
    match = target_tokens[:, :gamma] == draft_tokens
    if isinstance(leniency, torch.Tensor):  # per row; a row with l = 1 keeps the exact comparison (no ties)
        logits = target_logits[:, :gamma].float()
        draft_logit = logits.gather(-1, draft_tokens.clamp(0, logits.shape[-1] - 1)[..., None]).squeeze(-1)
        bound = logits.max(-1).values + leniency.float().log()[:, None]
        match |= (draft_logit >= bound) & (leniency < 1.0)[:, None]
    elif leniency != 1.0:
        logits = target_logits[:, :gamma].float()
        draft_logit = logits.gather(-1, draft_tokens[..., None]).squeeze(-1)
        match |= draft_logit >= logits.max(-1).values + math.log(leniency)
    match &= _draft_mask(draft_tokens, draft_lengths)
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=match.float())


def verify_coupled(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, *,
                   draft_lengths: torch.Tensor | None = None) -> VerifyResult:
    """Verification by a shared race (the bitwise mode's sampled rows): accept drafts while they equal the token
    the target itself draws at that position, then emit the target's token.

    draft_tokens [B, γ]; target_tokens [B, γ+1]: position i's draw from p_i by the exponential race with the noise
    that plain decoding uses at that absolute position. The output is then token for token what plain decoding
    draws — the same law, and the same bits for any γ, drafter or batch when p is. (Acceptance is
    P(draft = target draw): highest when the drafter races q with the same noise, as the engine's does.)
    β is 1 where the draft equals the target's draw, else 0.
    """
    batch, gamma = _check_drafts(draft_tokens, draft_lengths, target_tokens.device)
    if tuple(target_tokens.shape) != (batch, gamma + 1):
        raise ValueError(f"target_tokens must be [B, γ+1] = [{batch}, {gamma + 1}], got {tuple(target_tokens.shape)}")
    match = (target_tokens[:, :gamma] == draft_tokens) & _draft_mask(draft_tokens, draft_lengths)
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=match.float())
