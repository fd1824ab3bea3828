"""One definition of what a step commits and counts, shared by every runner (eager loop, engine).

  commit rule   a row's step produced n+1 tokens (n accepted drafts, then the residual or bonus token);
                it keeps the first min(n+1, budget) of them, cut after its first EOS (`commit_counts`)
  counters      per row, per step: drafts verified/accepted at each position, Σβ, drafted, active
                (`step_counters` on the device → `StepCounts` on the host → `SpecStats.add_counts`)
  results       `GenerateResult` (per-prompt tokens + stats) and `TokenEvent` (what one step committed)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from specdec.metrics import SpecStats

__all__ = ["GenerateResult", "GenerationStream", "RequestOutput", "TokenEvent", "StepCounts", "commit_counts", "step_counters", "Clock"]


@dataclass(frozen=True)
class GenerateResult:
    sequences: list[list[int]]  # new tokens per row, prompt excluded, cut after EOS
    stats: SpecStats


@dataclass(frozen=True)
class TokenEvent:
    """Tokens committed in one step: `tokens[i]` were appended to prompt `rows[i]`."""

    step: int
    rows: list[int]
    tokens: list[list[int]]
    finished: list[int]  # rows that finished in this step


class GenerationStream:
    """Iterate to get a `TokenEvent` per step; `.result` holds the `GenerateResult` once exhausted."""

    def __init__(self, steps: Iterator[TokenEvent], holder: dict):
        self._steps = steps
        self._holder = holder

    def __iter__(self) -> Iterator[TokenEvent]:
        yield from self._steps

    @property
    def result(self) -> GenerateResult:
        if "result" not in self._holder:
            raise RuntimeError("the stream has not finished yet: iterate over it first")
        return self._holder["result"]


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step did for one request (every runner that serves requests reports these)."""

    request_id: str
    new_token_ids: list[int]
    logprobs: list[float] | None
    num_accepted: int  # the first num_accepted of new_token_ids were accepted drafts
    num_drafted: int  # drafts proposed for this request in this step (0 = a plain step)
    finished: bool
    finish_reason: str | None  # "stop" (EOS) | "length" | "abort"
    stats: SpecStats | None = None  # the request's own statistics, on its final output

    @classmethod
    def make(cls, request_id: str, new_token_ids: list[int], logprobs: list[float] | None, num_accepted: int,
             num_drafted: int, finished: bool = False, finish_reason: str | None = None,
             stats: SpecStats | None = None) -> "RequestOutput":
        """The same frozen object as `RequestOutput(...)`, built without the dataclass `__init__`'s one
        `object.__setattr__` per field (the engine builds one per running request per step)."""
        out = object.__new__(cls)
        object.__setattr__(out, "__dict__", {
            "request_id": request_id, "new_token_ids": new_token_ids, "logprobs": logprobs,
            "num_accepted": num_accepted, "num_drafted": num_drafted, "finished": finished,
            "finish_reason": finish_reason, "stats": stats,
        })
        return out


def commit_counts(
    new_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    remaining: torch.Tensor,
    eos_ids: torch.Tensor | None,
    active: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """How many of each row's `new_tokens [B, k]` are committed → (counts [B], hit_eos [B]).

    num_accepted [B]: drafts accepted (the row produced num_accepted + 1 tokens); remaining [B] (or a scalar):
    tokens the row may still generate; eos_ids: [E] shared by all rows, or [B, E] per row padded with -1,
    or None; active [B] bool: inactive rows commit nothing. A row's tokens are cut after its first EOS.
    """
    counts = torch.minimum(num_accepted + 1, remaining) * active
    if eos_ids is None or eos_ids.numel() == 0:
        return counts, torch.zeros_like(active)
    if eos_ids.dim() == 1:
        is_eos = torch.isin(new_tokens, eos_ids)
    else:
        is_eos = (new_tokens[:, :, None] == eos_ids[:, None, :]).any(-1)
    cols = torch.arange(new_tokens.shape[1], device=new_tokens.device)[None, :]
    is_eos &= cols < counts[:, None]
    hit_eos = is_eos.any(1)
    counts = torch.where(hit_eos, is_eos.long().argmax(1) + 1, counts)
    return counts, hit_eos


def step_counters(
    num_accepted: torch.Tensor, beta: torch.Tensor, draft_lengths: torch.Tensor | None, active: torch.Tensor,
    gamma: int,
) -> torch.Tensor:
    """Per-row acceptance counters of one step, `[B, StepCounts.width(γ)]` float64, still on the device.

    Position i (0-based) of a row is *reached* when it was drafted and its prefix is committed text
    (i <= n), and *accepted* when i < n. β (Σ min(p, q)) is summed over reached positions (Cor 3.6).
    """
    n = num_accepted * active
    lengths = draft_lengths if draft_lengths is not None else torch.full_like(n, gamma)
    lengths = lengths * active
    pos = torch.arange(gamma, device=n.device)[None, :]
    drafted = pos < lengths[:, None]
    reached = drafted & (pos <= n[:, None])
    accepted = pos < n[:, None]
    beta_sum = (beta.double() * reached).sum(1, keepdim=True) if gamma else n[:, None].double() * 0
    scalars = torch.stack([n, lengths, (lengths > 0).long(), active.long()], 1).double()
    return torch.cat([reached.double(), accepted.double(), beta_sum, scalars], 1)


@dataclass(frozen=True)
class StepCounts:
    """Host-side acceptance counters of one or more steps at draft length γ (see `step_counters`)."""

    gamma: int
    reached: tuple[int, ...]  # [γ] drafts verified at position i
    accepted: tuple[int, ...]  # [γ] drafts accepted at position i
    beta_sum: float  # Σ β over reached positions
    num_accepted: int  # Σ accepted drafts
    num_drafted: int  # Σ draft lengths
    drafting_rows: int  # row-steps with at least one draft
    active_rows: int  # row-steps of active rows

    _SCALARS = ("beta_sum", "num_accepted", "num_drafted", "drafting_rows", "active_rows")  # after the 2γ positions

    @staticmethod
    def width(gamma: int) -> int:
        return 2 * gamma + 5

    @classmethod
    def column(cls, name: str, gamma: int) -> int:
        """Where the scalar counter `name` sits in a row of `step_counters(..., γ)`."""
        return 2 * gamma + cls._SCALARS.index(name)

    @staticmethod
    def positions(name: str, gamma: int) -> slice:
        """Where the per-position counters `name` ("reached" or "accepted") sit in a row of `step_counters`."""
        return {"reached": slice(0, gamma), "accepted": slice(gamma, 2 * gamma)}[name]

    @staticmethod
    def widen(counters: torch.Tensor, gamma: int, to_gamma: int) -> torch.Tensor:
        """`step_counters` rows `[B, width(γ)]` laid out for a larger γ' `[B, width(γ')]` (positions γ..γ'-1 count
        zero), so that steps of different γ add up in one running sum (read back with `from_row(.., γ')`)."""
        if to_gamma == gamma:
            return counters
        if to_gamma < gamma:
            raise ValueError(f"to_gamma {to_gamma} is smaller than gamma {gamma}")
        pad = counters.new_zeros(counters.shape[0], to_gamma - gamma)
        return torch.cat([counters[:, :gamma], pad, counters[:, gamma : 2 * gamma], pad, counters[:, 2 * gamma :]], 1)

    def narrow(self, gamma: int) -> "StepCounts":
        """The same counts at a smaller γ (the positions from γ on must count nothing)."""
        if any(self.reached[gamma:]) or any(self.accepted[gamma:]):
            raise ValueError(f"gamma {gamma} drops positions that counted drafts")
        return replace(self, gamma=gamma, reached=self.reached[:gamma], accepted=self.accepted[:gamma])

    @classmethod
    def from_row(cls, values: list[float], gamma: int) -> "StepCounts":
        """From one row (or a column sum) of `step_counters`' output, read to the host."""
        if len(values) != cls.width(gamma):
            raise ValueError(f"expected {cls.width(gamma)} counters for γ={gamma}, got {len(values)}")
        beta_sum, n, drafted, drafting, active = values[2 * gamma :]
        return cls(
            gamma=gamma,
            reached=tuple(int(v) for v in values[:gamma]),
            accepted=tuple(int(v) for v in values[gamma : 2 * gamma]),
            beta_sum=float(beta_sum),
            num_accepted=int(n),
            num_drafted=int(drafted),
            drafting_rows=int(drafting),
            active_rows=int(active),
        )


class Clock:
    """Step timings: perf_counter on CPU; CUDA events on GPU (read after the step's one host sync)."""

    def __init__(self, device: torch.device, marks: int = 3):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)]
        else:
            self.times = [0.0] * marks

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def elapsed(self, i: int, j: int) -> float:
        if self.cuda:
            self.events[j].synchronize()
            return self.events[i].elapsed_time(self.events[j]) / 1000.0
        return self.times[j] - self.times[i]
