"""The drafter's prompt feeding as the γ policy (`specdec.engine.policy`) charges it to speculative steps.

A drafter that keeps a cache is fed every admitted prompt: at admission while the engine speculates, else by the
next speculative step's catch-up (a request that finishes inside a plain run is never fed); with chunked prefill
(`EngineConfig.prefill_budget`, `engine/prefill.py`) a budget per step in every regime, each budget one sample
(`prefilled`), so nothing is left for a catch-up. No step time shows
that cost, so the policy charges it per token a speculative step produces:

    charge = (drafter seconds per prompt token fed) × (prompt tokens per admitted request)
             × (requests finished per token produced)

the feed cost the median seconds per prompt token of the last `_FEED_WINDOW` feeds (a cold one — a full first batch
fed eagerly by shapes run for the first time — is one sample, outvoted by two warm ones), at most the target's own
median over its last prefills (timed at every admission in every regime: a smaller drafter's feed costs no more)
and at most that median times the median ratio of the drafter's feed to the target's prefill of the same prompts
(both cold in a shape's first admission: a plain run, which feeds the drafter nothing, still brings the estimate
down as the target's prefill warms up); the other factors decayed means measured whatever the regime (plain steps
finish requests and produce tokens too), so a run of plain steps neither inflates nor erases it, and a full batch
admitted at once (a cost already paid) weighs in only through its prompts' length. (Charging the admissions'
seconds to the speculative steps' tokens alone let an early charge — a full batch's drafter prefill over a few
probe steps' tokens — lock the engine into plain steps: issue 21's third GPU run, auto 1.17x where a fixed γ = 2
read 1.85x. A decayed mean of the feeds alone let the first cold feeds, ~10x the steady cost, do the same, since
a plain run never re-measures them: issue 21's H200 recheck after that fix, 64 slots, auto 1.07x where γ = 2 read
1.70x, 15.5 µs per prompt token fed in the auto row where the fixed-γ rows of the same engine read 1.3–1.6.)
Leaving a plain run also feeds the drafter the prompts that run admitted (`backlog`): a one-time cost of the switch.
The feed cost is also at most the drafter's least seconds per token drafted over its recent steps (`drafted`: a
step's draft phase over rows × γ; a prefill feeds a chunk per pass where a step drafts one token per row), measured
in every speculative step, the probes and first timings of a plain run included: issue 21's H200 run of 2026-11-27
(64 slots, the model drafter) kept the estimate at the target's cold 15.9 µs per prompt token — the cold feeds of
the first admissions and their cold ratio to the target's prefill, never re-measured in the plain run that estimate
caused — and "auto" read 0.80x plain where a fixed γ = 4 read 1.62x (its feeds: 1.6 µs per prompt token). (The
least, not the median: each sample is a bound, and batch-1 steps draft at 26-48 µs a token on the H200.)

Under the mixed step (`EngineConfig.mixed_step`, `engine/prefill.py`) the drafter is fed every filling prompt's
chunks whatever the regime, plain runs included: the feeding is then no cost of speculating — every arm pays it —
and `every_regime` (set by the engine) makes `per_token` 0, as the mixed step's chunks are kept out of the step
times (`policy_mixed`). (On one H200, zoo pair, feature head, 64 slots closed loop, the mixed step's "auto" row
read a charge of 0.024 ms per token — 0.007 without mixed steps —: at 64 rows and τ ≈ 4.6 (α 0.955) 7 ms added to
the 6.5 ms its table gave γ = 4, which put a 2.4 ms plain step first; "auto" ran a mean γ of 1.68 against 4.17.)
`backlog` stays: a whole prefill at admission with nothing running is still fed only while speculating.
"""

from __future__ import annotations

from collections import deque

__all__ = ["AdmissionCost"]

_FLOW_DECAY = 0.99  # per step (plain or not): requests finished per token produced, over the last ~100 steps
_FEED_DECAY = 0.9  # per admission: prompt tokens per request, over ~10
_FEED_WINDOW = 16  # feeds (admissions, catch-ups) and target prefills whose seconds per prompt token give the median


class AdmissionCost:
    def __init__(self):
        self._feed = deque(maxlen=_FEED_WINDOW)  # (drafter seconds feeding prompts, prompt tokens fed) per feed
        self._target = deque(maxlen=_FEED_WINDOW)  # (target seconds prefilling prompts, prompt tokens) per admission
        self._ratio = deque(maxlen=_FEED_WINDOW)  # (drafter's feed seconds, target's prefill seconds): same prompts
        self._draft = deque(maxlen=_FEED_WINDOW)  # (seconds drafting, tokens drafted) per speculative step
        self._prompts = [0.0, 0.0]  # decayed (prompt tokens admitted, requests admitted): every admission
        self._flow = [0.0, 0.0]  # decayed (requests finished, tokens produced): every step
        self._rows_before, self._joined = 0, 0  # rows of the last step; requests admitted since
        self._unfed = 0.0  # prompt tokens admitted unfed since the last speculative step
        self.every_regime = False  # the drafter is fed every prompt whatever the regime (the mixed step): no charge

    def feed_per_prompt_token(self) -> float | None:
        """The drafter's median seconds per prompt token over its last feeds, at most the target's over its last
        prefills, that times the drafter's share of the target's prefill, and the drafter's least seconds per token
        drafted over its last speculative steps (each a bound; a median mixed batch-1 steps in, 26-48 µs a token
        on the H200 where 64-row steps draft at a few: no bound at all) (None: nothing fed yet)."""
        feed, target, ratio = _rate(self._feed), _rate(self._target), _rate(self._ratio)
        draft = min([t / n for t, n in self._draft]) if self._draft else None  # (each sample a bound: the least)
        if feed is None:
            return None
        bounds = [feed, target, ratio * target if ratio is not None and target is not None else None, draft]
        return min(b for b in bounds if b is not None)

    def per_token(self) -> float:
        """Seconds of prompt feeding per token of a speculative step (0 before anything was fed or finished, and
        with `every_regime`: every arm pays the feeding)."""
        feed, (prompts, requests), (finished, produced) = self.feed_per_prompt_token(), self._prompts, self._flow
        if feed is None or requests <= 0 or produced <= 0 or self.every_regime:
            return 0.0
        return feed * prompts / requests * finished / produced

    def backlog(self) -> float:
        """Seconds the next speculative step spends feeding the prompts admitted since the last one (the engine's
        catch-up feeds every running row's; counted for all admitted: a bound)."""
        feed = self.feed_per_prompt_token()
        return feed * self._unfed if feed is not None else 0.0

    def admitted(self, prompt_tokens: int, seconds: float | None, requests: int,
                 target_seconds: float | None = None) -> None:
        """`requests` admitted with `prompt_tokens` in all; fed to the drafter in `seconds` (None: not fed); the
        target prefilled them in `target_seconds` (None: not timed)."""
        self._joined += max(requests, 0)
        if target_seconds is not None and prompt_tokens > 0:
            self._target.append((max(target_seconds, 0.0), prompt_tokens))
            if seconds is not None and target_seconds > 0:
                self._ratio.append((max(seconds, 0.0), target_seconds))
        if seconds is None:
            self._unfed += max(prompt_tokens, 0)
        self._prompts = [self._prompts[0] * _FEED_DECAY + max(prompt_tokens, 0),
                         self._prompts[1] * _FEED_DECAY + max(requests, 0)]
        if seconds is not None:
            self.fed(seconds, prompt_tokens)

    def prefilled(self, target_tokens: int, target_seconds: float, drafter_tokens: int, drafter_seconds: float | None,
                  requests: int, prompt_tokens: int) -> None:
        """One budget of chunked prefill (`engine.prefill`): the target fed `target_tokens` prompt tokens in
        `target_seconds`, the drafter `drafter_tokens` in `drafter_seconds` (None: not fed), and `requests`
        requests of `prompt_tokens` in all became ready (joined the running rows). A request's prompt is fed
        over several steps, so the samples are per budget (seconds per token over the tokens of that budget; the
        drafter-to-target ratio per token) and the requests count when they join. Chunked prefill feeds the drafter
        in every regime: nothing is left for a catch-up (`backlog`)."""
        self._joined += max(requests, 0)
        if target_tokens > 0:
            self._target.append((max(target_seconds, 0.0), target_tokens))
        if drafter_seconds is not None and drafter_tokens > 0:
            self.fed(drafter_seconds, drafter_tokens)
            if target_tokens > 0 and target_seconds > 0:
                self._ratio.append((max(drafter_seconds, 0.0) / drafter_tokens, target_seconds / target_tokens))
        if requests > 0:
            self._prompts = [self._prompts[0] * _FEED_DECAY ** requests + max(prompt_tokens, 0),
                             self._prompts[1] * _FEED_DECAY ** requests + requests]

    def drafted(self, seconds: float, tokens: int) -> None:
        """A speculative step's drafting took `seconds` for `tokens` drafted tokens (rows × γ): a bound on what feeding
        the drafter a prompt token costs (a prefill feeds a chunk of a prompt in one pass, a step drafts one token per
        row a pass), measured in every speculative step — the probes of a plain run included."""
        if tokens > 0 and seconds > 0:
            self._draft.append((seconds, tokens))

    def fed(self, seconds: float, prompt_tokens: int) -> None:
        """The drafter was fed `prompt_tokens` prompt tokens in `seconds` (an admission, a catch-up's prompt share)."""
        if prompt_tokens > 0:
            self._feed.append((max(seconds, 0.0), prompt_tokens))

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
        feed, (prompts, requests), (finished, produced) = self.feed_per_prompt_token(), self._prompts, self._flow
        target = _rate(self._target)
        return {"admit_ms_per_token": self.per_token() * 1e3 if feed is not None and requests and produced else None,
                "feed_us_per_prompt_token": feed * 1e6 if feed is not None else None,
                "target_prefill_us_per_prompt_token": target * 1e6 if target is not None else None,
                "draft_us_per_token": min([t / n for t, n in self._draft]) * 1e6 if self._draft else None,
                "prompt_tokens_per_request": prompts / requests if requests else None,
                "tokens_per_request": produced / finished if finished else None}


def _rate(samples) -> float | None:
    """The median of the samples' a / b over (a, b) samples (None: none): seconds per token, or a time ratio."""
    rates = sorted(t / n for t, n in samples)
    if not rates:
        return None
    middle = len(rates) // 2
    return rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2
