"""Tiny random decoders of many transformers architectures (fp32, CPU, seeded) for the transformers backend's tests:
`MATRIX` (name → a builder), `EXTRAS` (matrix entries whose attention adds something to the engine's masks, and
what), `REFUSED` (architectures the backend must refuse, with the reason's words), `make`; the requests the tests
run (`PROMPTS`, `NEW`, `BACKEND`, `run`)."""

from __future__ import annotations

from dataclasses import replace

import torch
import transformers as T

from specdec.request import SamplingParams

VOCAB = 64
C = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
GQA = dict(C, intermediate_size=64, num_key_value_heads=2)
WINDOW = 6  # shorter than the texts: windowed layers drop positions
MOE = dict(num_local_experts=4, num_experts_per_tok=2)
IDS = dict(bos_token_id=1, eos_token_id=2)
FALCON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
              tie_word_embeddings=False, **IDS)

MATRIX = {
    # the fast bodies' families, through the backend
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**GQA)),
    "mistral-window": lambda: T.MistralForCausalLM(T.MistralConfig(**GQA, sliding_window=WINDOW)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**GQA)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**GQA, head_dim=8)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**GQA, head_dim=16)),
    "gemma2-softcap-window": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
        **GQA, head_dim=16, query_pre_attn_scalar=12, sliding_window=WINDOW, attn_logit_softcapping=4.0,
        final_logit_softcapping=6.0, attn_implementation="eager")),  # (sdpa drops or refuses the softcap)
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **GQA, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"])),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**GQA)),
    "gpt-neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**GQA, rotary_pct=0.5)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "starcoder2": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(**GQA)),
    "granite": lambda: T.GraniteForCausalLM(T.GraniteConfig(
        **GQA, embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=2.5)),
    # what only the backend runs
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(**{k: v for k, v in C.items()}, ffn_dim=64, word_embed_proj_dim=32)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                                   n_positions=128, tie_word_embeddings=False)),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**GQA, partial_rotary_factor=0.5)),
    "stablelm": lambda: T.StableLmForCausalLM(T.StableLmConfig(**GQA)),
    "olmo": lambda: T.OlmoForCausalLM(T.OlmoConfig(**GQA)),
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**GQA)),
    "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(**GQA, logit_scale=0.5)),
    "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(**GQA, **MOE)),
    "qwen2-moe": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        **GQA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "olmoe": lambda: T.OlmoeForCausalLM(T.OlmoeConfig(**GQA, num_experts=4, num_experts_per_tok=2)),
    "codegen": lambda: T.CodeGenForCausalLM(T.CodeGenConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                            rotary_dim=4, n_positions=128, n_ctx=128,
                                                            tie_word_embeddings=False)),
    "persimmon": lambda: T.PersimmonForCausalLM(T.PersimmonConfig(**C, intermediate_size=64)),
    "qwen3-moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(
        **GQA, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "granitemoe": lambda: T.GraniteMoeForCausalLM(T.GraniteMoeConfig(**GQA, **MOE)),
    "cohere2-window": lambda: T.Cohere2ForCausalLM(T.Cohere2Config(
        **GQA, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "smollm3": lambda: T.SmolLM3ForCausalLM(T.SmolLM3Config(**GQA)),
    "helium": lambda: T.HeliumForCausalLM(T.HeliumConfig(**GQA, head_dim=8)),
    "nemotron": lambda: T.NemotronForCausalLM(T.NemotronConfig(**GQA)),
    "gpt-bigcode": lambda: T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=False)),
    "deepseek-v3": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
        **GQA, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1, first_k_dense_replace=1)),
    "exaone4": lambda: T.Exaone4ForCausalLM(T.Exaone4Config(**GQA, head_dim=8)),
    # attention sinks (engine_attention's `s_aux`)
    "gpt-oss": lambda: T.GptOssForCausalLM(T.GptOssConfig(
        **GQA, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"])),
    # attention inside their own modules (fast.hf_adapters)
    "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(**FALCON)),  # RoPE, multi-query, parallel attention
    "falcon-gqa": lambda: T.FalconForCausalLM(T.FalconConfig(**FALCON, new_decoder_architecture=True,
                                                             num_kv_heads=2)),
    "falcon-alibi": lambda: T.FalconForCausalLM(T.FalconConfig(**FALCON, alibi=True, multi_query=False,
                                                               parallel_attn=False, bias=True)),  # (Falcon-RW)
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4,
                                                      tie_word_embeddings=False, **IDS)),
    "bloom-slow-but-exact": lambda: T.BloomForCausalLM(T.BloomConfig(  # (its output projections summed per slice)
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, pretraining_tp=2, slow_but_exact=True,
        tie_word_embeddings=False, **IDS)),
    "mpt": lambda: T.MptForCausalLM(T.MptConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2,
                                                max_seq_len=128, tie_word_embeddings=False, **IDS)),
    "gpt-neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=128,
        window_size=WINDOW, attention_types=[[["global", "local"], 1]], tie_word_embeddings=False, **IDS)),
    "xglm": lambda: T.XGLMForCausalLM(T.XGLMConfig(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4,
                                                   ffn_dim=64, max_position_embeddings=128, pad_token_id=0,
                                                   tie_word_embeddings=False, **IDS)),  # sinusoidal positions
    "gpt-neox-japanese": lambda: T.GPTNeoXJapaneseForCausalLM(T.GPTNeoXJapaneseConfig(  # partial RoPE, output bias
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2,
        max_position_embeddings=128, rotary_pct=0.5, tie_word_embeddings=False, **IDS)),
}

#: matrix entry → what its attention adds to the engine's masks (the negative controls drop it)
EXTRAS = {"gpt-oss": "sinks", "falcon-alibi": "alibi", "bloom": "alibi", "mpt": "alibi", "gpt-neo": "window"}

#: architecture → (builder, words the refusal must contain)
REFUSED = {
    "cpmant": (lambda: T.CpmAntForCausalLM(T.CpmAntConfig(  # (its own attention, with a relative position bias)
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, dim_head=8, dim_ff=64, num_hidden_layers=2,
        prompt_length=4, position_bias_num_buckets=32, position_bias_max_distance=64)), "attention interface"),
    "jamba": (lambda: T.JambaForCausalLM(T.JambaConfig(
        **GQA, num_experts=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        use_mamba_kernels=False)), "state-space"),
}


def make(name: str, seed: int = 0, noise: float = 0.0) -> torch.nn.Module:
    """`MATRIX[name]` with random weights of unit scale (transformers' init leaves the tiny models near-constant),
    peaked logits; `noise` > 0: the same model moved a little (a drafter that agrees often, not always)."""
    torch.manual_seed(seed)
    model = MATRIX[name]()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
            else:
                p.add_(torch.randn_like(p) * 0.1)
        head = model.get_output_embeddings().weight
        head.mul_(4.0 / max(float(head.std()), 1e-6) * head.shape[-1] ** -0.5)
        torch.manual_seed(seed + 1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.abs().mean())
    return model.eval()


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5, 3, 4, 5, 3, 9, 9, 9, 9, 9], list(range(20, 40))]
NEW = [12, 9, 14, 10]
BACKEND = dict(model_impl="transformers", max_seq_len=64, num_draft_tokens=3)


def run(engine, prompts, news, params: SamplingParams | None = None, seeds=None) -> list[list[int]]:
    """Requests added one per step (joining while others run), greedy unless `params` (then seeded by `seeds`);
    each request's tokens, in order."""
    ids, outputs, pending = {}, {}, list(range(len(prompts)))
    while pending or engine.has_unfinished():
        if pending:
            i = pending.pop(0)
            p = replace(params or SamplingParams(temperature=0), max_new_tokens=news[i],
                        seed=None if seeds is None else seeds[i])
            ids[engine.add_request(prompts[i], p)] = i
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
    return [outputs[i] for i in range(len(prompts))]
