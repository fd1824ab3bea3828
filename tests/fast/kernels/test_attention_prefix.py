"""kernels.attention.causal_prefix_attention: an admission's first chunk, unmasked, against the masked reference;
and the engine's prefill taking it (fresh rows) or not (rows fed from an offset)."""

import pytest
import torch

from specdec.fast.kernels.attention import causal_prefix_attention, slot_attention_reference


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_matches_the_masked_reference_on_every_rows_tokens(heads, kv_heads):
    torch.manual_seed(0)
    batch, k, slots, dim = 3, 12, 40, 16
    q = torch.randn(batch, k, heads, dim)
    keys, values = torch.randn(batch, kv_heads, slots, dim), torch.randn(batch, kv_heads, slots, dim)
    lengths = [12, 5, 1]  # each row's tokens: columns 0..n-1 at positions 0..n-1; the rest padding
    positions = torch.stack([torch.arange(k).clamp(max=n - 1) for n in lengths])  # (padding: the forward's last)
    got = causal_prefix_attention(q, keys, values)
    want = slot_attention_reference(q, keys, values, positions)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)
    # negative control: slots past k are never read (garbage there changes nothing); slots below k are
    keys[:, :, k:] = float("nan")
    assert torch.equal(causal_prefix_attention(q, keys, values), got)
    keys[:, :, 0] += 1.0
    assert not torch.allclose(causal_prefix_attention(q, keys, values)[:, :3], got[:, :3])


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_a_forward_with_causal_prefix_equals_the_masked_forward(heads, kv_heads):
    """FastLlama.forward(causal_prefix=True) on empty rows with padding after each row's tokens: the logits of
    every token and the cache slots they wrote match the masked forward's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.fast.model import FastLlama

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      max_position_embeddings=64)).eval()
    model = FastLlama.from_hf(hf, dtype=torch.float32, kernels="reference")
    lengths = [16, 7, 1]
    tokens = torch.randint(1, 64, (3, 16))
    valid = torch.arange(16)[None, :] < torch.tensor(lengths)[:, None]
    runs = []
    for causal in (True, False):
        cache = model.new_cache(3, 40)
        for layer in range(len(cache.keys)):  # stale entries of an earlier occupant past the rows' tokens
            cache.keys[layer].normal_()
            cache.values[layer].normal_()
        with torch.inference_mode():
            logits = model(tokens * valid, cache, valid, causal_prefix=causal, kernels="reference")
        runs.append((logits, cache))
    (got, got_cache), (want, want_cache) = runs
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)
        for layer in range(len(got_cache.keys)):
            torch.testing.assert_close(got_cache.keys[layer][b, :, :n], want_cache.keys[layer][b, :, :n],
                                       rtol=1e-5, atol=1e-5)
