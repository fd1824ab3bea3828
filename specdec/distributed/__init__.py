"""Tensor parallelism on torch.distributed: the fast model sharded across the ranks of a process group.

  sharded.py  `ShardedFastLlama` (Megatron-style column/row-parallel layers), `load_sharded` (each rank reads
              only its safetensors slices), `shard_model` (slices a model in memory)
  launch.py   joining torchrun's process group (gloo on CPU, nccl on CUDA) and leaving it (engines released,
              then the group destroyed, with a deadline), a seed shared by all ranks

The engine runs a `ShardedFastLlama` unchanged (`specdec.generate(model, ..., engine="fast")` on every rank);
the drafter is replicated on every rank.
"""

from specdec.distributed.launch import (init_tensor_parallel, is_main_rank, shared_seed, shutdown_tensor_parallel,
                                        tensor_parallel)
from specdec.distributed.sharded import ShardedFastLlama, load_sharded, shard_model, shard_shape

__all__ = ["ShardedFastLlama", "load_sharded", "shard_model", "shard_shape", "init_tensor_parallel",
           "shutdown_tensor_parallel", "tensor_parallel", "shared_seed", "is_main_rank"]
