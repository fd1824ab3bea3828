"""What `specdec.check` found: named, frozen records (`CheckResult.to_dict()` is what `--json` prints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specdec.exactness.stats import ChiSquare

__all__ = ["CheckResult", "PositionResult", "GreedyResult", "GreedyDifference", "CheckTimings"]


@dataclass(frozen=True)
class PositionResult:
    """The tests of generated position `position` (1-based), over every trial.

    law              the trials against the target's exact law (a pass: p-value ≥ level)
    drafter          the same trials against q (None: q unknown) — must reject
    resample_from_p  the same trials against the "resample from p after a rejection" law — must reject
    cooler           the same trials against p at 0.8× the temperature — the power check where q is unknown
    """

    position: int
    law: ChiSquare
    drafter: ChiSquare | None
    resample_from_p: ChiSquare | None
    cooler: ChiSquare | None = None


@dataclass(frozen=True)
class GreedyDifference:
    """Where one prompt's speculative greedy tokens first differ from plain decoding's.

    margin  the target's top-2 logit gap after the common prefix (one plain forward pass, the model's dtype)
    tie     margin within the tolerance of a non-fp32 model (its rounding can flip such an argmax)
    """

    prompt: int  # index into the greedy prompts
    position: int  # 1-based generated position of the first difference
    plain_token: int | None  # None: plain decoding had stopped
    speculative_token: int | None
    margin: float | None = None
    tie: bool = False


@dataclass(frozen=True)
class GreedyResult:
    """Greedy speculative decoding against plain greedy decoding on the same runner, token for token.

    tie_tolerance  None for fp32/fp64 (every difference fails); else 2 ulps of the largest logit in the model's
                   dtype: a difference at a smaller top-2 margin is rounding (reported, not a failure)
    """

    prompts: int
    new_tokens: int
    identical: int  # prompts whose speculative tokens equal plain decoding's
    differences: tuple[GreedyDifference, ...] = ()
    tie_tolerance_ulps: float | None = None

    @property
    def first_difference(self) -> GreedyDifference | None:
        return self.differences[0] if self.differences else None

    @property
    def ties(self) -> int:
        return sum(d.tie for d in self.differences)

    @property
    def failed(self) -> bool:
        return any(not d.tie for d in self.differences)


@dataclass(frozen=True)
class CheckTimings:
    select_s: float
    trials_s: float
    laws_s: float
    greedy_s: float
    total_s: float


@dataclass(frozen=True)
class CheckResult:
    """What was tested and what it showed. `status`: "pass", "fail" (a law rejected or greedy differs) or
    "underpowered" (no failure, but a wrong law was not rejected: these trials could not have caught a bug)."""

    status: str
    reasons: tuple[str, ...]
    engine: str  # as asked: "auto", "fast" or "hf"
    num_draft_tokens: int | str
    temperature: float
    top_k: int
    top_p: float
    level: float
    trials: int
    trials_per_prompt: tuple[int, ...]
    prompts: tuple[tuple[int, ...], ...]  # the law test's prompts (token ids)
    positions: tuple[PositionResult, ...]  # empty at temperature 0 (greedy is its own test)
    power: bool | None  # every wrong law rejected at every position (None: not assessed)
    greedy: GreedyResult | None
    timings: CheckTimings
    runner: str = ""  # what `engine` resolved to for the speculative runs: "fast" (the engine) or "hf" (the loop)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def worst_p_value(self) -> float | None:
        """The smallest p-value of the target-law tests (None when no law test ran)."""
        return min((p.law.p_value for p in self.positions), default=None)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["prompts"] = [list(p) for p in self.prompts]
        out["passed"] = self.passed
        out["worst_p_value"] = self.worst_p_value
        if self.greedy is not None:
            out["greedy"].update(ties=self.greedy.ties, failed=self.greedy.failed)
        return out
