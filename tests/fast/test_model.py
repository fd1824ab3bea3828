"""FastLlama computes the same logits as transformers' LlamaForCausalLM (fp32, CPU), ragged batches included."""

import pytest
import torch

from helpers import right_padded
from specdec.fast import FastLlama, LlamaShape

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5], [7, 7, 7, 7, 8, 9, 7, 7, 7, 7, 8]]


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_hf_ragged_batch(make_llama, tied):
    hf = make_llama(3, layers=3, tie_word_embeddings=tied)
    fast = FastLlama.from_hf(hf)
    tokens, valid = right_padded(PROMPTS)
    cache = fast.new_cache(len(PROMPTS), 40)
    with torch.inference_mode():
        prefill = fast(tokens, cache, valid)
        assert cache.lengths.tolist() == [len(p) for p in PROMPTS]
        more = torch.randint(0, 64, (len(PROMPTS), 4), generator=torch.Generator().manual_seed(0))
        step = fast(more, cache)  # every row writes at its own slots
        for b, p in enumerate(PROMPTS):
            ref = hf(torch.tensor([p + more[b].tolist()])).logits[0]
            torch.testing.assert_close(prefill[b, : len(p)], ref[: len(p)], atol=1e-4, rtol=0)
            torch.testing.assert_close(step[b], ref[len(p) :], atol=1e-4, rtol=0)


def test_crop_is_a_pointer_move_and_rewrites_are_exact(llama):
    fast = FastLlama.from_hf(llama)
    cache = fast.new_cache(1, 32)
    with torch.inference_mode():
        fast(torch.tensor([[1, 2, 3, 4, 5]]), cache)
        cache.lengths.fill_(3)  # roll back two tokens: nothing else changes
        out = fast(torch.tensor([[9, 8]]), cache)
        ref = llama(torch.tensor([[1, 2, 3, 9, 8]])).logits[0, 3:]
    torch.testing.assert_close(out[0], ref, atol=1e-4, rtol=0)
    assert int(cache.lengths) == 5


def test_left_padding_valid_mask(llama):
    """Padding (valid=False) may come first: a row's valid tokens still land contiguously at its own slots."""
    fast = FastLlama.from_hf(llama)
    cache = fast.new_cache(2, 32)
    with torch.inference_mode():
        fast(torch.tensor([[1, 2, 3], [4, 0, 0]]), cache, torch.tensor([[True, True, True], [True, False, False]]))
        block = torch.tensor([[5, 6], [0, 7]])
        valid = torch.tensor([[True, True], [False, True]])
        out = fast(block, cache, valid)
        assert cache.lengths.tolist() == [5, 2]
        ref0 = llama(torch.tensor([[1, 2, 3, 5, 6]])).logits[0, 3:]
        ref1 = llama(torch.tensor([[4, 7]])).logits[0, 1]
    torch.testing.assert_close(out[0], ref0, atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1, 1], ref1, atol=1e-4, rtol=0)


def test_from_local_folder(tmp_path, llama):
    llama.save_pretrained(tmp_path)
    fast = FastLlama.from_hf(str(tmp_path))
    assert fast.shape == LlamaShape.from_hf(llama.config)
    cache = fast.new_cache(1, 8)
    with torch.inference_mode():
        out = fast(torch.tensor([[1, 2, 3]]), cache)
        torch.testing.assert_close(out, llama(torch.tensor([[1, 2, 3]])).logits, atol=1e-4, rtol=0)


def test_random_weights_and_parameter_count():
    shape = LlamaShape(vocab_size=100, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64)
    model = FastLlama.random(shape, device="cpu", dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == shape.num_parameters
    assert model.weight_bytes == 4 * (shape.num_parameters - 100 * 32)  # the embedding is only gathered
    with torch.inference_mode():
        out = model(torch.tensor([[1, 2]]), model.new_cache(1, 4))
    assert out.shape == (1, 2, 100) and torch.isfinite(out).all()


def test_rejects_unsupported_models(make_llama, opt):
    with pytest.raises(ValueError, match="model_type"):
        FastLlama.from_hf(opt)
    with pytest.raises(ValueError, match="mlp_bias"):
        FastLlama.from_hf(make_llama(0, mlp_bias=True))
