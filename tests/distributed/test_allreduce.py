"""The all-reduce kinds of tensor parallelism: names checked before anything allocates, CPU refused for one-shot.

(The kinds' sums are proven by tokens: test_tensor_parallel.py runs "group" on gloo in CI and both kinds on 2 and
4 GPUs, GPU-marked.)
"""

from __future__ import annotations

import pytest
import torch

from specdec.distributed.allreduce import (ALL_REDUCE_KINDS, OneShotAllReduce, check_all_reduce, make_all_reduce,
                                           resolve_all_reduce)
from specdec.fast.model import LlamaShape

SHAPE = LlamaShape(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64)


def test_kinds_are_named_in_the_error():
    assert ALL_REDUCE_KINDS == ("auto", "group", "one_shot")
    for kind in ALL_REDUCE_KINDS:
        assert check_all_reduce(kind) == kind
    with pytest.raises(ValueError, match="all_reduce must be one of 'auto', 'group', 'one_shot', got 'nccl'"):
        check_all_reduce("nccl")
    with pytest.raises(ValueError, match="all_reduce must be one of"):
        make_all_reduce("ring")


def test_one_shot_refuses_cpu_and_bad_sizes_before_touching_a_group():
    with pytest.raises(ValueError, match="all_reduce='one_shot' needs CUDA devices"):
        OneShotAllReduce(device=torch.device("cpu"), dtype=torch.float32)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="max_bytes must be an integer >= 1024"):
            OneShotAllReduce(device=torch.device("cuda"), dtype=torch.float32, max_bytes=16)


def test_sharded_model_and_loader_check_the_kind_first(tmp_path):
    from specdec.distributed import ShardedFastLlama, load_sharded

    with pytest.raises(ValueError, match="all_reduce must be one of"):  # before the group check
        ShardedFastLlama(SHAPE, all_reduce="fast")
    with pytest.raises(ValueError, match="all_reduce must be one of"):  # before reading the folder
        load_sharded(tmp_path / "missing", all_reduce="fast")


def test_auto_is_the_group_all_reduce_on_cpu_and_leaves_named_kinds_alone():
    assert resolve_all_reduce("auto", device="cpu") == "group"  # no collective needed: gloo has no one-shot
    assert resolve_all_reduce("one_shot", device="cpu") == "one_shot"  # (refused later, by OneShotAllReduce)
    assert resolve_all_reduce("group", device="cuda") == "group"
    with pytest.raises(ValueError, match="all_reduce must be one of"):
        resolve_all_reduce("fast", device="cpu")
