"""Half-precision weights and CUDA: the same API; greedy equality where the arithmetic allows it."""

import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_run_and_self_draft_accepts(make_llama, dtype):
    model = make_llama(0).to(dtype)
    res = specdec.generate(model, RAGGED_PROMPTS, drafter=model, temperature=0, max_new_tokens=12, eos_token_id=[])
    assert all(len(s) == 12 for s in res.sequences)
    # The drafter scores one token at a time and the target γ+1 at once: in half precision an argmax
    # may flip on a near tie, so α is close to, not exactly, 1.
    assert res.stats.alpha > 0.9
    sampled = specdec.generate(model, RAGGED_PROMPTS, drafter=model, temperature=1.0, max_new_tokens=12, seed=0,
                               eos_token_id=[])
    assert all(len(s) == 12 for s in sampled.sequences) and sampled.stats.alpha > 0.95


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("gamma", [1, 4])
def test_cuda_greedy_matches_hf_generate(make_llama, gamma):
    target = make_llama(0).cuda()
    draft = make_llama(1, layers=1).cuda()
    for drafter in (None, draft, specdec.PromptLookupDrafter()):
        res = specdec.generate(target, RAGGED_PROMPTS, drafter=drafter, temperature=0, max_new_tokens=20,
                               num_draft_tokens=gamma, eos_token_id=[2])
        for prompt, ours in zip(RAGGED_PROMPTS, res.sequences):
            assert_same_greedy(target, prompt, ours, hf_greedy(target, prompt, 20, [2]), tie=1e-3)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_precision_sampling_runs(make_llama, dtype):
    target = make_llama(0).cuda().to(dtype)
    draft = make_llama(1, layers=1).cuda().to(dtype)
    res = specdec.generate(target, RAGGED_PROMPTS * 8, drafter=draft, temperature=1.0, top_p=0.9, max_new_tokens=16,
                           seed=0, eos_token_id=[])
    assert all(len(s) == 16 for s in res.sequences) and 0 < res.stats.alpha <= 1
