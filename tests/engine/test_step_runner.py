"""The step runner's greedy verify: the argmax and the NaN check from one pass (`fast.kernels.argmax`) and the rest of
the step in one launch (`engine.greedy_commit`), both forced in Triton's interpreter here: the engine's tokens and
statistics are those of the torch path (the drafter's greedy draws on `argmax` too), and invalid scores still stop
the step."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine import drafters as drafters_module
from specdec.engine import step_runner
from specdec.engine.greedy_commit import greedy_commit
from specdec.fast.kernels.argmax import argmax, greedy_tokens
from specdec.fast.model import FastLlama, LlamaShape
from specdec.request import SamplingParams

pytest.importorskip("triton")
# The kernel is forced on the engine's CPU tensors: Triton's interpreter, which conftest turns on only without a GPU
# (on a GPU the engine's own tests run the kernel on CUDA through "auto").
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the Triton kernel in the CPU interpreter")


def _model(seed: int, layers: int, dim: int) -> FastLlama:
    shape = LlamaShape(vocab_size=96, dim=dim, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=dim // 4,
                       intermediate_size=2 * dim, rope_theta=10000.0, max_positions=256)
    return FastLlama.random(shape, device="cpu", dtype=torch.float32, std=0.3, seed=seed)


def _run(target, drafter, gamma: int, prompts):
    """Tokens per request (EOS 55 ends some early; budgets differ), their finish and statistics, the engine's."""
    engine = Engine(target, drafter if gamma else None,
                    EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=gamma, max_draft_tokens=4))
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=8 + 3 * i, eos_token_ids=[55]))
           for i, p in enumerate(prompts)]
    out = {i: [] for i in ids}
    finished = {}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
            if o.finished:
                finished[o.request_id] = (o.finish_reason, o.stats.accepted_tokens, o.stats.beta_sum, o.stats.reached_by_position)
    stats = engine.stats
    return [out[i] for i in ids], [finished[i] for i in ids], (stats.accepted_tokens, stats.drafted_tokens, stats.beta_sum,
                                                                stats.row_steps, stats.accepted_by_position)


@pytest.mark.parametrize("gamma, drafter_seed", [(0, 1), (3, 1), (3, 0)])
def test_greedy_kernels_give_the_engine_the_torch_paths_tokens(gamma, drafter_seed, monkeypatch):
    """Drafter seed 0 is a perturbed copy of the target (long accepted runs), seed 1 another model (rejections)."""
    target = _model(0, 2, 32)
    drafter = _model(0, 2, 32) if drafter_seed == 0 else _model(1, 1, 16)
    if drafter_seed == 0:
        with torch.no_grad():
            drafter.w_down[1].add_(0.05 * torch.randn_like(drafter.w_down[1]))
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14], [1]]
    want = _run(target, drafter, gamma, prompts)  # on CPU "auto" is the reference: torch.argmax
    calls = []

    def forced(logits):
        calls.append(tuple(logits.shape))
        return greedy_tokens(logits, kernel="triton")

    commits = []

    def forced_commit(*args):
        commits.append(args[1].shape)
        return greedy_commit(*args, kernel="triton")

    draws = []

    def forced_draw(logits):
        draws.append(logits.shape)
        return argmax(logits, kernel="triton")

    monkeypatch.setattr(step_runner, "greedy_tokens", forced)
    monkeypatch.setattr(step_runner, "greedy_commit", forced_commit)
    monkeypatch.setattr(drafters_module, "argmax", forced_draw)  # the drafter's greedy draws
    assert _run(target, drafter, gamma, prompts) == want
    assert calls and all(shape[1] == gamma + 1 for shape in calls)  # the verify pass of every step took it
    assert len(commits) == len(calls) and len(draws) == gamma * len(calls)


def test_invalid_scores_still_stop_the_step(monkeypatch):
    target = _model(0, 2, 32)
    monkeypatch.setattr(step_runner, "greedy_tokens", lambda logits: greedy_tokens(logits, kernel="triton"))
    engine = Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=32, num_draft_tokens=0))
    engine.add_request([3, 4, 5], SamplingParams(temperature=0, max_new_tokens=8))
    engine.step()  # admission and a first token
    with torch.no_grad():
        target.final_norm.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        while engine.has_unfinished():
            engine.step()
