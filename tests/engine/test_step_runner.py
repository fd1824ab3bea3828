"""The step runner's greedy verify: the argmax and the NaN check from one pass (`fast.kernels.argmax`), so the
engine's tokens are those of torch.argmax (the kernel forced in Triton's interpreter here), and invalid scores still
stop the step."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine import step_runner
from specdec.fast.kernels.argmax import greedy_tokens
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


def _run(target, drafter, gamma: int, prompts) -> list[list[int]]:
    engine = Engine(target, drafter if gamma else None,
                    EngineConfig(max_batch_size=4, max_seq_len=64, num_draft_tokens=gamma, max_draft_tokens=4))
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=12)) for p in prompts]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return [out[i] for i in ids]


@pytest.mark.parametrize("gamma", [0, 3])
def test_greedy_tokens_kernel_gives_the_engine_torch_argmax_tokens(gamma, monkeypatch):
    target, drafter = _model(0, 2, 32), _model(1, 1, 16)
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14], [1]]
    want = _run(target, drafter, gamma, prompts)  # on CPU "auto" is the reference: torch.argmax
    calls = []

    def forced(logits):
        calls.append(tuple(logits.shape))
        return greedy_tokens(logits, kernel="triton")

    monkeypatch.setattr(step_runner, "greedy_tokens", forced)
    assert _run(target, drafter, gamma, prompts) == want
    assert calls and all(shape[1] == gamma + 1 for shape in calls)  # the verify pass of every step took it


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
