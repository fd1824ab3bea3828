"""The drafter's prompt feeding as the γ policy (`specdec.engine.policy`) charges it to speculative steps.

A drafter that keeps a cache is fed every admitted prompt: at admission while the engine speculates, else by the
next speculative step's catch-up (a request that finishes inside a plain run is never fed). No step time shows
that cost, so the policy charges it per token a speculative step produces:

    charge = (drafter seconds per prompt token fed) × (prompt tokens per admitted request)
             × (requests finished per token produced)

each factor a decayed mean measured whatever the regime (plain steps finish requests and produce tokens too), so a
run of plain steps neither inflates nor erases it, and a full batch admitted at once (a cost already paid) weighs
in only through its prompts' length. (Charging the admissions' seconds to the speculative steps' tokens alone let
an early charge — a full batch's drafter prefill over a few probe steps' tokens — lock the engine into plain
steps: issue 21's third GPU run, auto 1.17x where a fixed γ = 2 read 1.85x.) Leaving a plain run also feeds the
drafter the prompts that run admitted (`backlog`): a one-time cost of the switch.
"""

from __future__ import annotations

__all__ = ["AdmissionCost"]

_FLOW_DECAY = 0.99  # per step (plain or not): requests finished per token produced, over the last ~100 steps
_FEED_DECAY = 0.9  # per admission or catch-up: seconds per prompt token fed, prompt tokens per request, over ~10


class AdmissionCost:
    def __init__(self):
        self._feed = [0.0, 0.0]  # decayed (drafter seconds feeding prompts, prompt tokens fed)
        self._prompts = [0.0, 0.0]  # decayed (prompt tokens admitted, requests admitted): every admission
        self._flow = [0.0, 0.0]  # decayed (requests finished, tokens produced): every step
        self._rows_before, self._joined = 0, 0  # rows of the last step; requests admitted since
        self._unfed = 0.0  # prompt tokens admitted unfed since the last speculative step

    def per_token(self) -> float:
        """Seconds of prompt feeding per token of a speculative step (0 before anything was fed or finished)."""
        (seconds, fed), (prompts, requests), (finished, produced) = self._feed, self._prompts, self._flow
        if fed <= 0 or requests <= 0 or produced <= 0:
            return 0.0
        return seconds / fed * prompts / requests * finished / produced

    def backlog(self) -> float:
        """Seconds the next speculative step spends feeding the prompts admitted since the last one (the engine's
        catch-up feeds every running row's; counted for all admitted: a bound)."""
        seconds, fed = self._feed
        return seconds / fed * self._unfed if fed > 0 else 0.0

    def admitted(self, prompt_tokens: int, seconds: float | None, requests: int) -> None:
        """`requests` admitted with `prompt_tokens` in all; fed to the drafter in `seconds` (None: not fed)."""
        self._joined += max(requests, 0)
        if seconds is None:
            self._unfed += max(prompt_tokens, 0)
        self._prompts = [self._prompts[0] * _FEED_DECAY + max(prompt_tokens, 0),
                         self._prompts[1] * _FEED_DECAY + max(requests, 0)]
        if seconds is not None:
            self.fed(seconds, prompt_tokens)

    def fed(self, seconds: float, prompt_tokens: int) -> None:
        """The drafter was fed `prompt_tokens` prompt tokens in `seconds` (an admission, a catch-up's prompt share)."""
        if prompt_tokens > 0:
            self._feed = [self._feed[0] * _FEED_DECAY + max(seconds, 0.0), self._feed[1] * _FEED_DECAY + prompt_tokens]

    def stepped(self, gamma: int, produced: float, rows: int) -> None:
        """A step at γ of `rows` running rows produced `produced` tokens (the rows gone since the last step and
        the requests admitted in between give those that finished)."""
        if gamma > 0:
            self._unfed = 0.0
        finished = max(self._rows_before + self._joined - rows, 0)
        self._rows_before, self._joined = rows, 0
        self._flow = [self._flow[0] * _FLOW_DECAY + finished, self._flow[1] * _FLOW_DECAY + max(produced, 0.0)]

    def report(self) -> dict:
        """JSON-ready: the charge per token (ms) and its factors (None: not measured yet)."""
        (seconds, fed), (prompts, requests), (finished, produced) = self._feed, self._prompts, self._flow
        return {"admit_ms_per_token": self.per_token() * 1e3 if fed and requests and produced else None,
                "feed_us_per_prompt_token": seconds / fed * 1e6 if fed else None,
                "prompt_tokens_per_request": prompts / requests if requests else None,
                "tokens_per_request": produced / finished if finished else None}
