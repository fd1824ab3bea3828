"""A request's runner outputs → text deltas, a `Completion` and the request's own statistics.

`TextRequest.feed(output)` turns one `RequestOutput` (tokens committed by one step) into a `TextDelta`:
the released text, one `TokenPiece` per token (its text and how it was made: an accepted draft, the target's
token after a rejection, the bonus token after all drafts were accepted, or a plain step), and the step's
draft counts. Counts include every step the runner ran for the request (after a stop string too, until
the runner confirms the abort), so the sum over responses equals the server's metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdec.metrics import SpecStats
from specdec.text.detokenize import IncrementalText

__all__ = ["TokenPiece", "TextDelta", "RequestStats", "Completion", "TextRequest"]


@dataclass(frozen=True)
class TokenPiece:
    token_id: int
    text: str  # text released by this token ("" while held back: an incomplete character, a possible stop)
    kind: str  # "accepted" (a draft the target accepted) | "resampled" | "bonus" | "plain"
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None  # the most likely (token id, log p), if asked for


@dataclass(frozen=True)
class TextDelta:
    text: str
    pieces: tuple[TokenPiece, ...]
    num_accepted: int  # drafts accepted in this step
    num_drafted: int  # drafts proposed in this step (num_drafted - num_accepted were rejected)
    finish_reason: str | None = None  # set on the request's last delta


@dataclass(frozen=True)
class RequestStats:
    """One request's speculative-decoding counters and timings (τ, acceptance, tokens/s)."""

    num_prompt_tokens: int
    num_generated_tokens: int
    num_steps: int  # target verification steps that committed tokens for this request
    num_drafts: int  # steps with at least one draft (vLLM's num_drafts)
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # [γ] drafts accepted at position i
    time_to_first_token_s: float | None
    wall_time_s: float
    alpha: float | None = None  # α = E[β] from the runner's exact per-request stats, when it has them
    spec: SpecStats | None = field(default=None, repr=False, compare=False)

    @property
    def mean_accepted_length(self) -> float:
        """τ: tokens per step for this request (accepted drafts + the target's token)."""
        return (self.num_accepted_tokens + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "accepted_per_step": self.mean_accepted_length,
            "acceptance_rate": self.acceptance_rate,
            "num_steps": self.num_steps,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "time_to_first_token_s": self.time_to_first_token_s,
            "tokens_per_second": self.tokens_per_second,
        }


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]  # generated tokens up to the EOS or the token that completed a stop string
    finish_reason: str  # "stop" (EOS or a stop string) | "length" | "abort"
    prompt_token_ids: list[int]
    logprobs: list[float] | None  # log p(token) of the target's raw distribution, if asked for
    stats: RequestStats
    stop_string: str | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, its N most likely (id, log p) if asked
    num_cached_tokens: int = 0  # prompt tokens the engine's prefix cache held at admission (vLLM's name)


class TextRequest:
    """The text side of one running request (fed from one thread at a time)."""

    def __init__(self, request_id: str, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (),
                 logprobs: bool = False, decode_context=None, min_tokens: int = 0):
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        context = self.prompt_ids if decode_context is None else list(decode_context)
        self.text = IncrementalText(tokenizer, context, stop, min_tokens)
        self.want_logprobs = logprobs
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.finished = False
        self.finish_reason: str | None = None
        self.num_cached_tokens = 0  # (the engine's final output says)
        self._counts = {"steps": 0, "drafts": 0, "drafted": 0, "accepted": 0}
        self._per_pos: list[int] = []
        self._spec: SpecStats | None = None
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.t_end: float | None = None

    @property
    def stop_reached(self) -> bool:
        """A stop string ended the text: the caller aborts the runner's request and waits for its last output."""
        return self.text.stopped

    def feed(self, output) -> TextDelta:
        tokens = list(output.new_token_ids)
        accepted, drafted = int(output.num_accepted), int(output.num_drafted)
        c = self._counts
        if tokens or drafted:
            c["steps"] += 1
        c["drafts"] += drafted > 0
        c["drafted"] += drafted
        c["accepted"] += accepted
        if len(self._per_pos) < accepted:
            self._per_pos += [0] * (accepted - len(self._per_pos))
        for i in range(accepted):
            self._per_pos[i] += 1
        if tokens and self.t_first is None:
            self.t_first = time.perf_counter()
        pieces = []
        logprobs = output.logprobs or [None] * len(tokens)
        tops = getattr(output, "top_logprobs", None) or [None] * len(tokens)
        for i, (tok, lp, top) in enumerate(zip(tokens, logprobs, tops)):
            if self.text.stopped:
                break
            kind = "plain" if drafted == 0 else "accepted" if i < accepted else "bonus" if accepted == drafted else "resampled"
            top = None if top is None else tuple((int(t), float(v)) for t, v in top)
            pieces.append(TokenPiece(int(tok), self.text.add(int(tok)), kind, lp, top))
            if self.want_logprobs:
                self.logprobs.append(lp)
                if top is not None:
                    self.top_logprobs.append(list(top))
        reason = None
        if output.finished:
            self.finished = True
            self.t_end = time.perf_counter()
            self._spec = output.stats
            self.num_cached_tokens = int(getattr(output, "num_cached_tokens", 0) or 0)
            tail = self.text.finish()
            if tail and pieces:
                last = pieces[-1]
                pieces[-1] = TokenPiece(last.token_id, last.text + tail, last.kind, last.logprob, last.top_logprobs)
            elif tail:
                pieces.append(TokenPiece(-1, tail, "plain"))
            reason = "stop" if self.text.stopped else output.finish_reason
            self.finish_reason = reason
        return TextDelta("".join(p.text for p in pieces), tuple(pieces), accepted, drafted, reason)

    def stats(self) -> RequestStats:
        c = self._counts
        end = self.t_end if self.t_end is not None else time.perf_counter()
        spec = self._spec
        return RequestStats(
            num_prompt_tokens=len(self.prompt_ids),
            num_generated_tokens=len(self.text.token_ids),
            num_steps=c["steps"], num_drafts=c["drafts"], num_draft_tokens=c["drafted"],
            num_accepted_tokens=c["accepted"], accepted_per_position=tuple(self._per_pos),
            time_to_first_token_s=None if self.t_first is None else self.t_first - self.t_submit,
            wall_time_s=end - self.t_submit,
            alpha=spec.alpha if spec is not None else None, spec=spec,
        )

    def completion(self) -> Completion:
        if not self.finished:
            raise RuntimeError("the request has not finished yet")
        return Completion(
            text=self.text.text, token_ids=list(self.text.token_ids), finish_reason=self.finish_reason,
            prompt_token_ids=self.prompt_ids, logprobs=list(self.logprobs) if self.want_logprobs else None,
            stats=self.stats(), stop_string=self.text.stop_string,
            top_logprobs=list(self.top_logprobs) if self.want_logprobs and self.top_logprobs else None,
            num_cached_tokens=self.num_cached_tokens,
        )
