"""The "auto" prefill budget (`EngineConfig.prefill_budget="auto"`): derived from what the engine measures.

A fixed budget in tokens is wrong at one load or the other (one H200, zoo pair, head, "auto", `specdec serve`):
1,024 tokens a step bounded the speculative ITL p99 at 8 / 32 clients but starved the slots at 64 / 128, where
requests finish faster than 1,024 tokens a step can prefill their successors (0.61x plain, TTFT p50 1.4 / 3.6 s);
a speculative step finishes requests ~τ times faster than a plain one, so it needs ~τ times the prompt tokens per
step. So the budget is set in *time*, and a deadline guarantees progress:

- the stall bound: a step may prefill for at most `stall` × the decode step's measured seconds (the median of the
  last `WINDOW` decode steps): between two decode steps of a running request the gap is at most (1 + stall) × a
  decode step, whatever the model, batch, γ or device. The tokens that takes come from the recent feeds' seconds
  fitted as a + b·tokens (least squares over the last `WINDOW` feeds; a: what a feed costs whatever its size — an
  eager forward's launches —, b: seconds per prompt token): (stall × step − a) / b;
- never below a / b: a feed whose launches cost more than its work wastes the step it stalls (on one H200 the zoo
  pair's eager prefill measured a of several ms against a 3–15 ms decode step: a budget sized by the stall alone
  fell to 16–71 tokens a step, and every arm's throughput to ~0.6x — the feeds were all launches). Where a alone
  exceeds the allowed stall no budget meets it; a / b tokens at least do half work in the time they take;
- no starvation: with `EngineConfig.prefill_steps` K (4 by default with "auto") a step feeds more than that when
  the backlog needs it, so every admitted request is fed in full within K steps of its admission
  (`prefill.ChunkBudget.step_budget`): the slots cannot stay filling while requests finish around them.

Before anything is measured (the first admissions of a run) the budget is `COLD` tokens. Once the budget settles
on one size the feeds no longer tell a from b: the last fit stays, scaled to the recent feeds' cost; with feeds
of one size only and no fit yet, a = 0 and b is their seconds per token, and the budget doubles (a feed of another
size, to fit). Pure Python: no torch.
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
        self._fit: tuple[float, float] | None = None  # the last (a, b) the feeds' sizes allowed to fit

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

    def feed_cost(self) -> tuple[float, float] | None:
        """(a, b): a feed of n prompt tokens takes a + b·n seconds, fitted over the recent feeds (None: none yet)."""
        if not self._fed:
            return None
        n = len(self._fed)
        mean_t = sum(t for _, t in self._fed) / n
        mean_s = sum(s for s, _ in self._fed) / n
        var = sum((t - mean_t) ** 2 for _, t in self._fed)
        if n >= 4 and var > (0.1 * mean_t) ** 2 * n:  # sizes spread enough to tell the two apart
            b = sum((t - mean_t) * (s - mean_s) for s, t in self._fed) / var
            a = mean_s - b * mean_t
            if b > 0:  # (a negative intercept: noise around a line through 0)
                self._fit = (max(a, 0.0), b if a >= 0 else mean_s / mean_t)
                return self._fit
        if self._fit is not None:  # the budget settled on one size: the last fit, rescaled to the feeds' cost now
            a, b = self._fit
            scale = mean_s / (a + b * mean_t)
            return a * scale, b * scale
        return 0.0, mean_s / mean_t

    @property
    def fitted(self) -> bool:
        """Whether the feeds' sizes have spread enough to fit a and b apart (`feed_cost`)."""
        return self.feed_cost() is not None and self._fit is not None

    def seconds_per_token(self) -> float | None:
        """The fitted seconds per prompt token b (None: nothing fed yet)."""
        cost = self.feed_cost()
        return None if cost is None else cost[1]

    def budget(self, step_seconds: float | None = None) -> int:
        """This step's budget in prompt tokens (`COLD` until a decode step and a feed are measured); step_seconds: the
        decode step where none is measured (a mixed step's fitted cost without chunks)."""
        step, cost = self.step_seconds(), self.feed_cost()
        step = step_seconds if step is None else step
        if step is None or cost is None:
            return COLD
        a, b = cost
        tokens = max((self.stall * step - a) / b, a / b, FLOOR)
        if self._fit is None and len(self._fed) >= 2:  # every feed one size so far: a second size, to fit a and b
            tokens *= 2
        return int(min(tokens, CEILING))

    def report(self) -> dict:
        """JSON-ready: the stall fraction, the decode step (ms), a feed's fixed cost (ms), prefill µs per token and
        the budget now."""
        step, cost = self.step_seconds(), self.feed_cost()
        return {"stall": self.stall, "decode_step_ms": None if step is None else step * 1e3,
                "feed_overhead_ms": None if cost is None else cost[0] * 1e3,
                "prefill_us_per_token": None if cost is None else cost[1] * 1e6, "budget": self.budget()}
