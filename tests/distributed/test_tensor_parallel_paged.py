"""The engine's paged pool under tensor parallelism on CPU: 2 gloo ranks give one process's tokens exactly (fp32).

One workload (`tp_paged_worker.traffic`): a pool of 16 blocks that forces preemptions, prefix caching on with a
shared prompt prefix, requests of draft caps 0 / 2 / 3 in the same steps, greedy and seeded sampling, arrivals while
others run. Every rank runs the same engine on its shard; the ranks must agree, and match one unsharded process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from specdec.fast.model import FastLlama

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

WORKER = Path(__file__).with_name("tp_paged_worker.py")


def _worker():
    sys.path.insert(0, str(WORKER.parent))
    try:
        import tp_paged_worker
        from test_tensor_parallel import _torchrun
    finally:
        sys.path.remove(str(WORKER.parent))
    return tp_paged_worker, _torchrun


@pytest.fixture(scope="module")
def checkpoints(ckpt):
    """conftest's tiny pair: a 2-layer Llama (seed 0) and a 1-layer draft (seed 1)."""
    return {"llama": str(ckpt / "target"), "draft": str(ckpt / "draft")}


def _one_process(worker, checkpoints, **overrides) -> dict:
    drafter = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["draft"]).eval()
    target = FastLlama.from_hf(checkpoints["llama"], device="cpu", dtype=torch.float32)
    return worker.traffic(target, drafter, worker.pool_bytes(target, drafter), **overrides)


def test_two_ranks_paged_pool_match_one_process(checkpoints, tmp_path):
    worker, torchrun = _worker()
    out = tmp_path / "out.json"
    torchrun(str(WORKER), str(out), checkpoints["llama"], checkpoints["draft"], nproc=2)
    got = json.loads(out.read_text())
    assert got["ranks_agree"] and got["clean_shutdown"]
    ref = _one_process(worker, checkpoints)
    result = got["result"]
    assert result["kv_heads"] == 1 and ref["kv_heads"] == 2  # each rank holds (and caches) one of two kv heads
    assert result["tokens"] == ref["tokens"]
    assert len(result["tokens"]) == len(worker.REQUESTS)
    assert all(len(t) == worker.MAX_NEW for t in result["tokens"].values())
    # the workload exercises what it claims: preemptions from the small pool, hits on the shared prefix
    assert result["preemptions"] == ref["preemptions"] > 0
    assert result["prefix_hits"] == ref["prefix_hits"] > 0
    # a pool sized from each rank's own free memory (16 blocks' worth on rank 0, 32 on rank 1) is one pool: the
    # smallest (ranks that sized theirs apart would preempt apart and hang in the next all-reduce)
    assert result["blocks_from_a_fraction"] == 15  # (16 blocks, the null block not counted)


def test_two_ranks_auto_gamma_run_rank_zeros_choice(checkpoints, tmp_path):
    """The "auto" γ policy under TP (`engine.agreement`): each rank's policy chooses from its own clock, so the
    engine runs rank 0's γ and per-row caps on every rank. Scripted apart (rank 0 and rank 1 choose differently at
    every decision), the ranks agree and give one process's tokens under rank 0's script — and rank 1's script in
    one process gives other tokens (the negative control: the choice the ranks run is rank 0's, not a γ-blind
    comparison); the real timed policy on both ranks agrees too, greedy rows = one process's."""
    worker, torchrun = _worker()
    out = tmp_path / "out.json"
    torchrun(str(WORKER), str(out), checkpoints["llama"], checkpoints["draft"], "auto", nproc=2)
    got = json.loads(out.read_text())
    assert got["ranks_agree"] and got["clean_shutdown"]
    tp = got["result"]
    assert got["budgets"][1] > 0  # rank 1 asked for other choices than it ran
    assert tp["agreed"] and any(a[1] for a in tp["agreed"])  # (decisions broadcast, some with per-row caps)
    drafter = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["draft"]).eval()
    target = FastLlama.from_hf(checkpoints["llama"], device="cpu", dtype=torch.float32)
    pool = worker.pool_bytes(target, drafter)
    runs = {}
    for rank in (0, 1):
        patch, restore = worker.scripted_policy(worker.SCRIPTS[rank])
        patch()
        try:
            runs[rank] = worker.traffic(target, drafter, pool, worker.AUTO_REQUESTS, **worker.AUTO)
        finally:
            restore()
    assert tp["scripted"]["tokens"] == runs[0]["tokens"]
    sampled = [str(i) for i, r in enumerate(worker.AUTO_REQUESTS) if r[2] > 0]
    assert any(runs[1]["tokens"][i] != runs[0]["tokens"][i] for i in sampled)
    assert tp["timed_agreed"]  # the real policy's choices were broadcast as well
    greedy = [str(i) for i, r in enumerate(worker.AUTO_REQUESTS) if r[2] == 0]
    assert all(tp["timed"]["tokens"][i] == runs[0]["tokens"][i] for i in greedy)


def test_the_workload_is_sensitive_to_its_seeds(checkpoints):
    """Negative control for the equality above: the same workload with other seeds gives other sampled tokens (a
    comparison that could not tell two runs apart would pass the TP test vacuously)."""
    worker, _ = _worker()
    ref = _one_process(worker, checkpoints)
    requests = [(p, g, t, s + 100, a) for p, g, t, s, a in worker.REQUESTS]
    other = _one_process(worker, checkpoints, requests=requests)
    sampled = [str(i) for i, r in enumerate(worker.REQUESTS) if r[2] > 0]
    greedy = [str(i) for i, r in enumerate(worker.REQUESTS) if r[2] == 0]
    assert any(other["tokens"][i] != ref["tokens"][i] for i in sampled)
    assert all(other["tokens"][i] == ref["tokens"][i] for i in greedy)


def test_two_ranks_mixed_step_match_one_process(checkpoints, tmp_path):
    """The mixed prefill/decode step under TP (`tp_paged_worker.mixed_runs`): prompts longer than a budget of 16,
    arriving while others run, fed in chunks inside the verify steps' one forward on each rank's shard, a pool that
    preempts, greedy and seeded rows of draft caps 0 / 2 / 3 — the tokens of one unsharded process, with the mixed
    step and without it (whole prefills); an "auto" budget sized apart on each rank feeds rank 0's; and a shard
    whose mixed forward skips the row-parallel all-reduces does not give those tokens (the negative control)."""
    _mixed_runs_match_one_process(checkpoints, tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpus_mixed_step_match_one_process(checkpoints, tmp_path):
    """The same on 2 GPUs over NCCL (fp32): the Triton ragged attention on each rank's heads, the all-reduces of
    the eager mixed forward, rank 0's "auto" budget broadcast on the device."""
    _mixed_runs_match_one_process(checkpoints, tmp_path, "cuda")


def _mixed_runs_match_one_process(checkpoints, tmp_path, device: str) -> None:
    worker, torchrun = _worker()
    out = tmp_path / "out.json"
    torchrun(str(WORKER), str(out), checkpoints["llama"], checkpoints["draft"], "mixed", nproc=2,
             env_extra={"TP_DEVICE": device})
    got = json.loads(out.read_text())
    assert got["ranks_agree"] and got["clean_shutdown"]
    tp = got["result"]
    drafter = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["draft"]).eval().to(device)
    target = FastLlama.from_hf(checkpoints["llama"], device=device, dtype=torch.float32)
    pool = worker.pool_bytes(target, drafter, worker.MIXED_BLOCKS)
    ref = {name: worker.traffic(target, drafter, pool, worker.MIXED_REQUESTS, **config)
           for name, config in (("mixed", worker.MIXED), ("whole", worker.WHOLE))}
    assert tp["mixed"]["kv_heads"] == 1 and ref["mixed"]["kv_heads"] == 2
    assert ref["mixed"]["tokens"] == ref["whole"]["tokens"]  # (one process: the mixed step's own exactness)
    assert len(ref["mixed"]["tokens"]) == len(worker.MIXED_REQUESTS)
    assert all(len(t) == worker.MAX_NEW for t in ref["mixed"]["tokens"].values())
    for name in ("mixed", "whole", "auto"):
        assert tp[name]["tokens"] == ref["mixed"]["tokens"], name
    # the workload exercises what it claims: chunks in mixed steps, prompts split over steps, preemptions
    assert tp["mixed"] == {**ref["mixed"], "kv_heads": 1}  # (the same chunks and preemptions as one process)
    assert tp["mixed"]["split_chunks"] > 0 and tp["auto"]["split_chunks"] > 0
    assert tp["mixed"]["preemptions"] > 0 and tp["whole"]["chunks"] == 0
    # "auto": rank r sized its own budget 16·(r + 1); every step fed rank 0's (rank 1 asked 32, agreed 16)
    assert got["budgets"] == [[[worker.BUDGET, worker.BUDGET]], [[2 * worker.BUDGET, worker.BUDGET]]]
    # negative control: the same workload, its mixed forwards' partial sums left unreduced, parts from the tokens
    assert tp["no_reduce"]["chunks"] > 0
    assert tp["no_reduce"]["tokens"] != ref["mixed"]["tokens"]
    # and one rank's heads' K/V of the chunks matter: rank 1 alone feeding them one token off parts too
    assert tp["rank1_shifted"]["chunks"] > 0
    assert tp["rank1_shifted"]["tokens"] != ref["mixed"]["tokens"]


def test_text_api_two_ranks_mixed_step_match_one_process(checkpoints, tmp_path):
    """`specdec.load(tensor_parallel_size=2, mixed_step=True)`: rank 0 schedules and sends each admission and step
    over the channel, rank 1 follows; with 2 slots for 4 prompts the later ones fill inside the verify steps, under
    the "auto" budget each rank times apart — the texts of one process with whole prefills (greedy, seeded)."""
    import specdec

    sys.path.insert(0, str(WORKER.parent))
    try:
        from tp_text_worker import MIXED_PROMPTS
    finally:
        sys.path.remove(str(WORKER.parent))
    _, torchrun = _worker()
    out = tmp_path / "text.json"
    torchrun(str(WORKER.with_name("tp_text_worker.py")), str(out), checkpoints["llama"], checkpoints["draft"], "mixed")
    got = json.loads(out.read_text())
    assert got["mixed_steps"] > 0  # (the later prompts were fed inside verify steps)
    with specdec.load(checkpoints["llama"], checkpoints["draft"], device="cpu", num_draft_tokens=3) as llm:
        assert got["greedy"] == [c.text for c in llm.generate(MIXED_PROMPTS, max_new_tokens=12, temperature=0)]
        assert got["sampled"] == [c.text for c in llm.generate(MIXED_PROMPTS, max_new_tokens=12, temperature=1.0,
                                                               seed=5)]
    assert len(set(got["greedy"] + got["sampled"])) > 3  # not one degenerate text
