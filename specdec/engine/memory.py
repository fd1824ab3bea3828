"""What the engine's buffers cost, checked against the device's free memory before anything is allocated.

`EngineMemory` is the frozen record of the bytes an engine's construction implies (the target's KV cache, a cached
drafter's, the target features a feature head reads, the per-slot state); `check_fits` refuses a configuration
whose total exceeds what the device has free, in one line naming the options that size it. `available_memory`
reads that: on CPU `MemAvailable` of /proc/meminfo (the kernel's estimate of memory a new allocation can take
without swapping), on CUDA `torch.cuda.mem_get_info`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

__all__ = ["EngineMemory", "KVCacheUsage", "available_memory", "check_engine", "check_fits", "format_bytes"]

logger = logging.getLogger(__name__)


def available_memory(device: torch.device) -> int | None:
    """Bytes a new allocation on `device` can take now; None where it cannot be read (the check is then skipped)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # (kB)
    except (OSError, ValueError, IndexError):
        pass
    try:  # (no /proc: free physical pages, a lower bound of what the kernel could hand out)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class EngineMemory:
    """Bytes of the engine's buffers, by part (each 0 where the engine has none of it).

    target_kv   the target's K/V cache (every layer, slot and position, keys and values)
    drafter_kv  a cached drafter's K/V cache (a draft model or a feature head's layer)
    features    the target's hidden states per slot and position that a feature drafter reads
    state       the per-slot committed tokens and parameters (`slots.SlotState`)
    """

    target_kv: int
    drafter_kv: int = 0
    features: int = 0
    state: int = 0

    @property
    def total(self) -> int:
        return self.target_kv + self.drafter_kv + self.features + self.state

    def describe(self) -> str:
        parts = [("target KV", self.target_kv), ("drafter KV", self.drafter_kv), ("features", self.features),
                 ("slot state", self.state)]
        return ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)


def check_fits(memory: EngineMemory, device: torch.device, max_batch: int, num_positions: int,
               available=available_memory) -> None:
    """Raise a one-line ValueError when `memory.total` exceeds the bytes `available(device)` reports (the options
    that size it named, with the bytes needed and free); nothing is allocated yet. `available` is a parameter for
    tests (a function of the device → bytes or None)."""
    free = available(device)
    if free is None:
        logger.debug("free memory of %s unknown: the engine's %s are not checked", device, format_bytes(memory.total))
        return
    if memory.total > free:
        raise ValueError(
            f"the engine's buffers for max_batch_size={max_batch} (--max-batch-size) × {num_positions} positions "
            f"(max_seq_len / --max-seq-len, + the draft tokens a step writes) need {format_bytes(memory.total)} "
            f"({memory.total} bytes: {memory.describe()}), but {device.type} has {format_bytes(free)} ({free} "
            f"bytes) available; lower max_batch_size or max_seq_len")


def check_engine(cache, drafter_cache, feature_bytes: int, state, device: torch.device, max_batch: int,
                 num_positions: int) -> EngineMemory:
    """The engine's `EngineMemory` (its caches' `nbytes`, allocated or not; the stored features; the slot state),
    checked by `check_fits` against the memory free now plus the state's (already allocated: small)."""
    state_bytes = sum(t.numel() * t.element_size() for t in vars(state).values() if isinstance(t, torch.Tensor))
    memory = EngineMemory(cache.nbytes, drafter_cache.nbytes if drafter_cache is not None else 0, feature_bytes,
                          state_bytes)
    free = available_memory(device)
    check_fits(memory, device, max_batch, num_positions, available=lambda _: None if free is None else free + state_bytes)
    return memory


@dataclass(frozen=True)
class KVCacheUsage:
    """What the KV cache holds now. usage_perc: the fraction held, in [0, 1] (vLLM's `kv_cache_usage_perc`; paged:
    blocks, static: slots). Blocks are None for the static layout (and its preemptions 0)."""

    usage_perc: float
    num_blocks: int | None = None
    num_free_blocks: int | None = None
    num_used_blocks: int | None = None
    block_size: int | None = None
    num_preemptions: int = 0

    @classmethod
    def of(cls, pool, occupied_slots: int, max_batch: int) -> "KVCacheUsage":
        """From a `kv_pool.KVPool` (None: the static layout, `occupied_slots` of `max_batch`)."""
        if pool is None:
            return cls(occupied_slots / max_batch)
        a = pool.allocator
        return cls(a.usage, a.num_usable_blocks, a.num_free_blocks, a.num_used_blocks, pool.block_size,
                   pool.num_preemptions)
