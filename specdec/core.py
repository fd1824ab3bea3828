"""The algorithm as pure tensor functions: no models, no caches, no global state.

Terms (Leviathan, Kalman & Matias 2023; letters as in the paper):
  p         target distribution (`target_probs`), the law the output must follow exactly
  q         drafter distribution (`draft_probs`), the law the draft tokens were sampled from
  γ         `num_draft_tokens`, drafts verified per step
  β         Σ_x min(p(x), q(x)) at one prefix: the probability that a draft from q is accepted
  residual  norm(max(0, p − q)): where a rejected position samples its replacement
  bonus     the token sampled from p after all γ drafts were accepted

Randomness always comes in as an explicit `torch.Generator` (or explicit uniforms in tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingConfig",
    "VerifyResult",
    "standardize_logits",
    "standardize_rows",
    "sample",
    "verify",
    "verify_greedy",
    "acceptance_beta",
    "check_leniency",
]


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution we sample from (paper §2.2).

    Order: temperature → top-k → top-p, as in Hugging Face transformers. `temperature == 0`
    means argmax (a one-hot distribution); `top_k == 0` and `top_p == 1.0` disable those filters.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or t != t or t < 0 or t == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def standardize_logits(logits: torch.Tensor, sampling: SamplingConfig, *, check_nan: bool = True) -> torch.Tensor:
    """Turn logits `[..., V]` into the probabilities `[..., V]` (float32) we actually sample from.

    The same call must be used for p and q so that both are adjusted identically (§2.2).
    Raises ValueError on NaN logits: a silent NaN would corrupt the acceptance test. The check is a
    host sync; code inside a CUDA graph passes `check_nan=False` and checks once per step itself.
    """
    logits = logits.float()
    if check_nan and torch.isnan(logits).any():
        raise ValueError("logits contain NaN; the model produced invalid scores")
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th survive, as in HF
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p; the most likely token always survives.
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def standardize_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    filter_top_k: bool = True,
    filter_top_p: bool = True,
) -> torch.Tensor:
    """`standardize_logits` with each row's own parameters: logits `[B, k, V]` → probabilities `[B, k, V]`.

    temperature [B] (0 = greedy: one-hot argmax), top_k [B] long (0 = off), top_p [B] (1.0 = off).
    filter_top_k / filter_top_p = False skip a filter no row uses (the caller knows its rows' parameters).
    Same order and rules as `standardize_logits`; top-p as transformers' TopPLogitsWarper (ascending
    cumulative mass; a token goes when the mass below it, itself included, is <= 1 − top_p; the most likely
    token always stays). No host synchronization, so it can run inside a CUDA graph.
    """
    logits = logits.float()
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).float()[:, None, None]
    vocab = logits.shape[-1]
    if filter_top_k:
        k = top_k.clamp(0, vocab)
        kth_index = (torch.where(k > 0, k, torch.full_like(k, vocab)) - 1)[:, None, None].expand(-1, logits.shape[1], 1)
        kth = scaled.sort(dim=-1, descending=True).values.gather(-1, kth_index)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if filter_top_p:
        ascending, order = scaled.sort(dim=-1)
        below = ascending.softmax(-1).cumsum(-1)
        drop_sorted = below <= (1 - top_p.float())[:, None, None]
        drop_sorted[..., -1] = False
        scaled = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    probs = scaled.softmax(-1)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), vocab).to(probs.dtype)
    return torch.where(greedy[:, None, None], one_hot, probs)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, *, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one token per row from `probs [..., V]` → `[...]` (long).

    Exponential race: argmax_x p(x)/E_x with E_x ~ Exp(1) picks x with probability p(x)/Σp exactly,
    needs no cumulative sum, never picks a zero-probability token, and never syncs with the host.
    `noise` (Exp(1), shaped like probs) may be drawn by the caller, e.g. outside a captured graph.
    """
    if noise is None:
        noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / noise).argmax(-1)


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


def acceptance_beta(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    *,
    leniency: float = 1.0,
) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) per drafted position → `[B, γ]` (Thm 3.5: 1 − TV distance).

    target_probs [B, γ(+1), V]; draft_probs [B, γ, V] or None for a deterministic drafter (one-hot q,
    where β is simply p(x_i)). With leniency l < 1 (appendix A.5): β = Σ_x min(p(x)/l, q(x)).
    """
    gamma = draft_tokens.shape[1]
    p = target_probs[:, :gamma]
    if leniency != 1.0:
        p = p / leniency
        if draft_probs is None:
            return p.gather(-1, draft_tokens[..., None]).squeeze(-1).clamp(max=1.0)
    if draft_probs is None:
        return p.gather(-1, draft_tokens[..., None]).squeeze(-1)
    return torch.minimum(p, draft_probs).sum(-1)


def check_leniency(leniency: float) -> float:
    """Validate l ∈ (0, 1] (1 = exact); returns it as a float."""
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
                                position after them is treated as "no draft" (sample from p there)
    uniforms       [B, γ]       optional explicit r_i ~ U(0,1) for the accept test
    noise          [B, V]       optional explicit Exp(1) noise for the next-token draw (see `sample`)

    leniency       l ∈ (0, 1]: 1 = exact (the default); l < 1 is lenient and LOSSY (appendix A.5)

    Row b accepts x_i while r_i·l·q_i(x_i) < p_i(x_i) — i.e. r_i < p/(l·q), so p(x) = 0 is never accepted —
    then samples its next token from norm(max(0, p − q)) at the first rejection, or from p_{γ+1}.
    With l < 1 a position emits x with probability min(q(x), p(x)/l) + (1 − β_l)·norm(max(0, p − q))(x),
    β_l = Σ min(p/l, q): never more than p(x)/l (where p > q never more than p(x) itself).
    """
    leniency = check_leniency(leniency)
    batch, gamma = draft_tokens.shape
    if target_probs.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"target_probs must be [B, γ+1, V] = [{batch}, {gamma + 1}, V], got {tuple(target_probs.shape)}"
        )
    drafted = _draft_mask(draft_tokens, draft_lengths)
    p_drafted = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, γ]
    if draft_probs is None:
        q_drafted = drafted.to(p_drafted.dtype)
    else:
        q_drafted = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    if uniforms is None:
        uniforms = torch.rand(batch, gamma, generator=generator, device=draft_tokens.device)
    q_scaled = q_drafted if leniency == 1.0 else q_drafted * leniency
    accepted = (uniforms * q_scaled < p_drafted) & drafted & (q_drafted > 0)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [B]

    # Distribution of the next token: residual at the first rejection, p itself after the last draft
    # (or where the row did not draft): pad q with zeros at position γ and where nothing was drafted.
    index = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next = target_probs.gather(1, index).squeeze(1)  # [B, V]
    if gamma == 0:
        q_next = torch.zeros_like(p_next)
    elif draft_probs is None:
        # one-hot q at the rejected draft; zero where the row proposed nothing (position ≥ its length or γ)
        at = num_accepted.clamp(max=gamma - 1)[:, None]
        has_draft = drafted.gather(1, at).squeeze(1) & (num_accepted < gamma)
        q_next = torch.zeros_like(p_next).scatter_(1, draft_tokens.gather(1, at), has_draft[:, None].to(p_next.dtype))
    else:
        q_pad = torch.cat([draft_probs * drafted[..., None], draft_probs.new_zeros(batch, 1, draft_probs.shape[-1])], 1)
        q_next = q_pad.gather(1, index).squeeze(1)
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    # If max(0, p − q) vanishes then p = q there and the position cannot have rejected; fall back to p
    # so that float round-off can never produce an all-zero distribution.
    next_dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
    next_token = sample(next_dist, generator, noise=noise)

    beta = acceptance_beta(target_probs, draft_probs, draft_tokens, leniency=leniency)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=beta)


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_lengths: torch.Tensor | None = None,
    check_nan: bool = True,
    leniency: float = 1.0,
) -> VerifyResult:
    """The exact argmax path: accept drafts while they equal the target's argmax.

    draft_tokens [B, γ]; target_logits [B, γ+1, V]. The output is token for token the target's own
    greedy decoding. β is 1 where the draft equals the target argmax, else 0 (one-hot p and q).
    leniency l < 1 (LOSSY, appendix A.5, applied before standardizing): also accept x when
    p(x) ≥ l·max p under softmax(logits), i.e. logit(x) ≥ max logit + log l; a rejection still emits the argmax.
    """
    leniency = check_leniency(leniency)
    batch, gamma = draft_tokens.shape
    if check_nan and torch.isnan(target_logits).any():
        raise ValueError("target logits contain NaN; the model produced invalid scores")
    target_tokens = target_logits.argmax(-1)  # [B, γ+1]
    match = target_tokens[:, :gamma] == draft_tokens
    if leniency != 1.0:
        logits = target_logits[:, :gamma].float()
        draft_logit = logits.gather(-1, draft_tokens[..., None]).squeeze(-1)
        match |= draft_logit >= logits.max(-1).values + math.log(leniency)
    match &= _draft_mask(draft_tokens, draft_lengths)
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token, beta=match.float())
