"""Draft-length policies: how many tokens to draft next (γ), chosen before every step.

The decoding loop asks `num_draft_tokens()` before a step (0 = plain decoding for that step) and
reports the step's outcome through `update()`. `confidence_threshold()` lets a model drafter stop
drafting a row early once it is unsure of its own draft.

Policies (all accept `resolve_policy` names):
  FixedPolicy      always γ (the paper's setting)                                        "fixed", int
  HeuristicPolicy  Hugging Face's schedule: +2 after a fully accepted step, −1 otherwise  "heuristic"
  OptimalPolicy    γ* = optimal_gamma(α̂, ĉ) from online estimates (paper §3.5)           "optimal"
  ThresholdPolicy  up to a max γ, a row stops once the drafter's own confidence < h       "threshold"
  GuardedPolicy    wraps another; drafts 0 when the cost model predicts a slowdown       "guarded"

The estimates (`OnlineEstimates`) fold every cost into one effective cost ratio so the paper's
formula S = E(α, γ) / (γc + 1) (Thm 3.8) stays exact for the measured linear cost model:
a step of γ drafts costs T + γ·(d + v), where T is a plain decoding step, d the drafter's time per
drafted token and v the extra target time per extra verified token, hence c = (d + v) / T.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specdec.analysis import optimal_gamma, walltime_improvement
from specdec.request import MAX_NUM_DRAFT_TOKENS, as_int

__all__ = ["StepOutcome", "DraftLengthPolicy", "FixedPolicy", "HeuristicPolicy", "OptimalPolicy", "ThresholdPolicy",
           "GuardedPolicy", "OnlineEstimates", "resolve_policy", "check_policy", "POLICY_NAMES", "POLICY_METHODS"]

logger = logging.getLogger(__name__)

DEFAULT_NUM_DRAFT_TOKENS = 4


@dataclass(frozen=True)
class StepOutcome:
    """What one speculative step reports to the policy.

    num_draft_tokens  γ drafted this step (0 = plain decoding)
    num_accepted   [B] long   drafted tokens accepted per active row
    draft_lengths  [B] long   drafts actually proposed per row (≤ num_draft_tokens)
    draft_time_s      wall time of drafting this step
    verify_time_s     wall time of the target pass this step
    """

    num_draft_tokens: int
    num_accepted: torch.Tensor
    draft_lengths: torch.Tensor
    draft_time_s: float
    verify_time_s: float


class DraftLengthPolicy:
    """Base class: a fixed γ unless a subclass adapts it.

    A policy's state belongs to one generation: `resolve_policy` calls `reset()` when a `generate`/`stream`
    call starts with it, so an instance passed to several calls starts each one afresh (and what it learned
    in the last call stays readable afterwards). Subclasses with state override `reset`.
    """

    def num_draft_tokens(self) -> int:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything learned in a previous generation."""

    def confidence_threshold(self) -> float | None:
        return None

    def update(self, outcome: StepOutcome) -> None:
        pass


def _check_int(value: int, name: str, minimum: int, maximum: int | None = None) -> int:
    try:
        return as_int(value, name, minimum=minimum, maximum=maximum)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None


def _check_gamma(value: int, name: str) -> int:
    return _check_int(value, name, 1, MAX_NUM_DRAFT_TOKENS)


def _check_unit(value: float, name: str, *, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0)
    if not ok:
        raise ValueError(f"{name} must be in {'(0' if low_open else '[0'}, 1], got {value!r}")
    return float(value)


class FixedPolicy(DraftLengthPolicy):
    """Always draft γ tokens (the paper's setting)."""

    def __init__(self, num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS):
        self.gamma = _check_gamma(num_draft_tokens, "num_draft_tokens")

    def num_draft_tokens(self) -> int:
        return self.gamma

    def __repr__(self) -> str:
        return f"FixedPolicy({self.gamma})"


class HeuristicPolicy(DraftLengthPolicy):
    """Hugging Face's schedule (`num_assistant_tokens_schedule="heuristic"`).

    After a step in which every active row accepted all γ drafts, draft 2 more next time;
    otherwise 1 fewer; never below 1 nor above `max_draft_tokens`. Hugging Face runs it at batch
    size 1; with a batch, "fully accepted" means every row was, so one poor row shortens everyone's
    drafts (all rows share one target pass, so the slowest row sets the pace anyway).
    """

    def __init__(self, initial: int = 5, max_draft_tokens: int = 32):
        self.max_draft_tokens = _check_gamma(max_draft_tokens, "max_draft_tokens")
        self.initial = min(_check_gamma(initial, "initial"), self.max_draft_tokens)
        self.gamma = self.initial

    def num_draft_tokens(self) -> int:
        return self.gamma

    def reset(self) -> None:
        self.gamma = self.initial

    def update(self, outcome: StepOutcome) -> None:
        if outcome.num_draft_tokens == 0 or outcome.num_accepted.numel() == 0:
            return  # a plain step (a guard switched drafting off) says nothing about the drafts
        if bool((outcome.num_accepted >= self.gamma).all()):
            self.gamma = min(self.gamma + 2, self.max_draft_tokens)
        else:
            self.gamma = max(self.gamma - 1, 1)

    def __repr__(self) -> str:
        return f"HeuristicPolicy(gamma={self.gamma}, max={self.max_draft_tokens})"


class OnlineEstimates:
    """Running estimates of α and of the effective cost ratio c from step outcomes.

    α̂: for i.i.d. β every drafted position reached is one Bernoulli(α) trial; a row that accepted n
    of its L drafts reached min(n + 1, L) positions and passed n of them, so α̂ = Σ n / Σ reached
    (the maximum-likelihood estimate). Timings give c as described in the module docstring; the
    plain step time T comes from γ = 0 steps when there were any, else from the verify time
    (the paper's assumption that scoring γ + 1 tokens costs as much as one).

    decay  weight kept by the past at every step (exponential forgetting, so the estimates follow
           a text whose predictability changes); 1.0 = plain running totals.
    """

    def __init__(self, decay: float = 0.9):
        self.decay = _check_unit(decay, "decay", low_open=True)
        self.accepted = 0.0  # weighted Σ n
        self.reached = 0.0  # weighted Σ min(n + 1, L)
        self.draft_time = 0.0  # weighted Σ draft seconds (speculative steps)
        self.drafted = 0.0  # weighted Σ γ (speculative steps)
        self.verify_time = 0.0  # weighted Σ verify seconds (speculative steps)
        self.spec_steps = 0.0
        self.plain_time = 0.0  # weighted Σ seconds of γ = 0 steps
        self.plain_steps = 0.0
        self.num_updates = 0  # speculative steps seen (unweighted), for warm-ups

    def update(self, outcome: StepOutcome) -> None:
        lam = self.decay
        if outcome.num_draft_tokens == 0:
            self.plain_time = lam * self.plain_time + outcome.verify_time_s
            self.plain_steps = lam * self.plain_steps + 1.0
            return
        accepted = outcome.num_accepted.long()
        reached = torch.minimum(accepted + 1, outcome.draft_lengths.long())
        self.accepted = lam * self.accepted + float(accepted.sum())
        self.reached = lam * self.reached + float(reached.sum())
        self.draft_time = lam * self.draft_time + outcome.draft_time_s
        self.drafted = lam * self.drafted + outcome.num_draft_tokens
        self.verify_time = lam * self.verify_time + outcome.verify_time_s
        self.spec_steps = lam * self.spec_steps + 1.0
        self.num_updates += 1

    @property
    def alpha(self) -> float | None:
        """α̂, or None before any drafted position was reached."""
        return self.accepted / self.reached if self.reached > 0 else None

    @property
    def step_time(self) -> float | None:
        """T̂: seconds of one plain decoding step."""
        if self.plain_steps > 0:
            return self.plain_time / self.plain_steps
        if self.spec_steps > 0:
            return self.verify_time / self.spec_steps
        return None

    @property
    def cost_ratio(self) -> float | None:
        """ĉ = (d + v) / T (effective: drafting plus the extra cost of verifying more tokens)."""
        step_time = self.step_time
        if self.spec_steps == 0 or not step_time or step_time <= 0:
            return None
        draft_per_token = self.draft_time / self.drafted
        mean_gamma = self.drafted / self.spec_steps
        extra_verify = max(0.0, self.verify_time / self.spec_steps - step_time) / mean_gamma
        return (draft_per_token + extra_verify) / step_time

    def predicted_speedup(self, gamma: int) -> float | None:
        """Thm 3.8 with the current estimates, or None before there are any."""
        alpha, cost = self.alpha, self.cost_ratio
        if alpha is None or cost is None:
            return None
        return walltime_improvement(min(max(alpha, 0.0), 1.0), gamma, cost)

    def __repr__(self) -> str:
        alpha, cost = self.alpha, self.cost_ratio
        fmt = lambda x: "?" if x is None else f"{x:.3f}"  # noqa: E731
        return f"OnlineEstimates(alpha={fmt(alpha)}, cost_ratio={fmt(cost)})"


class OptimalPolicy(DraftLengthPolicy):
    """γ* = optimal_gamma(α̂, ĉ) (paper §3.5), re-chosen every step from online estimates.

    Drafts `initial` tokens for the first `warmup_steps` speculative steps, then the γ in
    [1, max_draft_tokens] that maximizes the predicted speedup. It never drafts 0: wrap it in
    `GuardedPolicy` to fall back to plain decoding when no γ pays.
    """

    def __init__(self, initial: int = DEFAULT_NUM_DRAFT_TOKENS, max_draft_tokens: int = 16,
                 warmup_steps: int = 4, decay: float = 0.9):
        self.max_draft_tokens = _check_gamma(max_draft_tokens, "max_draft_tokens")
        self.initial = min(_check_gamma(initial, "initial"), self.max_draft_tokens)
        self.warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
        self.estimates = OnlineEstimates(decay)
        self.gamma = self.initial

    def num_draft_tokens(self) -> int:
        return self.gamma

    def reset(self) -> None:
        self.estimates = OnlineEstimates(self.estimates.decay)
        self.gamma = self.initial

    def update(self, outcome: StepOutcome) -> None:
        self.estimates.update(outcome)
        alpha, cost = self.estimates.alpha, self.estimates.cost_ratio
        if self.estimates.num_updates >= self.warmup_steps and alpha is not None and cost is not None:
            self.gamma = optimal_gamma(min(max(alpha, 0.0), 1.0), cost, self.max_draft_tokens)

    def __repr__(self) -> str:
        return f"OptimalPolicy(gamma={self.gamma}, {self.estimates!r})"


class ThresholdPolicy(DraftLengthPolicy):
    """Draft up to `max_draft_tokens`, but a row stops as soon as the drafter's own probability of
    the token it just drafted falls below `threshold` (the spirit of SpecDec++ / DISCO, with the
    drafter's confidence standing in for their trained stop predictors; Hugging Face's
    `assistant_confidence_threshold` defaults to 0.4 too).

    Only drafters that know their confidence (model drafters) honour the threshold; others draft
    `max_draft_tokens` every step.
    """

    def __init__(self, max_draft_tokens: int = 8, threshold: float = 0.4):
        self.max_draft_tokens = _check_gamma(max_draft_tokens, "max_draft_tokens")
        self.threshold = _check_unit(threshold, "threshold")

    def num_draft_tokens(self) -> int:
        return self.max_draft_tokens

    def confidence_threshold(self) -> float | None:
        return self.threshold

    def __repr__(self) -> str:
        return f"ThresholdPolicy(max={self.max_draft_tokens}, threshold={self.threshold})"


class GuardedPolicy(DraftLengthPolicy):
    """Speculate with `inner`, but switch to plain decoding (γ = 0) while the measured cost model
    predicts a slowdown: walltime_improvement(α̂, γ, ĉ) < `min_speedup` for the γ `inner` wants.

    While off it probes: every `probe_every` plain steps it speculates for `probe_steps` steps
    with `inner`'s γ, so that if the drafts get better (or drafting cheaper) speculation comes back.
    Plain steps also measure the plain step time T, which sharpens ĉ.
    """

    def __init__(self, inner: DraftLengthPolicy | None = None, *, min_speedup: float = 1.0, warmup_steps: int = 4,
                 probe_every: int = 16, probe_steps: int = 2, decay: float = 0.8):
        if inner is not None and not isinstance(inner, DraftLengthPolicy):
            raise TypeError(f"inner must be a DraftLengthPolicy or None, got {type(inner).__name__}")
        self.inner = inner if inner is not None else OptimalPolicy()
        if not isinstance(min_speedup, (int, float)) or isinstance(min_speedup, bool) or not 0 < min_speedup < float("inf"):
            raise ValueError(f"min_speedup must be a number > 0, got {min_speedup!r}")
        self.min_speedup = float(min_speedup)
        self.warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
        self.probe_every = _check_int(probe_every, "probe_every", 1)
        self.probe_steps = _check_int(probe_steps, "probe_steps", 1)
        # Its own, faster-forgetting estimates: a few good probes must be able to switch drafting back on.
        self.estimates = OnlineEstimates(decay)
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.estimates = OnlineEstimates(self.estimates.decay)
        self.speculating = True
        self._plain_streak = 0  # plain steps since the last probe
        self._probe_left = 0  # speculative probe steps still to run

    def num_draft_tokens(self) -> int:
        return self.inner.num_draft_tokens() if self.speculating or self._probe_left > 0 else 0

    def confidence_threshold(self) -> float | None:
        return self.inner.confidence_threshold()

    def update(self, outcome: StepOutcome) -> None:
        self.inner.update(outcome)
        self.estimates.update(outcome)
        if outcome.num_draft_tokens == 0:
            self._plain_streak += 1
            if not self.speculating and self._plain_streak >= self.probe_every:
                self._plain_streak = 0
                self._probe_left = self.probe_steps
            return
        if self._probe_left > 0:
            self._probe_left -= 1
            if self._probe_left > 0:
                return  # decide once the whole probe is in
        if self.estimates.num_updates < self.warmup_steps:
            return
        predicted = self.estimates.predicted_speedup(max(self.inner.num_draft_tokens(), 1))
        if predicted is None:
            return
        pays = predicted >= self.min_speedup
        if pays != self.speculating:
            logger.info("speculation %s: predicted speedup %.2fX (%r)", "on" if pays else "off", predicted,
                        self.estimates)
        if not pays:
            self._plain_streak = 0
        self.speculating = pays

    def __repr__(self) -> str:
        return f"GuardedPolicy({self.inner!r}, speculating={self.speculating})"


POLICY_NAMES = ("fixed", "heuristic", "optimal", "threshold", "guarded")


def resolve_policy(spec: int | str | DraftLengthPolicy) -> DraftLengthPolicy:
    """An int → FixedPolicy; a name → a fresh policy with default settings; a policy passes through.

    Names: "fixed" (γ = 4), "heuristic", "optimal", "threshold", "guarded" (guarding "optimal").
    A policy instance is checked (`check_policy`), `reset()` (a new generation starts with it) and returned.
    Integers are bounded: 1 <= γ <= MAX_NUM_DRAFT_TOKENS.
    """
    if isinstance(spec, DraftLengthPolicy):
        check_policy(spec).reset()
        return spec
    if not isinstance(spec, (bool, str, float)) and hasattr(spec, "__index__"):  # int, numpy / torch integers
        return FixedPolicy(spec)
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name.isdigit() or (name.startswith("-") and name[1:].isdigit()):
            if len(name) > 20:
                raise ValueError(f"num_draft_tokens must be <= {MAX_NUM_DRAFT_TOKENS}, got {spec!r}")
            return FixedPolicy(int(name))
        factories = {
            "fixed": FixedPolicy,
            "heuristic": HeuristicPolicy,
            "optimal": OptimalPolicy,
            "threshold": ThresholdPolicy,
            "guarded": lambda: GuardedPolicy(OptimalPolicy()),
        }
        if name in factories:
            return factories[name]()
        raise ValueError(f"num_draft_tokens: unknown draft-length policy {spec!r}: use an int >= 1 or one of "
                         f"{', '.join(POLICY_NAMES)}")
    if isinstance(spec, (bool, float)) or spec is None:
        raise ValueError(f"num_draft_tokens must be an int >= 1, a policy name or a DraftLengthPolicy, got {spec!r}")
    return check_policy(spec)  # (refused: an object of another class, naming what it lacks)


def check_policy(policy) -> DraftLengthPolicy:
    """`policy` if it is a draft-length policy object: a `DraftLengthPolicy` (subclass) implementing
    `num_draft_tokens()` (`update`, `reset`, `confidence_threshold` have defaults); else a ValueError naming what
    it lacks (for an object of another class: which of those methods it has not, and to subclass the base)."""
    kind = type(policy).__name__
    if isinstance(policy, DraftLengthPolicy):
        if type(policy).num_draft_tokens is DraftLengthPolicy.num_draft_tokens:
            raise ValueError(f"num_draft_tokens: {kind} does not implement num_draft_tokens() (a DraftLengthPolicy "
                             "subclass must: the γ of the next step)")
        return policy
    missing = [f"{m}()" for m in POLICY_METHODS if not callable(getattr(policy, m, None))]
    lacks = f"lacks {', '.join(missing)} and " if missing else ""
    raise ValueError(f"num_draft_tokens: a policy object must be a specdec.DraftLengthPolicy; {kind} {lacks}does not "
                     f"subclass it (the protocol: {', '.join(f'{m}()' for m in POLICY_METHODS)})")


#: The draft-length policy protocol's methods (`DraftLengthPolicy`: only `num_draft_tokens` has no default).
POLICY_METHODS = ("num_draft_tokens", "update", "reset", "confidence_threshold")
