"""FastLlama with kernels="triton" computes what kernels="reference" (the eager layer) computes.

Tiny random Llama (with attention bias: q|k|v and o biases), Qwen2 (q|k|v bias), Qwen3 (q/k norm), Mistral with a
sliding window, SmolLM3 (a NoPE layer) and Granite (multipliers) models;
successive forwards with k > 1 (ragged, padded by a `valid` mask), k = 1, a rollback and k = 3: logits and the
caches (junk slot aside) agree. CPU runs the Triton interpreter in float32; CUDA runs bf16 and a captured graph.
"""

import pytest
import torch

from specdec.engine.config import EngineConfig
from specdec.fast import FastLlama

transformers = pytest.importorskip("transformers")
pytest.importorskip("triton")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    "llama-bias": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, attention_bias=True)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, use_sliding_window=False)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL, head_dim=16)),
    # the fused layer under a sliding window (texts of 11 tokens > 3), NoPE layers, Granite's multipliers
    "mistral-window": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=3)),
    "smollm3-nope": lambda: transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
        **SMALL, no_rope_layers=[0, 1], pad_token_id=0)),
    "granite": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **SMALL, embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=2.5)),
}


def _hf(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():  # away from the init's zeros and ones, so biases and norms matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _steps(fast, device):
    """Logits `[B, k, V]` (valid positions) of successive forwards, and the cache after them."""
    g = torch.Generator().manual_seed(1)
    tokens = lambda b, k: torch.randint(0, 64, (b, k), generator=g).to(device)  # noqa: E731
    cache = fast.new_cache(2, 20)
    valid = torch.tensor([[True] * 4, [False, True, True, False]], device=device)  # padding on both sides
    outs = []
    with torch.inference_mode():
        outs.append(fast(tokens(2, 4), cache, valid)[valid])  # ragged prefill
        outs.append(fast(tokens(2, 1), cache))  # decode, k = 1
        outs.append(fast(tokens(2, 3), cache))  # verify, k = 3
        cache.lengths.sub_(torch.tensor([2, 1], device=device))  # rollback is a pointer move
        block_valid = torch.tensor([[True] * 3, [False, True, True]], device=device)
        outs.append(fast(tokens(2, 3), cache, block_valid)[block_valid])
        hidden_in = torch.randn(2, 2, fast.shape.dim, generator=g).to(device, fast.dtype)
        before = hidden_in.clone()
        logits, hidden = fast(None, cache, embeds=hidden_in, return_hidden=True)
        assert torch.equal(hidden_in, before)  # the caller's embeds are not written
        outs += [logits, hidden]
    assert cache.lengths.tolist() == [11, 9]
    return outs, cache


def _compare(family, device, dtype, atol):
    hf = _hf(family)
    runs = {kernels: _steps(FastLlama.from_hf(hf, device=device, dtype=dtype, kernels=kernels), device)
            for kernels in ("reference", "triton")}
    (ref_outs, ref_cache), (got_outs, got_cache) = runs["reference"], runs["triton"]
    for ref, got in zip(ref_outs, got_outs):
        torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=atol)
    for ref, got in zip(ref_cache.keys + ref_cache.values, got_cache.keys + got_cache.values):
        torch.testing.assert_close(got[:, :, :-1].float(), ref[:, :, :-1].float(), atol=atol, rtol=atol)
    return ref_outs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_triton_layers_match_reference_cpu(family):
    _compare(family, "cpu", torch.float32, 1e-4)


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_triton_layers_match_reference_cuda_bf16(family):
    ref_outs = _compare(family, "cuda", torch.bfloat16, 5e-2)
    print(family, "max |logit|", max(float(o.abs().max()) for o in ref_outs))


@pytest.mark.gpu
@CUDA
def test_triton_forward_in_a_cuda_graph():
    from specdec.fast.graphs import CapturedStep

    fast = FastLlama.from_hf(_hf("qwen3"), device="cuda", dtype=torch.bfloat16, kernels="triton")
    cache = fast.new_cache(2, 32)
    fast.rope_tables(cache.keys[0].shape[2])
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]], device="cuda")
    with torch.inference_mode():
        eager = fast(tokens, cache, advance=False)
        step = CapturedStep(lambda: fast(tokens, cache, advance=False), restore=cache.keys + cache.values)
        torch.testing.assert_close(step.replay(), eager, atol=1e-3, rtol=1e-3)


def test_kernels_mode_is_validated():
    hf = _hf("qwen2")
    fast = FastLlama.from_hf(hf)
    assert fast.kernels == "auto"
    fast.kernels = "reference"
    with pytest.raises(ValueError, match="kernels"):
        fast.kernels = "fused"
    with pytest.raises(ValueError, match="kernels"):
        FastLlama.from_hf(hf, kernels="cuda")
    assert EngineConfig(kernels="triton").kernels == "triton"
    with pytest.raises(ValueError, match="kernels"):
        EngineConfig(kernels="eager")


def test_row_parallel_hook_still_carries_both_residual_adds():
    """The tensor-parallel subclass overrides `_row_parallel` (it all-reduces there): the fused layer calls it."""
    calls = []

    class Recording(FastLlama):
        def _row_parallel(self, x, inp, weight, kernel="reference"):
            calls.append(tuple(weight.shape))
            return super()._row_parallel(x, inp, weight, kernel)

    hf = _hf("qwen2")
    fast = Recording.from_hf(hf, kernels="triton")
    with torch.inference_mode():
        out = fast(torch.tensor([[3, 4]]), fast.new_cache(1, 8))
        ref = FastLlama.from_hf(hf, kernels="reference")(torch.tensor([[3, 4]]), fast.new_cache(1, 8))
    s = fast.shape
    assert calls == [(s.dim, s.n_heads * s.head_dim), (s.dim, s.intermediate_size)] * s.n_layers
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_fused_layers_on_the_triton_linear():
    """The fused path with `kernels.linear` for every GEMM (the in-place residual form included) and the LM head."""
    hf = _hf("llama-bias")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fast = FastLlama.from_hf(hf, kernels="triton", device=device)
    fast.linear_kernel = "triton"
    ref = FastLlama.from_hf(hf, kernels="reference", device=device)
    tokens = torch.tensor([[3, 4, 5], [6, 7, 8]], device=device)
    with torch.inference_mode():
        cache, ref_cache = fast.new_cache(2, 8), ref.new_cache(2, 8)
        for cols in (slice(0, 2), slice(2, 3)):
            torch.testing.assert_close(fast(tokens[:, cols], cache), ref(tokens[:, cols], ref_cache),
                                       atol=1e-4, rtol=1e-4)
