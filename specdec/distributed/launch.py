"""Joining the process group torchrun set up, and agreeing on what must be the same on every rank.

    with tensor_parallel(2, "cuda") as device:   # gloo on CPU, nccl on CUDA (one GPU per local rank)
        seed = shared_seed(None, device)          # rank 0's fresh seed, on every rank
        ...                                       # torn down on exit: engines released, group destroyed

Teardown order matters on NCCL: the engine's CUDA graphs captured the all-reduces, and a communicator that
graphs still reference cannot be destroyed, so `shutdown_tensor_parallel` releases the models' cached
engines first, synchronizes, then destroys the group — in a helper thread with a deadline, so a broken peer
turns into a logged error instead of a process that ignores Ctrl-C.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = ["init_tensor_parallel", "shutdown_tensor_parallel", "tensor_parallel", "shared_seed", "is_main_rank"]

logger = logging.getLogger(__name__)

_SEED_LIMIT = 1 << 63


def init_tensor_parallel(tensor_parallel_size: int, device: str | torch.device = "cpu") -> torch.device:
    """Join torchrun's process group (env:// rendezvous); returns this rank's device.

    ValueError unless the process runs under torchrun with WORLD_SIZE == tensor_parallel_size, or when a
    CUDA rank has no GPU of its own (LOCAL_RANK >= the GPU count).
    """
    world = os.environ.get("WORLD_SIZE")
    if world is None or "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size} needs a launch by torchrun "
                         f"(torchrun --nproc-per-node {tensor_parallel_size} -m specdec ...)")
    if int(world) != tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size} must equal torchrun's world size ({world}): "
                         f"launch with torchrun --nproc-per-node {tensor_parallel_size}")
    device = torch.device(device)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"local rank {local} has no GPU of its own ({torch.cuda.device_count()} visible)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
    return device


def shared_seed(seed: int | None, device: str | torch.device = "cpu", group=None) -> int:
    """`seed` if given (every rank passes the same), else rank 0's fresh random seed broadcast to all ranks."""
    if seed is not None:
        return seed
    value = torch.tensor([int.from_bytes(os.urandom(8), "little") % _SEED_LIMIT], dtype=torch.long, device=device)
    dist.broadcast(value, src=0, group=group)
    return int(value.item())


def is_main_rank(group=None) -> bool:
    """True on rank 0 (and when no process group is running)."""
    return not dist.is_initialized() or dist.get_rank(group) == 0


def shutdown_tensor_parallel(*models, timeout_s: float = 60.0) -> bool:
    """Release `models`' cached engines, then destroy the process group; False if that missed `timeout_s`.

    Every rank must call it (the destroy is collective on NCCL). Safe to call when no group is running.
    """
    from specdec.engine.generate import release_engines

    for model in models:
        release_engines(model)
    gc.collect()  # the graphs die with their engines; nothing else may still reference a captured collective
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if not dist.is_initialized():
        return True
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    worker = threading.Thread(target=destroy, name="specdec-tp-teardown", daemon=True)
    worker.start()
    worker.join(timeout_s)  # interruptible: Ctrl-C reaches the main thread while it waits
    if not done.is_set():
        logger.error("tensor parallel: destroy_process_group did not finish in %.0f s (a peer rank is gone?)",
                     timeout_s)
        return False
    return True


@contextlib.contextmanager
def tensor_parallel(tensor_parallel_size: int, device: str | torch.device = "cpu", *,
                    models: list | None = None, timeout_s: float = 60.0) -> Iterator[torch.device]:
    """`init_tensor_parallel`, then `shutdown_tensor_parallel` on exit (also on errors and Ctrl-C).

    Append the models the body builds to `models` (a list you own) so their engines are released first.
    """
    device = init_tensor_parallel(tensor_parallel_size, device)
    try:
        yield device
    finally:
        shutdown_tensor_parallel(*(models or ()), timeout_s=timeout_s)
