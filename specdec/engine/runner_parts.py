"""What a step shape (`step_runner.StepRunner`, `tree_step.TreeStepRunner`) runs over: the runner's parts, named.

A step shape reads and writes only these — the models, their caches, the slot state, the drafter, the static
per-slot tensors the verify pass reads (draft caps) and adds into (the engine-wide counter sums) — never the engine
or the scheduler: who runs is already in the slot state and the `StepInput`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StepParts"]


@dataclass
class StepParts:
    """The runner's tensors and models a step shape uses (see the module doc).

    model / cache: the target (`FastLlama`) and its slot cache (static or paged); drafter: the engine's drafter
    (None: plain decoding) and drafter_cached: whether it keeps its own slot cache; state: the `SlotState`;
    draft_caps `[max_batch]`: each slot's draft cap; counter_sums / tree_counter_sums `[width]`: the chain and
    token-tree steps' engine-wide acceptance counters; config: the `EngineConfig` (bitwise, synthetic_acceptance);
    cuda_graphs: whether steps are captured (the one flag
    that changes: `Runner.cuda_graphs`, a benchmark's eager pass); graph_pool: the CUDA graphs' shared memory pool (None off CUDA)."""

    model: object
    cache: object
    drafter: object
    drafter_cached: bool
    state: object
    draft_caps: torch.Tensor
    counter_sums: torch.Tensor
    tree_counter_sums: torch.Tensor
    config: object
    device: torch.device
    vocab_size: int
    max_draft_tokens: int
    cuda_graphs: bool
    graph_pool: object = None
