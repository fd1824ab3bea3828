"""The "auto" prefill budget (`EngineConfig.prefill_budget="auto"`): derived from what the engine measures.

A fixed budget in tokens is wrong at one load or the other (one H200, zoo pair, head, "auto", `specdec serve`):
1,024 tokens a step bounded the speculative ITL p99 at 8 / 32 clients but starved the slots at 64 / 128, where
requests finish faster than 1,024 tokens a step can prefill their successors (0.61x plain, TTFT p50 1.4 / 3.6 s);
a speculative step finishes requests ~τ times faster than a plain one, so it needs ~τ times the prompt tokens per
step. So the budget is set in *time*, and a deadline guarantees progress:

- the stall bound: a step may prefill for at most `stall` × the decode step's measured seconds (the median of the
  last `WINDOW` decode steps): between two decode steps of a running request the gap is at most (1 + stall) × a
  decode step, whatever the model, batch, γ or device. Tokens = that time / the measured seconds per prompt token
  of the recent prefill budgets (target and drafter feeds together, ratio of sums). The ratio is taken at the
  budgets actually fed, so where a feed costs a + b·tokens (a: the launches of an eager forward) the budget
  converges to the tokens whose feed takes the allowed time: B' = B · allowed / seconds(B), a contraction (its
  slope at the fixed point is a / allowed < 1) — no launch overhead to fit apart;
- no starvation: with `EngineConfig.prefill_steps` K (4 by default with "auto") a step feeds more than that when
  the backlog needs it, so every admitted request is fed in full within K steps of its admission
  (`ChunkedPrefill._step_budget`): the slots cannot stay filling while requests finish around them.

Before anything is measured (the first admissions of a run) the budget is `COLD` tokens. Pure Python: no torch.
"""

from __future__ import annotations

from collections import deque

__all__ = ["AutoBudget", "DEFAULT_STALL", "DEFAULT_STEPS", "COLD", "FLOOR", "WINDOW"]

DEFAULT_STALL = 0.5  # prefill seconds a step may add, as a fraction of the decode step (ITL ≤ 1.5x a decode step)
DEFAULT_STEPS = 4  # "auto"'s deadline K when `prefill_steps` is not given
COLD = 512  # tokens a step before a decode step and a prefill budget are measured
FLOOR = 16  # the budget never falls below this (progress even when one eager forward exceeds the allowed stall)
CEILING = 1 << 20  # nor above this (`EngineConfig.prefill_budget`'s largest)
WINDOW = 32  # decode steps whose median is "the decode step"; prefill budgets whose sums give seconds per token


class AutoBudget:
    """Prompt tokens a step may prefill so that the prefill takes at most `stall` × the measured decode step."""

    def __init__(self, stall: float = DEFAULT_STALL, window: int = WINDOW):
        self.stall = float(stall)
        self._steps: deque[float] = deque(maxlen=window)  # decode step seconds
        self._fed: deque[tuple[float, int]] = deque(maxlen=window)  # (seconds, prompt tokens) per prefill budget

    def decoded(self, seconds: float) -> None:
        """A decode step took `seconds` (no admission, no prefill in it)."""
        if seconds > 0:
            self._steps.append(float(seconds))

    def fed(self, tokens: int, seconds: float) -> None:
        """One step's budget of prefill fed `tokens` prompt tokens (target and drafter together) in `seconds`."""
        if tokens > 0 and seconds > 0:
            self._fed.append((float(seconds), int(tokens)))

    def step_seconds(self) -> float | None:
        """The median decode step (None: none measured yet)."""
        steps = sorted(self._steps)
        if not steps:
            return None
        middle = len(steps) // 2
        return steps[middle] if len(steps) % 2 else (steps[middle - 1] + steps[middle]) / 2

    def seconds_per_token(self) -> float | None:
        """Prefill seconds per prompt token over the recent budgets (None: none fed yet)."""
        if not self._fed:
            return None
        return sum(s for s, _ in self._fed) / sum(n for _, n in self._fed)

    def budget(self) -> int:
        """This step's budget in prompt tokens (`COLD` until both rates are measured)."""
        step, per_token = self.step_seconds(), self.seconds_per_token()
        if step is None or per_token is None:
            return COLD
        return int(min(max(self.stall * step / per_token, FLOOR), CEILING))

    def report(self) -> dict:
        """JSON-ready: the stall fraction, the decode step (ms), prefill µs per token and the budget now."""
        step, per_token = self.step_seconds(), self.seconds_per_token()
        return {"stall": self.stall, "decode_step_ms": None if step is None else step * 1e3,
                "prefill_us_per_token": None if per_token is None else per_token * 1e6, "budget": self.budget()}
