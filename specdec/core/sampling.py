"""Sampling laws as pure tensor functions: how logits become the distribution a token is drawn from (§2.2).

`SamplingConfig` (temperature → the `FILTERS` in order, 0 = one-hot argmax), `standardize_logits` (one config),
`standardize_rows` (per-row parameters, graph-safe), `sample` (exponential race), `invalid_scores`.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["SamplingConfig", "Filter", "FILTERS", "TEMPERATURE_FLOOR", "INVALID_SCORES", "invalid_scores",
           "standardize_logits", "standardize_rows", "sample"]


#: Temperatures below this are greedy decoding (the exact argmax path), as in vLLM (`_SAMPLING_EPS`): the
#: law at such a temperature differs from the argmax only where the top logits lie within ~1e-5 of each other.
TEMPERATURE_FLOOR = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution we sample from (paper §2.2).

    Order: temperature → top-k → top-p → min-p, as in Hugging Face transformers. `temperature == 0` (or any
    temperature below `TEMPERATURE_FLOOR` = 1e-5) means argmax (a one-hot distribution); `top_k == 0`,
    `top_p == 1.0` and `min_p == 0.0` disable those filters.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or t != t or t < 0 or t == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        object.__setattr__(self, "temperature", float(t))
        for f in FILTERS:
            object.__setattr__(self, f.name, f.check(getattr(self, f.name)))

    @property
    def greedy(self) -> bool:
        return self.temperature < TEMPERATURE_FLOOR

    @property
    def filters(self) -> tuple[str, ...]:
        """The names of the filters this config turns on, in order (none when greedy)."""
        return () if self.greedy else tuple(f.name for f in FILTERS if getattr(self, f.name) != f.off)


def _check_top_k(value) -> int:
    try:
        top_k = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        top_k = None
    if top_k is None or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {value!r}")
    return top_k


def _check_top_p(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < value <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {value!r}")
    return float(value)


def _top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits `[..., V]`; ties with the k-th survive, as in transformers."""
    if top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -float("inf"))


def _top_k_rows(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """`_top_k` with top_k [B] long per row of logits `[B, k, V]` (0 = off)."""
    vocab = logits.shape[-1]
    k = top_k.clamp(0, vocab)
    kth_index = (torch.where(k > 0, k, torch.full_like(k, vocab)) - 1)[:, None, None].expand(-1, logits.shape[1], 1)
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, kth_index)
    return logits.masked_fill(logits < kth, float("-inf"))


def _row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """cumsum over the last dim by one algorithm whatever the number of rows: CUDA scans a tensor that is a single
    row with another kernel (cub's) than a batch of rows, which rounds differently — so a lone row is scanned next
    to a copy of itself, and a request's top-p boundary does not depend on its batch (the bitwise mode)."""
    if x.is_cuda and x.numel() == x.shape[-1]:
        return x.reshape(1, -1).expand(2, -1).contiguous().cumsum(-1)[:1].view(x.shape)
    return x.cumsum(-1)


def _top_p(logits: torch.Tensor, top_p) -> torch.Tensor:
    """Keep the smallest prefix (by probability) whose mass reaches top_p (a float, or [B, 1, 1] per row),
    computed exactly as transformers' TopPLogitsWarper does: ascending sort, drop while the cumulative mass
    from below is <= 1 − top_p, so the boundary (and ties on it) fall the same way. The most likely token
    always survives."""
    ascending, order = torch.sort(logits, descending=False)
    below = _row_cumsum(ascending.softmax(-1))
    drop_sorted = below <= (1 - top_p)
    drop_sorted[..., -1:] = False
    return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -float("inf"))


def _check_min_p(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 <= value <= 1.0):
        raise ValueError(f"min_p must be in [0, 1] (0 = off), got {value!r}")
    return float(value)


def _min_p(logits: torch.Tensor, min_p) -> torch.Tensor:
    """Drop the tokens less likely than min_p (a float, or [B, 1, 1] per row) times the most likely one's
    probability, as transformers' MinPLogitsWarper does (the most likely token always survives)."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), -float("inf"))


@dataclass(frozen=True)
class Filter:
    """One standardization step after temperature: its parameter `name` (a `SamplingConfig` and
    `SamplingParams` field), the value that turns it off, how a value is checked (the error names it), and
    how it applies to logits `[..., V]` with one value (`apply`) or with one value per row (`apply_rows`:
    logits `[B, k, V]`, values `[B]`, long when `integer` else float32). A new filter is one entry here."""

    name: str
    off: float
    integer: bool
    check: Callable
    apply: Callable[[torch.Tensor, float], torch.Tensor]
    apply_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


#: The filters after temperature, in the order they apply (transformers' order: top-k, top-p, min-p).
FILTERS: tuple[Filter, ...] = (
    Filter("top_k", 0, True, _check_top_k, _top_k, _top_k_rows),
    Filter("top_p", 1.0, False, _check_top_p, _top_p, lambda logits, p: _top_p(logits, (p.float())[:, None, None])),
    Filter("min_p", 0.0, False, _check_min_p, _min_p, lambda logits, p: _min_p(logits, p.float()[:, None, None])),
)


def invalid_scores(logits: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor (on the logits' device, no host sync): True when `logits [..., V]` contain a NaN or
    a +inf (what a float16 overflow produces: no model means it), or a row in which every entry is -inf —
    scores from which no trustworthy distribution can be formed. -inf entries alone are fine (masked tokens).
    All three are "some row's maximum is not finite" (amax propagates NaN): one pass over the scores, not three."""
    if logits.numel() == 0:  # (no row to reduce; the definition read literally)
        return torch.isnan(logits).any() | (logits == float("inf")).any() | (logits == float("-inf")).all(-1).any()
    return ~torch.isfinite(logits.amax(-1)).all()


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
    for f in FILTERS:  # top-k → top-p (→ …), each as transformers' warper computes it (same boundary on ties)
        value = getattr(sampling, f.name)
        if value != f.off:
            logits = f.apply(logits, value)
    return logits.softmax(-1)


def standardize_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    filters: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """`standardize_logits` with each row's own parameters: logits `[B, k, V]` → probabilities `[B, k, V]`.

    temperature [B] (below `TEMPERATURE_FLOOR` = greedy: one-hot argmax); `filters`: a `FILTERS` name → its
    value per row [B] (long for integer filters; a row at the filter's `off` value is untouched). Filters left
    out are skipped (the caller knows no row uses them). Same order and rules as `standardize_logits`. No host
    synchronization, so it can run inside a CUDA graph.
    """
    unknown = set(filters) - {f.name for f in FILTERS}
    if unknown:
        raise ValueError(f"standardize_rows: unknown filters {sorted(unknown)}; known: {[f.name for f in FILTERS]}")
    logits = logits.float()
    greedy = temperature < TEMPERATURE_FLOOR
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).float()[:, None, None]
    for f in FILTERS:
        if f.name in filters:
            scaled = f.apply_rows(scaled, filters[f.name])
    probs = scaled.softmax(-1)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(probs.dtype)
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


