"""Run by test_tensor_parallel.py under `torchrun --nproc-per-node N` (N = 2 or 4): sharded generation on each rank.

argv: OUT.json TARGET_DIR... DRAFT_DIR; the device is $TP_DEVICE ("cpu": gloo, default; "cuda": nccl, fp32), the
all-reduce $TP_ALL_REDUCE ("auto", default; "group"; "one_shot": symmetric memory, CUDA). Rank 0 writes {target: {"greedy", "sampled", "kv_heads", "head_rows", "shard_model_same"}} and
whether every rank produced the same tokens.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)

import specdec  # noqa: E402
from specdec.distributed import (init_tensor_parallel, is_main_rank, load_sharded, shard_model,  # noqa: E402
                                 shutdown_tensor_parallel)

PROMPTS = [[5, 6, 7, 8, 9], [12, 3], [7, 7, 8, 9, 7, 7]]
MAX_NEW = 12


def run(target, drafter) -> dict:
    greedy = specdec.generate(target, PROMPTS, drafter, max_new_tokens=MAX_NEW, temperature=0, num_draft_tokens=3,
                              engine="fast", seed=0).sequences
    sampled = specdec.generate(target, PROMPTS, drafter, max_new_tokens=MAX_NEW, temperature=1.0, num_draft_tokens=3,
                               engine="fast", seed=11).sequences
    return {"greedy": greedy, "sampled": sampled, "kv_heads": target.shape.n_kv_heads,
            "head_rows": getattr(target, "vocab_parallel", False) and target.lm_head.shape[0]}


def main() -> None:
    from transformers import AutoModelForCausalLM

    out, *targets = sys.argv[1:]
    draft_dir = targets.pop()
    device = init_tensor_parallel(int(os.environ["WORLD_SIZE"]), os.environ.get("TP_DEVICE", "cpu"))
    all_reduce = os.environ.get("TP_ALL_REDUCE", "auto")
    expected = {"auto": "one_shot" if device.type == "cuda" else "group"}.get(all_reduce, all_reduce)
    drafter = AutoModelForCausalLM.from_pretrained(draft_dir, local_files_only=True).eval().to(device)
    results, models = {}, []
    for folder in targets:
        model = load_sharded(folder, device=device, dtype=torch.float32, all_reduce=all_reduce)
        assert model.all_reduce == expected, (model.all_reduce, expected)  # (GPUs of one host reach each other)
        models.append(model)
        results[folder] = run(model, drafter)
        # slicing a model in memory gives the same shard as reading the slices from safetensors
        sliced = shard_model(AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).to(device)).state_dict()
        results[folder]["shard_model_same"] = all(torch.equal(t, sliced[k]) for k, t in model.state_dict().items())
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if is_main_rank():
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"results": results, "ranks_agree": all(g == results for g in gathered),
                       "clean_shutdown": shutdown_tensor_parallel(*models)}, fh)
    else:
        shutdown_tensor_parallel(*models)


if __name__ == "__main__":
    main()
