"""One definition of what a step commits and counts, shared by every runner (eager loop, engine).

  commit rule   a row's step produced n+1 tokens (n accepted drafts, then the residual or bonus token);
                it keeps the first min(n+1, budget) of them, cut after its first EOS (`commit_counts`)
  counters      per row, per step: drafts verified/accepted at each position, Σβ, drafted, active
                (`step_counters` on the device → `StepCounts` on the host → `SpecStats.add_counts`)
  the record    every step body (eager loop, engine, token trees) packs what its step did into ONE int64
                device → host table (`pack_step`, laid out by `StepLayout`) and reads it back as ONE named
                `StepRecord` (`StepRecord.unpack`), which `SpecStats.add_step` folds into the statistics
  results       `GenerateResult` (per-prompt tokens + stats) and `TokenEvent` (what one step committed)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from specdec.core import INVALID_SCORES
from specdec.core.proposals import InvalidProposal, describe_violation
from specdec.metrics import SpecStats

__all__ = ["GenerateResult", "GenerationStream", "RequestOutput", "TokenEvent", "StepCounts", "StepLayout",
           "StepRecord", "commit_counts", "step_counters", "pack_step"]


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
    # per entry of `rows`: that row's acceptance counters in this step (the eager loop and token trees; None
    # from the engine, which keeps its counters on the device)
    counts: list["StepCounts"] | None = None

    @classmethod
    def of(cls, record: "StepRecord", step: int, callers: list[int], outputs: list[list[int]]) -> "TokenEvent":
        """The event of a step whose row i is the caller's row `callers[i]`; appends each row's committed tokens
        to `outputs[callers[i]]` (the loops' running results)."""
        rows, tokens, counts, done = [], [], [], []
        for i, (caller, committed) in enumerate(zip(callers, record.tokens)):
            if committed:
                outputs[caller].extend(committed)
                rows.append(caller)
                tokens.append(committed)
                counts.append(record.row_counts[i] if record.row_counts is not None else None)
            if record.finished[i]:
                done.append(caller)
        return cls(step, rows, tokens, done, counts if record.row_counts is not None else None)


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
    #: per new token, the `SamplingParams.top_logprobs` most likely (token id, log p) of the target's raw law
    top_logprobs: list[list[tuple[int, float]]] | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held at admission (vLLM's name; the final output)

    @classmethod
    def make(cls, request_id: str, new_token_ids: list[int], logprobs: list[float] | None, num_accepted: int,
             num_drafted: int, finished: bool = False, finish_reason: str | None = None,
             stats: SpecStats | None = None, top_logprobs=None, num_cached_tokens: int = 0) -> "RequestOutput":
        """The same frozen object as `RequestOutput(...)`, built without the dataclass `__init__`'s one
        `object.__setattr__` per field (the engine builds one per running request per step)."""
        out = object.__new__(cls)
        object.__setattr__(out, "__dict__", {
            "request_id": request_id, "new_token_ids": new_token_ids, "logprobs": logprobs,
            "num_accepted": num_accepted, "num_drafted": num_drafted, "finished": finished,
            "finish_reason": finish_reason, "stats": stats, "top_logprobs": top_logprobs,
            "num_cached_tokens": num_cached_tokens,
        })
        return out


def commit_counts(new_tokens: torch.Tensor, num_accepted: torch.Tensor, remaining: torch.Tensor,
                  eos_ids: torch.Tensor | None, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    has_beta: bool = True  # β was measured (token trees: no single-draft β, so α stays undefined)

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
    def from_row(cls, values: list[float], gamma: int, has_beta: bool = True) -> "StepCounts":
        """From one row (or a column sum) of `step_counters`' output, read to the host."""
        if len(values) != cls.width(gamma):
            raise ValueError(f"expected {cls.width(gamma)} counters for γ={gamma}, got {len(values)}")
        beta_sum, n, drafted, drafting, active = values[2 * gamma :]
        return cls(gamma=gamma, reached=tuple(int(v) for v in values[:gamma]),
                   accepted=tuple(int(v) for v in values[gamma : 2 * gamma]), beta_sum=float(beta_sum),
                   num_accepted=int(n), num_drafted=int(drafted), drafting_rows=int(drafting),
                   active_rows=int(active), has_beta=has_beta)

    @classmethod
    def total(cls, rows: "list[StepCounts]", gamma: int, has_beta: bool = True) -> "StepCounts":
        """The sum of several rows' counters at the same γ."""
        return cls(
            gamma=gamma,
            reached=tuple(sum(r.reached[i] for r in rows) for i in range(gamma)),
            accepted=tuple(sum(r.accepted[i] for r in rows) for i in range(gamma)),
            beta_sum=sum(r.beta_sum for r in rows),
            num_accepted=sum(r.num_accepted for r in rows),
            num_drafted=sum(r.num_drafted for r in rows),
            drafting_rows=sum(r.drafting_rows for r in rows),
            active_rows=sum(r.active_rows for r in rows),
            has_beta=has_beta,
        )


@dataclass(frozen=True)
class StepLayout:
    """The columns of one step's device → host table (`pack_step` writes it, `StepRecord.unpack` reads it).

    int64 `[B + 1, width]`; k = γ + 1 (trees: depth + 1) token columns:
      rows 0..B−1  tokens [k] | committed | accepted | drafted | finished | hit_eos
                   | counters [StepCounts.width(γ)] (float64 bits, with `counters`) | logprobs [k] (float64 bits,
                   with `logprobs`) | top ids [k · N] | top log p [k · N] (float64 bits; N = `top_logprobs`)
      row B        invalid logits? | Σ produced (accepted + 1 per active row) | Σ committed | Σ finished
                   | 1 + the first row with an invalid proposal, its bits (`core.proposals`; 0 0 = none or unchecked) | 0 …
    `accepted` is the drafts verification accepted (before any EOS / budget cut), `drafted` the row's draft
    length; both 0 for an inactive row.
    """

    gamma: int
    counters: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # N alternatives per token (needs logprobs)
    drafter: str = "drafter"  # who proposed, named by an invalid proposal's error
    # derived once (the engine reads a table every step): token columns, where each block starts, the width
    k: int = field(init=False)
    counters_at: int = field(init=False)
    logprobs_at: int = field(init=False)
    top_at: int = field(init=False)
    width: int = field(init=False)

    def __post_init__(self) -> None:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("StepLayout: top_logprobs needs logprobs")
        k = self.gamma + 1
        logprobs_at = k + 5 + (StepCounts.width(self.gamma) if self.counters else 0)
        top_at = logprobs_at + (k if self.logprobs else 0)
        for name, value in (("k", k), ("counters_at", k + 5), ("logprobs_at", logprobs_at), ("top_at", top_at),
                            ("width", top_at + 2 * k * self.top_logprobs)):
            object.__setattr__(self, name, value)


def pack_step(
    layout: StepLayout,
    new_tokens: torch.Tensor,
    committed: torch.Tensor,
    accepted: torch.Tensor,
    drafted: torch.Tensor | None,
    finished: torch.Tensor,
    hit_eos: torch.Tensor,
    active: torch.Tensor,
    invalid: torch.Tensor,
    *,
    counters: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
    proposal: torch.Tensor | None = None,
) -> torch.Tensor:
    """One step's device → host table, int64 `[B + 1, layout.width]` (see `StepLayout`), built on the device.

    new_tokens [B, k] (k = layout.k); committed, accepted [B] int64; drafted [B] int64 or None (= γ for every
    row); finished, hit_eos, active [B] bool; invalid: a bool scalar (NaN / +inf in the target logits);
    counters [B, StepCounts.width(γ)] float64 (`step_counters`), with layout.counters; logprobs [B, k]
    float, with layout.logprobs; top: (ids [B, k, N] long, log p [B, k, N] float), with layout.top_logprobs = N;
    proposal: `core.proposals.proposal_check`'s [2] (None = unchecked).
    """
    b, k = new_tokens.shape
    if k != layout.k or (counters is not None) != layout.counters or (logprobs is not None) != layout.logprobs:
        raise ValueError(f"pack_step: the tensors ([{b}, {k}] tokens, counters={counters is not None}, "
                         f"logprobs={logprobs is not None}) do not match {layout}")
    active_long = active.long()
    accepted = accepted * active_long
    drafted = (drafted if drafted is not None else torch.full_like(accepted, layout.gamma)) * active_long
    columns = [new_tokens, committed[:, None], accepted[:, None], drafted[:, None], finished[:, None].long(),
               hit_eos[:, None].long()]
    if counters is not None:
        columns.append(counters.double().view(torch.long))
    if logprobs is not None:
        columns.append(logprobs.double().view(torch.long))
    if (top is not None) != bool(layout.top_logprobs):
        raise ValueError(f"pack_step: top={top is not None} does not match {layout}")
    if top is not None:
        ids, values = top
        columns += [ids.reshape(b, -1).long(), values.double().reshape(b, -1).view(torch.long)]
    table = torch.cat(columns, 1)
    tail = torch.stack([invalid.long().reshape(()), (accepted + active_long).sum(), committed.sum(), finished.sum()])
    checked = proposal if proposal is not None else tail.new_zeros(2)
    tail = torch.cat([tail, checked.long(), tail.new_zeros(table.shape[1] - 6)])
    return torch.cat([table, tail[None]])


def _floats(bits: list[int]) -> list[float]:
    """float64 values from their int64 bit patterns (as `pack_step` stores them)."""
    return list(struct.unpack(f"<{len(bits)}d", struct.pack(f"<{len(bits)}q", *bits)))


@dataclass(frozen=True)
class StepRecord:
    """What one step did, on the host: one entry per row of the step body's batch [B], plus totals.

    Every step body emits it (`StepRecord.unpack` of its `pack_step` table) and `SpecStats.add_step` folds it.
    """

    gamma: int  # drafts per row (token trees: the tree's depth; 0 = a plain step)
    tokens: list[list[int]]  # [B] tokens committed per row (cut after EOS / at the budget)
    num_accepted: list[int]  # [B] drafts accepted by verification, before the cut (inactive rows: 0)
    num_drafted: list[int]  # [B] the row's draft length (inactive rows: 0)
    finished: list[int]  # [B] 1 = the row finished in this step
    hit_eos: list[int]  # [B] 1 = it finished on an EOS token
    logprobs: list[list[float]] | None  # [B] log p(token) of the committed tokens, when asked for
    row_counts: tuple[StepCounts, ...] | None  # [B] acceptance counters per row; None = kept on the device
    counts: StepCounts | None  # their sum over the rows (None as row_counts)
    num_committed: int  # Σ committed tokens
    num_produced: int  # Σ over active rows of accepted + 1 (τ's numerator, before cuts)
    num_finished: int
    drafter_calls: int = 0  # drafter forward passes in this step
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    #: [B] per committed token its N most likely (token id, log p), with layout.top_logprobs = N
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None

    @classmethod
    def unpack(cls, packed: torch.Tensor, layout: StepLayout, *, drafter_calls: int = 0, draft_time_s: float = 0.0,
               verify_time_s: float = 0.0, has_beta: bool = True, callers: list | None = None) -> "StepRecord":
        """Read `pack_step`'s table (on any device: this is the step's one synchronization); raises on invalid
        target logits and (`core.proposals.InvalidProposal`) an invalid proposal, naming `layout.drafter` and the
        row (`callers[i]`: the caller's name of step row i). `has_beta=False`: the counters carry no β (token trees)."""
        shape = packed.shape
        if len(shape) != 2 or shape[1] != layout.width or packed.dtype is not torch.long:
            raise ValueError(f"StepRecord.unpack: expected an int64 [B + 1, {layout.width}] table for {layout}, "
                             f"got {packed.dtype} {tuple(shape)}")
        k = layout.k
        if layout.logprobs:
            packed = packed.cpu()
            at = layout.logprobs_at
            rows = packed[:-1, :at].tolist()
            logprobs = packed[:-1, at : at + k].view(torch.float64).tolist()
            tail = packed[-1, :6].tolist()
            top = None
            if layout.top_logprobs:
                n, at = layout.top_logprobs, layout.top_at
                ids = packed[:-1, at : at + k * n].reshape(-1, k, n).tolist()
                values = packed[:-1, at + k * n : at + 2 * k * n].view(torch.float64).reshape(-1, k, n).tolist()
                top = [[list(zip(i, v)) for i, v in zip(row_ids[: row[k]], row_values)]
                       for row_ids, row_values, row in zip(ids, values, rows)]
        else:
            rows = packed.tolist()
            tail = rows.pop()
            logprobs = top = None
        if tail[0]:
            raise ValueError(f"target logits {INVALID_SCORES}")
        if tail[4]:
            row = tail[4] - 1
            raise InvalidProposal(describe_violation(layout.drafter, callers[row] if callers is not None else row, tail[5]))
        tokens = [row[: row[k]] for row in rows]
        accepted, drafted = [row[k + 1] for row in rows], [row[k + 2] for row in rows]
        if tail[3]:  # some rows finished
            finished, hit_eos = [row[k + 3] for row in rows], [row[k + 4] for row in rows]
        else:
            finished = hit_eos = [0] * len(rows)
        if logprobs is not None:
            logprobs = [lp[: row[k]] for lp, row in zip(logprobs, rows)]
        row_counts = counts = None
        if layout.counters:
            at, width = layout.counters_at, StepCounts.width(layout.gamma)
            row_counts = tuple(StepCounts.from_row(_floats(row[at : at + width]), layout.gamma, has_beta)
                               for row in rows)
            counts = StepCounts.total(list(row_counts), layout.gamma, has_beta)
        out = object.__new__(cls)  # the frozen record without the dataclass __init__'s per-field setattr
        object.__setattr__(out, "__dict__", {
            "gamma": layout.gamma, "tokens": tokens, "num_accepted": accepted, "num_drafted": drafted,
            "finished": finished, "hit_eos": hit_eos, "logprobs": logprobs, "row_counts": row_counts,
            "counts": counts, "num_committed": tail[2], "num_produced": tail[1], "num_finished": tail[3],
            "drafter_calls": drafter_calls, "draft_time_s": draft_time_s, "verify_time_s": verify_time_s,
            "top_logprobs": top,
        })
        return out
