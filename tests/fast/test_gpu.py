"""CUDA-only checks of the fast path: graph replays equal eager forwards; greedy output equals HF on GPU."""

import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy
from specdec.fast import FastDrafter, FastTarget


def fast_generate(*args, **kwargs):
    """The request-level engine (the wave-1 fused engine's successor) on the same arguments."""
    return specdec.generate(*args, engine="fast", **kwargs)


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("engine", ["loop", "fused"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphs_equal_eager_on_cuda(llama, llama_draft, engine, temperature):
    kw = dict(temperature=temperature, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[2], seed=0)
    run = specdec.generate if engine == "loop" else fast_generate
    outs = []
    for graphs in (False, True):
        target = FastTarget(llama, device="cuda", cuda_graphs=graphs)
        drafter = FastDrafter(llama_draft, device="cuda", cuda_graphs=graphs)
        outs.append(run(target, RAGGED_PROMPTS, drafter=drafter, **kw).sequences)
    assert outs[0] == outs[1]


def test_greedy_equals_hf_on_cuda(llama, llama_draft):
    refs = [hf_greedy(llama, p, 16, [2]) for p in RAGGED_PROMPTS]
    target = FastTarget(llama, device="cuda")
    for run in (specdec.generate, fast_generate):
        res = run(target, RAGGED_PROMPTS, drafter=FastDrafter(llama_draft, device="cuda"), temperature=0,
                  max_new_tokens=16, num_draft_tokens=4, eos_token_id=[2])
        for prompt, ours, ref in zip(RAGGED_PROMPTS, res.sequences, refs):
            assert_same_greedy(llama, prompt, ours, ref)


def test_bf16_runs_and_keeps_exactness_against_its_own_plain_decoding(llama, llama_draft):
    target = FastTarget(llama, device="cuda", dtype=torch.bfloat16)
    drafter = FastDrafter(llama_draft, device="cuda", dtype=torch.bfloat16)
    kw = dict(temperature=0, max_new_tokens=16, eos_token_id=[])
    plain = fast_generate(target, RAGGED_PROMPTS, **kw)
    spec = fast_generate(target, RAGGED_PROMPTS, drafter=drafter, num_draft_tokens=4, **kw)
    # bf16 verification of γ+1 tokens and plain 1-token steps may round differently; near-ties only
    same = sum(a == b for a, b in zip(plain.sequences, spec.sequences))
    assert same >= len(RAGGED_PROMPTS) - 1
