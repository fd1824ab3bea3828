"""A small draft MODEL for a pretrained target: a narrow 1-2 layer Llama over the target's whole vocabulary.

The other kind of drafter next to the feature head (`specdec.zoo.feature_head`): a standalone causal LM that reads
only tokens (no target features), so any runtime that speculates with a draft model can use it (transformers'
assisted generation, vLLM, llama.cpp's `--model-draft`). It shares the target's tokenizer, so its folder holds the
target's tokenizer files too.

Shape: `SmallDraftShape` (default dim 192, 2 layers, 3 heads of 64, MLP 768, tied embeddings: 10.6M parameters,
21 MB in bf16; the 49,152 × 192 embedding is most of it). Initialisation: the token embedding is the target's
embedding projected on its top `dim` principal directions (`pca_embedding`), so the first steps start from the
target's token geometry instead of noise; the final norm's weight starts small enough that the tied head's first
logits have std ≈ 1; the layers are random (scaled residual init). Training:
`specdec.zoo.distill.distill_draft` with KL(p‖q) against the frozen target on the target's own answers
(`specdec.zoo.responses.response_data`), i.e. the same data step as the head.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from specdec.zoo.models import scale_residual_init

__all__ = ["SmallDraftShape", "pca_embedding", "build_small_draft"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SmallDraftShape:
    dim: int = 192
    layers: int = 2
    heads: int = 3
    kv_heads: int = 3
    ff: int = 768

    def __post_init__(self) -> None:
        for name in ("dim", "layers", "heads", "kv_heads", "ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SmallDraftShape.{name} must be a positive int, got {value!r}")
        if self.dim % self.heads:
            raise ValueError(f"SmallDraftShape: dim {self.dim} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"SmallDraftShape: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")


@torch.no_grad()
def pca_embedding(embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """`[V, D]` → `[V, dim]`: the rows projected on the top `dim` right singular vectors of the centred matrix
    (the mean row is projected too, so the result is E @ W with W `[D, dim]` orthonormal), rescaled so the rows'
    mean norm is kept."""
    if not 1 <= dim <= embedding.shape[1]:
        raise ValueError(f"dim must be in [1, {embedding.shape[1]}], got {dim}")
    e = embedding.float()
    _, _, vh = torch.linalg.svd(e - e.mean(0, keepdim=True), full_matrices=False)
    out = e @ vh[:dim].T
    return out * (e.norm(dim=1).mean() / out.norm(dim=1).mean().clamp_min(1e-12))


def build_small_draft(target: torch.nn.Module, shape: SmallDraftShape = SmallDraftShape(), seed: int = 0):
    """A `LlamaForCausalLM` of `shape` over the target's vocabulary (its special-token ids, RoPE θ and context
    length), tied embeddings initialised by `pca_embedding` of the target's input embedding; fp32 on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=shape.dim, intermediate_size=shape.ff,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=getattr(tc, "max_position_embeddings", 8192),
        rope_theta=getattr(tc, "rope_theta", None) or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0),
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5), tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=getattr(tc, "pad_token_id", None),
        attn_implementation="sdpa")
    model = scale_residual_init(LlamaForCausalLM(config))
    with torch.no_grad():
        embedding = pca_embedding(target.get_input_embeddings().weight.detach().cpu(), shape.dim)
        model.model.embed_tokens.weight.copy_(embedding)
        # tied head: logits = final_norm(h) · E_x, the norm's output has norm √dim, so a unit norm weight gives
        # logits of tens (≈ 50 nats of initial KL on SmolLM2); 2 / (√dim · mean |E_x|) starts them near std 1
        # (initial KL ≈ 6.5 nats there, about that of a uniform q)
        model.model.norm.weight.fill_(2.0 / (math.sqrt(shape.dim) * float(embedding.norm(dim=1).mean().clamp_min(1e-6))))
    model.tie_weights()
    if getattr(target, "generation_config", None) is not None:
        model.generation_config.eos_token_id = target.generation_config.eos_token_id
    logger.info("small draft: %s, %.2fM parameters", shape, sum(p.numel() for p in model.parameters()) / 1e6)
    return model.float().eval()
