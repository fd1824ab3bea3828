"""Start-up capture of a runner's decode graphs: every shape the traffic can reach, within a bound.

The engine captures one CUDA graph pair per (batch bucket, γ, length bucket, flavor) the first time a step has
that shape; a capture of a 24-layer model costs ~0.1 s, which a request in flight sees as one long gap. So
`LLM` captures ahead of traffic (as vLLM does) through `Engine.warmup`:

  batch buckets  every bucket a running batch of 1..max_batch_size rows falls in (a max_batch_size that is no
                 bucket, e.g. 48, still reaches the next one: 64, cut at 48 rows)
  γ              the runner's: its default fixed γ and 0 (plain requests share the engine), or every γ "auto" may
                 pick (0 among them); a request's other fixed γ runs in the smallest built shape above it
  length buckets 64, 128, ... up to the context (prompt + generated + γ + 2 positions; `config.length_buckets`)
  flavors        T = 0 (greedy) and T > 0 without top-k / top-p / logprobs (what `Engine.warmup` covers)
  mixed steps    with the mixed step on: those batch buckets, γ's and flavors at every graphed chunk-token
                 bucket (`engine.mixed_shapes.mixed_keys`), counted in the plan beside the decode shapes

Bound: at most `MAX_WARMUP_SHAPES` decode shapes per runner (512 ≈ 1 min at 0.1 s each). Past it the longest length
buckets are left out; requests that reach them, and top-k / top-p / logprobs flavors, capture on first use.
`graph_captures(runner)` counts the captured shapes (the server exports it as `specdec:graph_captures_total`),
so a benchmark can show that no capture happened while it was timed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from specdec.engine.config import BATCH_BUCKETS, length_buckets
from specdec.engine.mixed_shapes import graph_buckets

logger = logging.getLogger(__name__)

__all__ = ["MAX_WARMUP_SHAPES", "WarmupPlan", "plan_warmup", "warm_up", "graph_captures", "step_shapes",
           "step_shapes_run", "cache_bytes"]

#: the most decode step shapes one runner captures at start-up
MAX_WARMUP_SHAPES = 512
#: the engine's smallest length bucket (positions), doubled up to its cache size
FIRST_LENGTH_BUCKET = 64
WARMUP_TEMPERATURES = (0.0, 1.0)


@dataclass(frozen=True)
class WarmupPlan:
    """The shapes `Engine.warmup` is asked to capture: batch sizes × γ's × length buckets × temperatures decode
    shapes, and (the mixed step on) batch sizes × γ's × flavors × graphed token buckets mixed ones."""

    batch_sizes: tuple[int, ...]  # one per batch bucket (the bucket itself, or max_batch_size for the last)
    gammas: tuple[int, ...]
    num_length_buckets: int
    max_length: int | None  # passed to `Engine.warmup`; None = every length bucket
    temperatures: tuple[float, ...] = WARMUP_TEMPERATURES
    complete: bool = True  # False when the bound left length buckets out
    num_token_buckets: int = 0  # the mixed step's graphed chunk-token buckets (0: the mixed step is off)

    @property
    def num_decode_shapes(self) -> int:
        return len(self.batch_sizes) * len(self.gammas) * self.num_length_buckets * len(self.temperatures)

    @property
    def num_mixed_shapes(self) -> int:  # (one per flavor: greedy or sampled, as `Engine.warmup` builds them)
        flavors = len({t == 0 for t in self.temperatures})
        return len(self.batch_sizes) * len(self.gammas) * flavors * self.num_token_buckets

    @property
    def num_shapes(self) -> int:
        return self.num_decode_shapes + self.num_mixed_shapes


def plan_warmup(max_batch_size: int, gammas, num_positions: int, max_draft_tokens: int,
                max_shapes: int = MAX_WARMUP_SHAPES, temperatures=WARMUP_TEMPERATURES, config=None) -> WarmupPlan:
    """Every shape a runner of `max_batch_size` rows, these γ's and `num_positions` cache positions can reach,
    with the longest length buckets left out when the decode shapes exceed `max_shapes` (at least one is kept);
    `config`: the engine's resolved `EngineConfig`, whose mixed step (on) adds its graphed token buckets."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_shapes < 1:
        raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
    buckets = sorted({next(b for b in BATCH_BUCKETS if b >= s) for s in (*BATCH_BUCKETS, max_batch_size)
                      if s <= max_batch_size})
    sizes = tuple(min(b, max_batch_size) for b in buckets)
    gammas = tuple(sorted(set(gammas)))
    temperatures = tuple(temperatures)
    every = len(length_buckets(num_positions))
    per_bucket = len(sizes) * len(gammas) * len(temperatures)
    kept = max(1, min(every, max_shapes // per_bucket))
    tokens = len(graph_buckets(config)) if config is not None and config.mixed_step is True else 0
    if kept == every:
        return WarmupPlan(sizes, gammas, every, None, temperatures, num_token_buckets=tokens)
    covered = length_buckets(num_positions)[kept - 1]  # positions of the largest kept bucket
    max_length = max(1, covered - max_draft_tokens - 2)  # the engine's limit: max_length + max_draft_tokens + 2
    return WarmupPlan(sizes, gammas, kept, max_length, temperatures, complete=False, num_token_buckets=tokens)


def runner_gammas(engine) -> tuple[int, ...]:
    """The γ's the engine's steps run: its fixed default γ and 0 (plain requests), or 0 and every candidate under
    "auto"."""
    policy = engine.policy
    if policy.fixed is not None or not policy.candidates:
        return tuple(sorted({0, policy.fixed or 0}))
    return tuple(sorted({0, *policy.candidates}))


def warm_up(engine, max_batch_size: int, max_shapes: int = MAX_WARMUP_SHAPES, extra_gammas=()) -> dict:
    """Capture the plan's shapes on `engine` (the γ's its policy can pick, and `extra_gammas`: fixed γ's it will
    be switched to) → a report {shapes, seconds, complete, max_length, ...}."""
    config = getattr(getattr(engine, "runner", None), "config", None)  # (resolved: whether the mixed step is on)
    plan = plan_warmup(max_batch_size, {*runner_gammas(engine), *extra_gammas}, engine.num_positions,
                       engine.max_draft_tokens, max_shapes, config=config)
    max_length = None if plan.max_length is None else min(plan.max_length, engine.max_seq_len)
    start = time.perf_counter()
    what = f"warm-up γ {'/'.join(map(str, plan.gammas))}"
    logger.info("%s: capturing %d decode step shapes (batch sizes %s, %d length buckets, T=0 and T>0) and %d mixed "
                "ones", what, plan.num_decode_shapes, list(plan.batch_sizes), plan.num_length_buckets,
                plan.num_mixed_shapes)

    def progress(done: int, total: int) -> None:  # DEBUG records: `specdec serve` draws them as a progress bar
        logger.debug(what, extra={"progress": (done, total)})

    built = engine.warmup(batch_sizes=plan.batch_sizes, gammas=plan.gammas, max_length=max_length,
                          temperatures=plan.temperatures, progress=progress)
    return {"shapes": int(built), "planned": plan.num_shapes, "mixed_shapes": plan.num_mixed_shapes,
            "seconds": time.perf_counter() - start, "complete": plan.complete, "max_length": max_length, "batch_sizes": list(plan.batch_sizes),
            "gammas": list(plan.gammas), "length_buckets": plan.num_length_buckets,
            "captured": graph_captures(engine)}


def step_shapes(runner) -> int:
    """Distinct decode step shapes the runner has built (eager or captured; 0 for the fallback runner)."""
    return len(getattr(runner, "_steps", None) or {})


def graph_captures(runner) -> int:
    """CUDA graph pairs the runner has captured (read-only: the engine keeps its step shapes in `_steps`)."""
    steps = getattr(runner, "_steps", None) or {}
    return sum(1 for step in list(steps.values()) if getattr(step, "_verify_graph", None) is not None)


def step_shapes_run(runner) -> int:
    """Step shapes that have run at least once (a warm-up capture does not run a shape: its first replay does)."""
    steps = getattr(runner, "_steps", None) or {}
    return sum(1 for step in list(steps.values()) if getattr(step, "ran", False))


def cache_bytes(runner) -> int:
    """Bytes of K/V cache the runner holds: the target's and a cached drafter's (0 for the fallback runner)."""
    caches = (getattr(runner, "cache", None), getattr(getattr(runner, "drafter", None), "cache", None))
    return sum(int(getattr(c, "nbytes", 0) or 0) for c in caches)
