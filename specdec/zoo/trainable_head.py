"""The trainable feature head: `fc` + a transformers one-layer Llama (vocabulary 1: it reads `inputs_embeds`).

`forward` is one draft step under teacher forcing; `unrolled` runs draft steps 1..depth from every origin at once
(EAGLE-3's training-time test) with earlier steps' keys/values kept, tested against `unrolled_reference` (one
block-masked transformers pass); `init_from` starts it as the target's last layer; `to_feature_head` converts it
to the engine's `specdec.fast.head.FeatureHead` through `FastLlama.from_hf`. Trained by `specdec.zoo.feature_head`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama

__all__ = ["TrainableHead"]


class TrainableHead(torch.nn.Module):
    """fc + a transformers one-layer Llama; `forward(features, next_tokens, embed) -> f̂` (differentiable)."""

    def __init__(self, config: HeadConfig, seed: int = 0):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.fc = torch.nn.Linear(2 * config.dim, config.dim, bias=False)
        hf = LlamaConfig(vocab_size=1, hidden_size=config.dim, intermediate_size=config.intermediate_size,
                         num_hidden_layers=1, num_attention_heads=config.n_heads,
                         num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
                         max_position_embeddings=config.max_positions or 4096, rms_norm_eps=config.rms_norm_eps,
                         rope_theta=config.rope_theta, tie_word_embeddings=True, attn_implementation="sdpa",
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
        self.decoder = LlamaForCausalLM(hf)
        self.decoder.model.embed_tokens.weight.requires_grad_(False)  # a placeholder: the head reads vectors
        self._masks: dict = {}  # `_chain_mask` by (N, step, device)

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """(f_t `[B, T, dim]`, x_{t+1} `[B, T]`) at positions 0..T−1 → f̂_{t+1} `[B, T, dim]` (final-normed)."""
        x = self.fc(torch.cat([F.embedding(next_tokens, embed).to(features.dtype), features], -1))
        return self.decoder.model(inputs_embeds=x, use_cache=False).last_hidden_state

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor, depth: int) -> list:
        """Draft steps 1..depth from every origin at once (EAGLE-3's "training-time test").

        features `[B, N, dim]` (f_0..f_{N−1}), tokens `[B, N]` → [f̂ of step s: `[B, N−s, dim]` for s = 1..depth],
        row t of step s predicting f_{t+s}. Step 1 reads the true features; step s reads step s−1's predictions
        at position t+s−1 and attends, as when drafting, to the true entries at positions ≤ t and to its own
        chain (positions as in the engine's head cache). The function of `unrolled_reference`, computed with the
        keys/values of earlier steps kept: step s runs the layer on its own N−s rows only (3N rows at depth 3,
        not 6N) and attends `[N−s, Σ_{j≤s} (N−j)]` (step 1: plain causal attention).
        """
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        n = features.shape[1]
        model = self.decoder.model
        layer, attn = model.layers[0], model.layers[0].self_attn
        embedded = F.embedding(tokens, embed).to(features.dtype)
        x = self.fc(torch.cat([embedded[:, 1:], features[:, :-1]], -1))
        keys, values, outputs = [], [], []
        for s in range(1, depth + 1):
            b, width = x.shape[:2]
            positions = torch.arange(s - 1, s - 1 + width, device=x.device)[None]
            h = layer.input_layernorm(x)
            q, k, v = (proj(h).view(b, width, -1, attn.head_dim).transpose(1, 2)
                       for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            q, k = apply_rotary_pos_emb(q, k, *model.rotary_emb(x, positions))  # cos/sin in x's dtype, as HF does
            keys.append(k)
            values.append(v)
            key, value = torch.cat(keys, 2), torch.cat(values, 2)
            if key.shape[1] != q.shape[1]:  # grouped-query attention
                rep = q.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
            mask = None if s == 1 else self._chain_mask(n, s, x.device)
            a = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, is_causal=s == 1,
                                               scale=getattr(attn, "scaling", attn.head_dim**-0.5))
            x = x + attn.o_proj(a.transpose(1, 2).reshape(b, width, -1))
            out = model.norm(x + layer.mlp(layer.post_attention_layernorm(x)))
            outputs.append(out)
            if s == depth or n - 1 - s <= 0:
                break
            x = self.fc(torch.cat([embedded[:, s + 1 :], out[:, : n - 1 - s]], -1))  # origins 0..N−2−s
        return outputs

    def _chain_mask(self, n: int, s: int, device) -> torch.Tensor:
        """`[N−s, Σ_{j≤s} (N−j)]` bool: step s's origin t sees step 1's origins ≤ t and its own chain (steps 2..s)."""
        key = (n, s, str(device))
        if key not in self._masks:
            origin = torch.arange(n - s, device=device)[:, None]
            blocks = [torch.arange(n - 1, device=device)[None] <= origin]
            blocks += [torch.arange(n - j, device=device)[None] == origin for j in range(2, s + 1)]
            self._masks[key] = torch.cat(blocks, 1)
        return self._masks[key]

    def unrolled_reference(self, features: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor,
                           depth: int) -> list:
        """`unrolled` as one block-masked transformers pass over the concatenated steps per draft step (every
        step recomputes the earlier blocks): the readable reference the fast version is tested against."""
        n = features.shape[1]
        embedded = F.embedding(tokens, embed).to(features.dtype)
        device = features.device
        blocks = [self.fc(torch.cat([embedded[:, 1:], features[:, :-1]], -1))]
        origins, steps = [torch.arange(n - 1, device=device)], [torch.ones(n - 1, dtype=torch.long, device=device)]
        outputs = []
        for s in range(1, depth + 1):
            origin, step = torch.cat(origins), torch.cat(steps)
            true_key = (step[None, :] == 1) & (origin[None, :] <= origin[:, None])
            own_chain = (step[None, :] > 1) & (step[None, :] <= step[:, None]) & (origin[None, :] == origin[:, None])
            mask = (true_key | own_chain)[None, None].expand(features.shape[0], 1, -1, -1)
            positions = (origin + step - 1)[None].expand(features.shape[0], -1)
            hidden = self.decoder.model(inputs_embeds=torch.cat(blocks, 1), attention_mask=mask,
                                        position_ids=positions, use_cache=False).last_hidden_state
            out = hidden[:, -blocks[-1].shape[1]:]
            outputs.append(out)
            width = n - 1 - s  # origins 0..N−2−s have a token x_{t+s+1} to feed
            if s == depth or width <= 0:
                break
            blocks.append(self.fc(torch.cat([embedded[:, s + 1 :], out[:, :width]], -1)))
            origins.append(torch.arange(width, device=device))
            steps.append(torch.full((width,), s + 1, dtype=torch.long, device=device))
        return outputs

    def init_from(self, target: torch.nn.Module) -> None:
        """The layer starts as the target's last layer; fc passes the features through (identity on f_t)."""
        with torch.no_grad():
            self.decoder.model.layers[0].load_state_dict(target.model.layers[-1].state_dict())
            self.decoder.model.norm.load_state_dict(target.model.norm.state_dict())
            dim = self.config.dim
            self.fc.weight.zero_()
            self.fc.weight[:, dim:].copy_(torch.eye(dim))
            self.fc.weight[:, :dim].normal_(0.0, 0.02)

    def to_feature_head(self, device="cpu", dtype: torch.dtype = torch.float32) -> FeatureHead:
        """The engine's `FeatureHead` with these weights (unbound)."""
        layer = FastLlama.from_hf(self.decoder, device=device, dtype=dtype)
        head = FeatureHead(self.config, layer=layer)
        with torch.no_grad():
            head.fc.copy_(self.fc.weight)
        return head.eval()
