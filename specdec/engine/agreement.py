"""What every tensor-parallel rank must decide alike, and the one broadcast that makes it rank 0's decision.

Under tensor parallelism every rank runs the same engine over its shard (`specdec.distributed`): the ranks' step
batches must be the same or the forwards' all-reduces do not match. Everything the scheduler decides from the
requests alone (admission, preemption, block tables, fixed draft caps) is the same on every rank; what the engine
decides from this rank's own clock is not — the "auto" prefill budget (`prefill.ChunkBudget`'s `agree`) and the
γ policy's choice when a step is "auto" (its measured step times; `policy.GammaPolicy`). `agree_choice` hands the
policy's γ and per-row caps to rank 0's on every rank: rank 0 schedules, the others follow.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["timed_choice", "agree_choice"]


def timed_choice(fixed: int | None, caps: Sequence[int | None] | None) -> bool:
    """Whether the policy's choice for this step may read the clock: the engine's default is "auto" (`fixed` None)
    and no row carries its own cap (`caps` None), or some row is "auto" (a None among `caps`). The same on every
    rank, so every rank takes part in the broadcast or none does."""
    return fixed is None if caps is None else None in caps


def agree_choice(agree: Callable[[Sequence[int]], tuple[int, ...]], gamma: int,
                 row_caps: Sequence[int] | None, rows: int) -> tuple[int, tuple[int, ...] | None]:
    """(γ, row caps) → rank 0's (γ, row caps), in one collective `agree` (`ShardedFastLlama.leader_ints`).

    row_caps: the policy's per-row verify caps for the `rows` running rows (`GammaPolicy.row_caps`), or None
    (unchanged). The message has a fixed length on every rank: [γ, has caps, cap_0 .. cap_{rows−1}]."""
    caps = tuple(row_caps[:rows]) if row_caps is not None else (0,) * rows
    if len(caps) != rows:
        raise ValueError(f"row caps for {len(caps)} rows, {rows} running")
    got = agree((int(gamma), int(row_caps is not None), *(int(c) for c in caps)))
    return got[0], (tuple(got[2:]) if got[1] else None)
