"""A request as the engine tracks it, from `add_request` until it finishes: what the scheduler decides over (its
lengths, slot, prefill progress) and reports (its statistics). Plain data: the scheduler and the runner both read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.engine.drafters import Flavor
from specdec.metrics import SpecStats
from specdec.request import SamplingParams

__all__ = ["EngineRequest"]


@dataclass
class EngineRequest:
    """A request as the engine tracks it, from `add_request` until it finishes."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    seed: int
    arrival: float
    length: int = 0  # committed tokens (prompt + generated), as the host knows them
    draft_valid: int = 0  # positions below this are in the drafter's cache
    stats: SpecStats = field(default_factory=SpecStats)
    flavor: Flavor | None = None  # what this request asks of a step (`Flavor.of(params)`)
    admitted_at: tuple = (0, 0, 0)  # the engine's (steps, speculative steps, drafter passes) when it joined
    constraint: object | None = None  # its `core.processors.TokenConstraint`, started at admission
    slot: int = -1  # while filling (`engine.prefill`): its slot; running requests' slot is their index
    prefilled: int = 0  # while filling: prompt positions in the target's cache
    fed_by: int = 0  # while filling, with `prefill_steps`: the engine step by which its prompt is fed in full
    generated_before: int = 0  # tokens it generated before a preemption (paged pool): now the tail of `prompt`
    num_cached_tokens: int = 0  # prompt positions found in the prefix cache at admission (not prefilled)
    prefix: object | None = None  # its `prefix_cache.RequestBlocks` (enable_prefix_caching)
