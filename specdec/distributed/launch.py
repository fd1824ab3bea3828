"""Joining the process group torchrun set up, and agreeing on what must be the same on every rank.

    device = init_tensor_parallel(2, "cpu")        # gloo on CPU, nccl on CUDA (one GPU per local rank)
    seed = shared_seed(None)                      # rank 0's fresh seed, on every rank
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["init_tensor_parallel", "shared_seed", "is_main_rank"]

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
