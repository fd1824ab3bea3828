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
import numbers
import operator
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingConfig",
    "VerifyResult",
    "TEMPERATURE_FLOOR",
    "invalid_scores",
    "standardize_logits",
    "standardize_rows",
    "sample",
    "verify",
    "verify_greedy",
    "acceptance_beta",
    "check_leniency",
]


#: Temperatures below this are greedy decoding (the exact argmax path), as in vLLM (`_SAMPLING_EPS`): the
#: law at such a temperature differs from the argmax only where the top logits lie within ~1e-5 of each other.
TEMPERATURE_FLOOR = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution we sample from (paper §2.2).

    Order: temperature → top-k → top-p, as in Hugging Face transformers. `temperature == 0` (or any
    temperature below `TEMPERATURE_FLOOR` = 1e-5) means argmax (a one-hot distribution); `top_k == 0` and
    `top_p == 1.0` disable those filters.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or t != t or t < 0 or t == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        object.__setattr__(self, "temperature", float(t))
        try:
            top_k = None if isinstance(self.top_k, bool) else operator.index(self.top_k)
        except TypeError:
            top_k = None
        if top_k is None or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        object.__setattr__(self, "top_k", top_k)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        return self.temperature < TEMPERATURE_FLOOR


def invalid_scores(logits: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor (on the logits' device, no host sync): True when `logits [..., V]` contain a NaN or
    a +inf (what a float16 overflow produces: no model means it), or a row in which every entry is -inf —
    scores from which no trustworthy distribution can be formed. -inf entries alone are fine (masked tokens)."""
    return torch.isnan(logits).any() | (logits == float("inf")).any() | (logits == float("-inf")).all(-1).any()


INVALID_SCORES = ("contain NaN or +inf (a float16 overflow? load the model in float32 or bfloat16), or a row of "
                  "only -inf; the model produced invalid scores")


def _check_logits(logits, name: str) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [..., V], got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have a vocabulary axis [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    if logits.is_complex():
        raise TypeError(f"{name} must be real, got {logits.dtype}")


def standardize_logits(logits: torch.Tensor, sampling: SamplingConfig, *, check_nan: bool = True) -> torch.Tensor:
    """Turn logits `[..., V]` into the probabilities `[..., V]` (float32) we actually sample from.

    The same call must be used for p and q so that both are adjusted identically (§2.2). Temperature, top-k
    and top-p are computed exactly as transformers' warpers compute them (same boundary on ties).
    Non-finite scores: -inf entries get probability 0; a temperature so small that dividing overflows is
    computed from the max-shifted logits (the same law, no ±inf); temperatures below TEMPERATURE_FLOOR are
    greedy. Raises ValueError when `invalid_scores` (NaN, +inf, or a row of only -inf): a silent NaN would
    corrupt the acceptance test and sample token 0. The check is a host sync; code inside a CUDA graph passes
    `check_nan=False` and checks `invalid_scores` once per step itself (a row with +inf entries is then
    computed as the softmax limit, uniform over them, so that nothing downstream sees a NaN).
    """
    _check_logits(logits, "logits")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    logits = logits.float()
    if check_nan and bool(invalid_scores(logits)):
        raise ValueError(f"logits {INVALID_SCORES}")
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    inf = float("inf")
    pos_inf = logits == inf
    logits = torch.where(pos_inf.any(-1, keepdim=True), torch.where(pos_inf, 0.0, -inf), logits)
    if sampling.temperature != 1.0:
        scaled = logits / sampling.temperature
        if sampling.temperature < 1.0:  # only shrinking temperatures can overflow finite logits
            overflow = (scaled.isinf() & logits.isfinite()).any(-1, keepdim=True)
            shifted = (logits - logits.amax(-1, keepdim=True)) / sampling.temperature
            scaled = torch.where(overflow, shifted, scaled)
        logits = scaled
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -inf)  # ties with the k-th survive, as in HF
    if sampling.top_p < 1.0:
        # Keep the smallest prefix (by probability) whose mass reaches top_p, computed exactly as transformers'
        # TopPLogitsWarper does: ascending sort, drop while the cumulative mass from below is <= 1 - top_p, so
        # the boundary (and ties on it) fall the same way. The most likely token always survives.
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative <= (1 - sampling.top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -inf)
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

    temperature [B] (below `TEMPERATURE_FLOOR` = greedy: one-hot argmax), top_k [B] long (0 = off), top_p [B] (1.0 = off).
    filter_top_k / filter_top_p = False skip a filter no row uses (the caller knows its rows' parameters).
    Same order and rules as `standardize_logits`; top-p as transformers' TopPLogitsWarper (ascending
    cumulative mass; a token goes when the mass below it, itself included, is <= 1 − top_p; the most likely
    token always stays). No host synchronization, so it can run inside a CUDA graph.
    """
    logits = logits.float()
    greedy = temperature < TEMPERATURE_FLOOR
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
    if leniency != 1.0:
        p = p / leniency
    if draft_probs is None:
        real, safe = _safe_drafts(draft_tokens, torch.ones_like(draft_tokens, dtype=torch.bool), p.shape[-1])
        beta = p.gather(-1, safe[..., None]).squeeze(-1) * real
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
                                position after them is treated as "no draft" (sample from p there), and
                                slots past them are never read (any value, e.g. -1 padding, is fine)
    uniforms       [B, γ]       optional explicit r_i ~ U(0,1) for the accept test
    noise          [B, V]       optional explicit Exp(1) noise for the next-token draw (see `sample`)

    leniency       l ∈ (0, 1]: 1 = exact (the default); l < 1 is lenient and LOSSY (appendix A.5)

    Row b accepts x_i while r_i·l·q_i(x_i) < p_i(x_i) — i.e. r_i < p/(l·q), so p(x) = 0 is never accepted —
    then samples its next token from norm(max(0, p − q)) at the first rejection, or from p_{γ+1}.
    With l < 1 a position emits x with probability min(q(x), p(x)/l) + (1 − β_l)·norm(max(0, p − q))(x),
    β_l = Σ min(p/l, q): never more than p(x)/l (where p > q never more than p(x) itself).
    A drafted id outside [0, V) has p = 0: it is rejected like any token the target cannot produce.
    Shapes are checked (no host sync); values are not.
    """
    _check_verify_inputs(draft_tokens, draft_probs, target_probs, draft_lengths, uniforms, noise)
    leniency = check_leniency(leniency)
    batch, gamma = draft_tokens.shape
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
    mass = residual.sum(-1, keepdim=True)
    # If max(0, p − q) vanishes then p = q there and the position cannot have rejected; fall back to p
    # so that float round-off can never produce an all-zero distribution.
    next_dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
    next_token = sample(next_dist, generator, noise=noise)

    if draft_probs is None:
        beta = torch.where(real, p_drafted, torch.zeros_like(p_drafted))
        if leniency != 1.0:
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
) -> VerifyResult:
    """The exact argmax path: accept drafts while they equal the target's argmax.

    draft_tokens [B, γ]; target_logits [B, γ+1, V]. The output is token for token the target's own
    greedy decoding. β is 1 where the draft equals the target argmax, else 0 (one-hot p and q). Slots past
    `draft_lengths` are never read. Raises ValueError when `invalid_scores(target_logits)` (a host sync;
    `check_nan=False` skips it for callers that check `invalid_scores` themselves).
    leniency l < 1 (LOSSY, appendix A.5, applied before standardizing): also accept x when
    p(x) ≥ l·max p under softmax(logits), i.e. logit(x) ≥ max logit + log l; a rejection still emits the argmax.
    """
    leniency = check_leniency(leniency)
    _check_logits(target_logits, "target_logits")
    batch, gamma = _check_drafts(draft_tokens, draft_lengths, target_logits.device)
    if target_logits.dim() != 3 or target_logits.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"target_logits must be [B, γ+1, V] = [{batch}, {gamma + 1}, V], got {tuple(target_logits.shape)}"
        )
    if check_nan and bool(invalid_scores(target_logits)):
        raise ValueError(f"target logits {INVALID_SCORES}")
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
