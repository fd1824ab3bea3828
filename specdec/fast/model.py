"""A compact decoder for the Llama-shaped families (`FAMILIES`: Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, SmolLM3,
Granite, GPT-NeoX, GPT-2, StarCoder2) in plain PyTorch with a static, per-row KV cache (gpt-fast style). What they
differ in (norms, activation, positions, scalings, windows) is `shape.arch` (`specdec.fast.families`); one body.

Terms:
  slot        one position of the KV cache along S. Row b's token at position t lives in slot t: prompts
              are right-padded, so a row's text is slots [0, lengths[b]) with no holes.
  lengths [B] tokens in each row's cache. A forward of k new tokens writes row b's slots
              [lengths[b], lengths[b] + k) (its own slots, per row) and advances lengths by k.
              Rollback (`crop`) only moves lengths: slots past it are invisible and later overwritten.
  junk slot   the last slot of the cache, never attended to: padding tokens (valid == False) write there.
  mask        a query at position t sees slots j <= t (and never the junk slot); on a layer with a sliding
              window W only t − W < j <= t. The cache keeps every position, so a rollback stays a length move.

Weights are fused for batch-1 speed (one q|k|v matrix, one gate|up matrix). `FastLlama.from_hf` loads a
transformers causal LM of `FAMILIES` (object or local folder); `FastLlama.random` builds random weights
directly on the device (the 8B-shaped system benchmark). Every forward is free of host syncs and,
with fixed shapes, can be captured in a CUDA graph.

kernels ("auto" | "triton" | "reference", an attribute and a constructor / `from_hf` / `random` argument):
"reference" runs the eager PyTorch layer; "triton" runs each layer in 8 launches + attention with the fused
kernels of `specdec.fast.kernels`: RMSNorm, q|k|v GEMM, (bias +) RoPE + KV write, attention, o GEMM (+ residual),
RMSNorm (+ o bias), gate|up GEMM, SiLU·mul, down GEMM (+ residual); "auto" is "triton" on CUDA where Triton
imports, else "reference". The fused layer covers the Llama body (`Arch.fusable`: Llama, Mistral, Qwen2/3, SmolLM3,
Granite, full-rotary Phi-3; windows included); the other families run the eager body, whose attention still takes
the Triton kernel on CUDA (windows and Gemma 2's softcap included).

bitwise (an attribute, `EngineConfig(bitwise=True)`): every forward — prefill included, whatever `kernels` says —
runs the batch-invariant GEMM and attention of `specdec.fast.kernels.invariant` (on CUDA inside the fused layer,
with the final norm on the per-row Triton kernel; on CPU in the eager body), so a position's logits are the same
bits whether it is computed alone, in a (γ+1)-token verify pass, in any batch or in a prefill chunk. The Llama
body only (`Arch.fusable`); other families are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.fast.cache import KVCache, PagedKVCache, TreeNodes, place_tokens
from specdec.fast.families import FAMILIES, Arch, LlamaShape, rope_table
from specdec.fast.layers import LlamaLayers
from specdec.fast.weights import hf_ropes, hf_weights
from specdec.fast.kernels.norm import rms_norm
from specdec.fast.quant.weight import embedding, quantized, quantized_weights
from specdec.fast.kernels.select import KernelChoice, check_kernel, use_triton

__all__ = ["LlamaShape", "Arch", "FAMILIES", "KVCache", "FastLlama"]


class FastLlama(LlamaLayers, torch.nn.Module):
    """A decoder with fused weights; `forward(tokens, cache, ...)` reads and writes a `KVCache`.

    ropes: one (inv_freq, attention scaling) per RoPE table (Gemma 3: global, local); the default is
    (`inv_freq`, `rope_scaling`), or the table `shape.rope_theta` gives.
    """

    normed_output = True  # forward applies the final norm (False: hidden states leave as the residual stream)

    def __init__(self, shape: LlamaShape, *, inv_freq: torch.Tensor | None = None, rope_scaling: float = 1.0,
                 ropes: list | None = None, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 kernels: str = "auto"):
        super().__init__()
        self.shape = shape
        self.kernels = kernels
        # GEMMs of the fused path: "auto" = `kernels.linear`'s Triton kernel for the weights it measured faster on
        # (`FASTER_THAN_CUBLAS`, ≤ 16 rows on CUDA), cuBLAS for the rest; "triton" = that kernel for every weight it
        # covers; "reference" = cuBLAS always (scripts/bench_forward.py compares them).
        self.linear_kernel = "auto"
        self._bitwise = False
        s, a, n = shape, shape.arch, shape.n_layers
        qkv_out = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim
        norm_dtype = torch.float32 if a.norm == "rms1p" else dtype  # (1 + w), kept in float32 as transformers has it

        def empty(*size, dtype=dtype):
            return torch.nn.Parameter(torch.empty(*size, device=device, dtype=dtype), requires_grad=False)

        def per_layer(*size, when=True, dtype=dtype):
            return torch.nn.ParameterList([empty(*size, dtype=dtype) for _ in range(n)]) if when else None

        self.embed = empty(s.vocab_size, s.dim)
        self.pos_embed = empty(s.max_positions, s.dim) if a.learned_positions else None
        self.wqkv = per_layer(qkv_out, s.dim)
        self.wo = per_layer(s.dim, s.n_heads * s.head_dim)
        self.w_gate_up = per_layer((2 if a.gated else 1) * s.intermediate_size, s.dim)
        self.w_down = per_layer(s.dim, s.intermediate_size)
        self.bqkv = per_layer(qkv_out, when=s.qkv_bias)
        self.bo = per_layer(s.dim, when=s.o_bias)
        self.b_up = per_layer(s.intermediate_size, when=a.mlp_bias)
        self.b_down = per_layer(s.dim, when=a.mlp_bias)
        self.q_norm = per_layer(s.head_dim, when=s.qk_norm, dtype=norm_dtype)
        self.k_norm = per_layer(s.head_dim, when=s.qk_norm, dtype=norm_dtype)
        self.attn_norm = per_layer(s.dim, dtype=norm_dtype)
        self.mlp_norm = per_layer(s.dim, dtype=norm_dtype)
        self.post_attn_norm = per_layer(s.dim, when=a.sandwich_norms, dtype=norm_dtype)
        self.post_mlp_norm = per_layer(s.dim, when=a.sandwich_norms, dtype=norm_dtype)
        self.attn_norm_bias = per_layer(s.dim, when=a.norm == "layer")  # LayerNorm's biases
        self.mlp_norm_bias = per_layer(s.dim, when=a.norm == "layer")
        self.final_norm = empty(s.dim, dtype=norm_dtype)
        self.final_norm_bias = empty(s.dim) if a.norm == "layer" else None
        self.lm_head = self.embed if s.tie_word_embeddings else empty(s.vocab_size, s.dim)
        rot = s.head_dim if a.rotary_dim is None else a.rotary_dim
        if ropes is None:
            ropes = [] if rot == 0 else [(inv_freq, rope_scaling)]
        self.rope_scalings = []  # HF's `attention_scaling` per table (1.0 except for some rope types)
        for i, (freq, scaling) in enumerate(ropes):
            if freq is None:
                freq = 1.0 / (s.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
            self.register_buffer("inv_freq" if i == 0 else f"inv_freq_{i}", freq.detach().float().to(device),
                                 persistent=False)
            self.rope_scalings.append(float(scaling))
        self.config = None  # the transformers config, when loaded from one
        self.generation_config = None
        # What `return_hidden` returns: None = the final-normed states; layer ids = the residual stream entering each
        # of those layers, concatenated in layer order `[B, k, len·dim]` (EAGLE-3's low/mid/high target features)
        self.feature_layers: tuple[int, ...] | None = None
        self._rope_cache: tuple[int, list] | None = None

    @property
    def rope_scaling(self) -> float:
        return self.rope_scalings[0] if self.rope_scalings else 1.0

    # ------------------------------------------------------------------------------------------- loading
    @classmethod
    def random(cls, shape: LlamaShape, *, device="cuda", dtype=torch.bfloat16, std: float = 0.02,
               seed: int = 0, kernels: str = "auto") -> "FastLlama":
        """Random weights made on the device (fast even for 8B shapes). Benchmark use only."""
        model = cls(shape, device=device, dtype=dtype, kernels=kernels)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith("b") or "bias" in name:
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
        return model.eval()

    @classmethod
    def from_hf(cls, model, *, device=None, dtype: torch.dtype | None = None, kernels: str = "auto") -> "FastLlama":
        """Load a transformers causal LM of `FAMILIES` (an object, or a local folder).

        A folder loads in the checkpoint's own dtype unless `dtype` is given (local files only, no remote code).
        """
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from transformers import AutoConfig, AutoModelForCausalLM  # dependency at the edge

            LlamaShape.from_hf(AutoConfig.from_pretrained(model, local_files_only=True))  # refuse before loading
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or "auto", local_files_only=True)
        config = model.config
        shape = LlamaShape.from_hf(config)
        ref = model.get_input_embeddings().weight
        device = torch.device(device) if device is not None else ref.device
        dtype = dtype or ref.dtype
        fast = cls(shape, ropes=hf_ropes(model, shape), device=device, dtype=dtype, kernels=kernels)
        with torch.no_grad():
            for name, layer, tensor in hf_weights(model, shape):
                target = getattr(fast, name) if layer is None else getattr(fast, name)[layer]
                target.copy_(tensor.detach())
        fast.config = config
        fast.generation_config = getattr(model, "generation_config", None)
        return fast.eval()

    # ------------------------------------------------------------------------------------------- helpers
    kernels = KernelChoice('Which layer kernels forward runs: "auto", "triton" or "reference" (see the module doc).')

    @property
    def bitwise(self) -> bool:
        """Batch-invariant kernels in every forward (see the module doc); the Llama body only."""
        return self._bitwise

    @bitwise.setter
    def bitwise(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"bitwise must be True or False, got {value!r}")
        if value and not self.shape.arch.fusable:
            raise ValueError("bitwise=True covers the Llama-body families (RMSNorm, gated SiLU MLP, full RoPE, no "
                             "soft-caps); this model's family is not one of them")
        if value and self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"bitwise=True runs on CPU or CUDA, not {self.device.type}")
        hd = self.shape.head_dim
        if value and self.device.type == "cuda" and (hd < 16 or hd > 256 or hd & (hd - 1)):
            raise ValueError(f"bitwise=True on CUDA needs a power-of-two head dim in [16, 256], got {hd}")
        if value and type(self)._row_parallel is not FastLlama._row_parallel:
            raise ValueError(f"bitwise=True is not available for {type(self).__name__} (its all-reduce is not "
                             "batch-invariant)")
        self._bitwise = bool(value)

    def _fused(self, kernels: str | None = None) -> bool:
        """True when this forward runs the fused layer (host-side only: no sync, capture-safe)."""
        if self.bitwise:  # the fused layer on CUDA (or in Triton's interpreter when the model's kernels say "triton"),
            return self.device.type == "cuda" or self.kernels == "triton"  # the eager body on CPU; never per call
        kernels = self.kernels if kernels is None else kernels
        if not self.shape.arch.fusable and kernels == "auto":
            return False  # the eager body (its attention still takes the Triton kernel on CUDA)
        supported = self.shape.head_dim % 2 == 0 and self.shape.head_dim <= 1024 and self.shape.arch.fusable
        return use_triton(kernels, self.device, supported, "FastLlama")

    @property
    def device(self) -> torch.device:
        quant = quantized(self.embed) if self.embed.is_meta else None  # (a GGUF's embedding kept quantized)
        return self.embed.device if quant is None else quant.scale.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype  # (a quantized embedding's placeholder: float32, the dtype of its gathered rows)

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every weight once (the embeddings are only gathered); a weight kept
        quantized (`fast.quant`: a meta placeholder, or a tied embedding's quantized copy), its quantized matrix (an
        untied quantized embedding's: not read, gathered)."""
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or p.is_meta or quantized(p) is not None or name == "pos_embed" or (
                    name == "embed" and not self.shape.tie_word_embeddings):
                continue
            seen.add(id(p))
            total += p.numel() * p.element_size()
        gathered = quantized(self.embed) if not self.shape.tie_word_embeddings else None
        return total + sum(q.nbytes for q in quantized_weights(self) if q is not gathered)

    def new_cache(self, batch_size: int, num_slots: int) -> KVCache:
        """A zeroed cache with at least `num_slots` usable slots (+1 junk slot, rounded up to 16)."""
        return KVCache.zeros(self.shape, batch_size, num_slots, device=self.device, dtype=self.dtype)

    def rope_tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[P, R]` (R rotated dims) of table 0 in the model dtype, as HF computes them (float32 then cast);
        builds every table, sized to what is asked (at least 4096 positions), not to max_position_embeddings.
        Built once for the whole context: captured graphs hold the tables' addresses, so a table must never be
        replaced by a larger one while graphs that read it live."""
        tables = self._tables(num_positions)
        return tables[0] if tables else (None, None)

    def _tables(self, num_positions: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._rope_cache is None or self._rope_cache[0] < num_positions:
            if self._rope_cache is not None and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("RoPE tables must be built before CUDA graph capture")
            num_positions = max(num_positions, 4096)
            tables = [rope_table(getattr(self, "inv_freq" if i == 0 else f"inv_freq_{i}"), scaling, num_positions,
                                 self.dtype) for i, scaling in enumerate(self.rope_scalings)]
            self._rope_cache = (num_positions, tables)
        return self._rope_cache[1]

    # ------------------------------------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor | None, cache: KVCache, valid: torch.Tensor | None = None,
                *, embeds: torch.Tensor | None = None, last_only: bool = False, advance: bool = True,
                return_hidden: bool = False, compute_logits: bool = True, kernels: str | None = None,
                tree: TreeNodes | None = None, causal_prefix: bool = False):
        """Append `tokens [B, k]` to each row at its own slots → logits `[B, k, V]` (float32).

        valid [B, k] (optional): False marks padding; a row's valid tokens are written contiguously from
        `cache.lengths[b]` in order, padding goes to the junk slot and its logits are meaningless.
        last_only: return logits of the last column only (`[B, 1, V]`). advance: move `cache.lengths`.
        embeds [B, k, dim] (optional): input vectors in place of `embed[tokens]` (tokens may then be None).
        return_hidden: return `(logits, hidden)`, hidden `[B, k, dim]` the final-normed states the LM head reads
        (what feature-level drafters consume; with `feature_layers` set, the states entering those layers
        `[B, k, len·dim]`); compute_logits=False skips the LM head (logits None).
        kernels: this call's kernels in place of `self.kernels` (the engine prefills eagerly on "reference":
        outside CUDA graphs each Triton launch costs the host tens of µs, cuBLAS/SDPA calls a few).
        tree: the tokens are token-tree nodes (`TreeNodes`). No host sync: capturable in a CUDA graph (fixed shapes).
        causal_prefix: every row is empty (`cache.lengths` 0) and its valid tokens are its first columns (an
        admission's first prefill chunk): the eager layers attend causally over the chunk's own slots, without a
        mask (`kernels.attention.causal_prefix_attention`: on CUDA the flash kernel, no per-shape setup).
        """
        s, a = self.shape, self.shape.arch
        k = (tokens if embeds is None else embeds).shape[1]
        if tree is not None and self.bitwise:
            raise ValueError("bitwise=True does not cover token trees (tree=): its attention has no tree mask")
        placed = place_tokens(cache.lengths, k, cache.span - 1, valid, tree)
        rope_pos, slots, tree_mask = placed.positions, placed.slots, placed.tree
        tables = self._tables(cache.span)
        if embeds is None:
            x = embedding(tokens, self.embed)  # [B, k, dim] (a quantized table: its rows dequantized)
            if a.embed_scale is not None:  # (Gemma: the scale rounded to the model dtype first, as transformers does)
                x = x * (torch.tensor(a.embed_scale, dtype=self.dtype) if a.round_embed_scale else a.embed_scale)
        else:
            x = embeds.to(self.dtype, copy=True)  # (a copy: the layers add to x in place; the caller's stay intact)
        if a.learned_positions:
            x = x + F.embedding(rope_pos.clamp(max=s.max_positions - 1), self.pos_embed)
        mode = self.kernels if kernels is None else check_kernel(kernels, "kernels")
        fused = self._fused(mode)
        if fused and self.bitwise and isinstance(cache, PagedKVCache):  # (the invariant kernels read static K/V)
            raise ValueError("bitwise=True's fused layer reads a static KV cache, not a paged one")
        capture = [] if return_hidden and self.feature_layers else None
        if fused:
            x = self._fused_layers(x, cache, rope_pos, slots, tables, capture, tree_mask)
        else:
            x = self._eager_layers(x, cache, rope_pos, slots, tables, capture, mode, tree_mask,  # ("triton": fused
                                   causal=causal_prefix)  # or raised)
        if last_only:
            x = x[:, -1:]
        if self.normed_output and fused:  # the per-row Triton norm, as every layer's on this path (bitwise: torch's
            x = rms_norm(x, self.final_norm, s.rms_norm_eps, kernel="triton")  # CUDA split can follow the row count;
            # otherwise: torch's layer-norm kernel took 6.5 µs a decode step on the 8B shape, this one 1.9)
        elif self.normed_output:  # (an EAGLE head's layer hands out its residual stream; the head norms it)
            x = self._norm(x, self.final_norm, self.final_norm_bias)
        gemm = self._gemm(self.lm_head) if fused or self.bitwise else "reference"
        logits = self._logits(x, gemm) if compute_logits else None
        if advance:
            cache.lengths.add_(placed.added)
        if capture is not None:
            x = torch.cat([c[:, -1:] if last_only else c for c in capture], -1)
        return (logits, x) if return_hidden else logits
