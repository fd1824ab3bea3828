"""Every family the fast model covers computes transformers' logits (fp32, CPU, ragged batches, texts longer than
the sliding windows), and the engine's greedy output equals transformers' generate over changing prompt lengths,
batches and γ, with a model drafter and an n-gram drafter (rejections roll windows back too); GPU: bf16, ties
allowed."""

import math

import pytest
import torch
import transformers

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy, right_padded
from specdec.engine import Engine, EngineConfig
from specdec.fast import FastLlama, LlamaShape
from specdec.request import SamplingParams

T = transformers
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = 6  # far shorter than the texts below, so every windowed layer drops positions
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "factor": 4.0, "short_factor": [1.0, 1.3], "long_factor": [2.0, 5.0]}

FAMILIES = {
    "mistral-window": lambda: T.MistralForCausalLM(T.MistralConfig(**COMMON, sliding_window=WINDOW)),
    "qwen2-window": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON, use_sliding_window=True,
                                                             sliding_window=WINDOW, max_window_layers=1)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**COMMON, head_dim=16)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
        **COMMON, head_dim=16, query_pre_attn_scalar=12, sliding_window=WINDOW, attn_logit_softcapping=4.0,
        final_logit_softcapping=6.0)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=20, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    "gemma3-all-local": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW)),  # 2 layers of a 6-pattern
    "gemma3-vision-language": lambda: T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        text_config=dict(**COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                         layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                           image_size=28, patch_size=14), mm_tokens_per_image=4)),
    "smollm3-nope-window": lambda: T.SmolLM3ForCausalLM(T.SmolLM3Config(
        **{**COMMON, "num_hidden_layers": 3}, no_rope_layers=[1, 0, 1], use_sliding_window=True,
        sliding_window=WINDOW, layer_types=["full_attention", "sliding_attention", "full_attention"])),
    "granite": lambda: T.GraniteForCausalLM(T.GraniteConfig(
        **COMMON, embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=2.5)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**COMMON, sliding_window=WINDOW)),
    "phi3-partial-longrope": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        **COMMON, partial_rotary_factor=0.5, original_max_position_embeddings=64,
        rope_parameters={**LONGROPE, "partial_rotary_factor": 0.5})),
    "gpt-neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**COMMON, rotary_pct=0.5)),
    "gpt-neox-sequential": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        **COMMON, rotary_pct=1.0, use_parallel_residual=False, hidden_act="gelu_new")),
    "starcoder2-window": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(
        **COMMON, sliding_window=WINDOW, norm_epsilon=1e-5)),
    "starcoder2-nobias": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(**COMMON, use_bias=False)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=96,
                                                   bos_token_id=1, eos_token_id=2)),
}


def _make(name, seed=0, draft_noise=0.0):
    """Random norms, biases and weights (transformers initializes norms to exact 0/1), peaked logits; a drafter is
    the same model with a little noise (drafts then get accepted and rejected)."""
    torch.manual_seed(seed)
    model = FAMILIES[name]()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        model.get_output_embeddings().weight.mul_(6.0)
        torch.manual_seed(seed + 1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * draft_noise)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param, _make(request.param), _make(request.param, draft_noise=0.05)


def test_logits_match_transformers(family):
    """A ragged prefill, a 4-token step and a rollback + rewrite: every row's logits are transformers' own."""
    _, hf, _ = family
    fast = FastLlama.from_hf(hf)
    prompts = RAGGED_PROMPTS + [list(range(3, 25))]
    tokens, valid = right_padded(prompts)
    cache = fast.new_cache(len(prompts), 48)
    more = torch.randint(3, 64, (len(prompts), 4), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        prefill = fast(tokens, cache, valid)
        step = fast(more, cache)
        cache.lengths.sub_(3)  # reject three of the four: a length move, windows included
        rewrite = fast(more[:, 1:3].flip(1), cache)
        for b, p in enumerate(prompts):
            ref = hf(torch.tensor([p + more[b].tolist()])).logits[0]
            torch.testing.assert_close(prefill[b, : len(p)], ref[: len(p)], atol=1e-4, rtol=0)
            torch.testing.assert_close(step[b], ref[len(p):], atol=1e-4, rtol=0)
            again = hf(torch.tensor([p + more[b, :1].tolist() + more[b, 1:3].flip(0).tolist()])).logits[0]
            torch.testing.assert_close(rewrite[b], again[len(p) + 1:], atol=1e-4, rtol=0)


def test_engine_greedy_equals_transformers(family):
    """Changing prompt lengths (past the window), batch sizes and γ on one kept engine, a model drafter and an n-gram
    drafter fitted on the target's own text (so drafts are accepted and rejected): always the greedy text."""
    name, target, draft = family
    ngram = specdec.NGramDrafter(2, top_k_successors=4).fit([hf_greedy(target, [5, 6, 7], 30, [])], 64)
    calls = [(RAGGED_PROMPTS, 12, 3, draft), ([[9] * 20 + [3, 4]], 16, 4, ngram), (RAGGED_PROMPTS[1:3], 7, 1, draft),
             ([[1, 2, 3]] * 3, 9, 0, None), ([list(range(5, 30))], 14, 5, ngram)]
    accepted = rejected = 0
    for prompts, new, gamma, drafter in calls:
        res = specdec.generate(target, prompts, drafter=drafter, max_new_tokens=new, temperature=0,
                               num_draft_tokens=max(gamma, 1), eos_token_id=[], engine="fast")
        for prompt, out in zip(prompts, res.sequences):
            assert out == hf_greedy(target, prompt, new, []), (name, prompt)
        if drafter is not None:
            accepted += res.stats.accepted_tokens
            rejected += res.stats.drafted_tokens - res.stats.accepted_tokens
    assert accepted > 0 and rejected > 0  # speculation really ran, and rolled back where drafts were rejected


def test_requests_join_mid_flight_past_the_window():
    """Requests admitted while others run (slot moves, refills) on alternating local/global layers: each request's
    greedy text is transformers' own, far past the window."""
    target, draft = _make("gemma2"), _make("gemma2", draft_noise=0.05)
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=96, num_draft_tokens=3))
    prompts = [list(range(3, 20)), [7, 8], [9] * 12 + [4], list(range(30, 3, -1))]
    outputs, ids, pending = {}, {}, list(enumerate(prompts))
    while pending or engine.has_unfinished():
        if pending:  # one new request per step, more requests than slots
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=14 + 3 * i))] = i
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    for i, prompt in enumerate(prompts):
        assert outputs[i] == hf_greedy(target, prompt, 14 + 3 * i, [])


def test_shapes_name_what_each_family_changes():
    gemma2 = LlamaShape.from_hf(FAMILIES["gemma2"]().config)
    assert gemma2.arch.layer_windows == (WINDOW, None) and gemma2.arch.attn_scale == 12 ** -0.5
    assert (gemma2.arch.attn_softcap, gemma2.arch.final_softcap, gemma2.arch.norm) == (4.0, 6.0, "rms1p")
    gemma3 = LlamaShape.from_hf(FAMILIES["gemma3"]().config)
    assert gemma3.arch.layer_rope == (1, 0, 1) and gemma3.qk_norm and gemma3.arch.attn_softcap is None
    assert LlamaShape.from_hf(FAMILIES["gemma3-all-local"]().config).arch.layer_rope == (0, 0)
    phi3 = LlamaShape.from_hf(FAMILIES["phi3-partial-longrope"]().config)
    assert phi3.arch.rotary_dim == 4 and phi3.arch.rope_limit == 64 and phi3.context == 64
    neox = LlamaShape.from_hf(FAMILIES["gpt-neox"]().config)
    assert neox.arch.parallel_residual and neox.arch.norm == "layer" and neox.arch.rotary_dim == 4
    gpt2 = LlamaShape.from_hf(FAMILIES["gpt2"]().config)
    assert gpt2.arch.learned_positions and gpt2.arch.rotary_dim == 0 and not gpt2.arch.gated and gpt2.context == 96
    assert not any(s.arch.fusable for s in (gemma2, gemma3, neox, gpt2))
    assert LlamaShape.from_hf(FAMILIES["mistral-window"]().config).arch.fusable
    smollm3 = LlamaShape.from_hf(FAMILIES["smollm3-nope-window"]().config)
    assert smollm3.arch.layer_rope == (0, 1, 0) and smollm3.arch.layer_windows == (None, WINDOW, None)
    granite = LlamaShape.from_hf(FAMILIES["granite"]().config)
    assert (granite.arch.embed_scale, granite.arch.attn_scale, granite.arch.logit_scale) == (3.0, 0.2, 2.5)
    assert smollm3.arch.fusable and granite.arch.fusable  # (the fused Triton layer runs them on CUDA)


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="dynamic"):
        LlamaShape.from_hf(T.LlamaConfig(**COMMON, rope_parameters={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaShape.from_hf(T.GPTNeoXConfig(**COMMON, hidden_act="relu"))
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        LlamaShape.from_hf(T.Gemma3TextConfig(**COMMON, head_dim=16, use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        LlamaShape.from_hf(T.GPT2Config(n_embd=32, n_layer=1, n_head=4, scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match="model_type"):
        LlamaShape.from_hf(T.OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                       num_attention_heads=4))


def test_tensor_parallel_takes_the_llama_body_only():
    from specdec.distributed import shard_shape

    with pytest.raises(ValueError, match="tensor parallelism"):
        shard_shape(LlamaShape.from_hf(FAMILIES["gemma2"]().config), 2)
    assert shard_shape(LlamaShape.from_hf(FAMILIES["mistral-window"]().config), 2).n_heads == 2  # windows shard


def test_longrope_engine_serves_its_short_range_only():
    """Past original_max_position_embeddings transformers switches to the long factors mid-text; the engine
    keeps to the range where its tables are exact and says so."""
    target = _make("phi3-partial-longrope")
    with pytest.raises(ValueError, match="context of 64"):
        Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=100))
    engine = Engine(target, None, EngineConfig(max_batch_size=1))
    assert engine.max_seq_len == 64
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.add_request([5] * 40, SamplingParams(max_new_tokens=30))


def test_rope_tables_follow_the_served_context_not_the_config():
    """A 4M-position config must not allocate 4M-row tables: they follow what the engine serves."""
    cfg = T.LlamaConfig(**{**COMMON, "max_position_embeddings": 4 << 20})
    model = T.LlamaForCausalLM(cfg).eval()
    engine = Engine(model, None, EngineConfig(max_batch_size=1, max_seq_len=512))
    cos, _ = engine.model.rope_tables(1)
    assert cos.shape[0] < 8192


# --------------------------------------------------------------------------------------------------- GPU
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU_PROMPTS = RAGGED_PROMPTS + [list(range(3, 40))]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fp32_engine_on_cuda_is_exact(name):
    """CUDA graphs, the Triton attention (windows, softcap; fp32 dots) and the fused layer where the family has it:
    transformers' greedy text (a difference only at a float tie)."""
    target, draft = _make(name).cuda(), _make(name, draft_noise=0.05).cuda()
    for drafter, gamma in ((None, 1), (draft, 3)):
        res = specdec.generate(target, GPU_PROMPTS, drafter=drafter, num_draft_tokens=gamma, max_new_tokens=24,
                               temperature=0, eos_token_id=[])
        for prompt, out in zip(GPU_PROMPTS, res.sequences):
            assert_same_greedy(target, prompt, out, hf_greedy(target, prompt, 24, []))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_bf16_engine_on_cuda_keeps_greedy_up_to_ties(name):
    """bf16: transformers' bf16 greedy text, where they differ only at a tie of a few bf16 steps of the logits."""
    target = _make(name).to("cuda", torch.bfloat16)
    draft = _make(name, draft_noise=0.05).to("cuda", torch.bfloat16)
    for drafter, gamma in ((None, 1), (draft, 3)):
        res = specdec.generate(target, GPU_PROMPTS, drafter=drafter, num_draft_tokens=gamma, max_new_tokens=24,
                               temperature=0, eos_token_id=[])
        for prompt, out in zip(GPU_PROMPTS, res.sequences):
            ref = hf_greedy(target, prompt, 24, [])
            with torch.no_grad():
                scale = target(torch.tensor([prompt], device="cuda")).logits.abs().max().item()
            bf16_step = 2.0 ** (math.floor(math.log2(max(scale, 1.0))) - 7)  # bf16's spacing at the logits' size
            assert_same_greedy(target, prompt, out, ref, tie=4 * bf16_step)
