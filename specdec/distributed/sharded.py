"""`FastLlama` sharded Megatron-style across the ranks of a torch.distributed process group.

Per layer, with N ranks and rank r:
  wqkv, bqkv    column-parallel by heads: rank r holds query heads [r·nq/N, (r+1)·nq/N) and kv heads
                [r·nkv/N, (r+1)·nkv/N), fused as q_r | k_r | v_r (so each rank's GQA groups stay whole)
  w_gate_up     column-parallel: intermediate columns [r·I/N, (r+1)·I/N) of gate and of up
  wo, w_down    row-parallel: the matching input columns; the partial products are summed with one
                all-reduce each (`_row_parallel`); rank 0 adds the replicated residual stream into its partial
                first (x + inp_0 @ W_0ᵀ in one GEMM), so the all-reduce returns the new residual: no add kernel.
                How the sum is made (`all_reduce`): "group" = the process group's all_reduce (NCCL / gloo),
                "one_shot" = torch symmetric memory over NVLink P2P for small messages, "auto" (default) =
                one_shot where every GPU reaches the others by P2P, else group (`allreduce.py`)
  lm_head       vocab-parallel when untied and V divides by N: rank r holds rows [r·V/N, (r+1)·V/N) and the
                logits are all-gathered (halves the head's reads per step on 2 ranks); else replicated
  embed, norms, bo, q/k norms   replicated (the embedding is only gathered, never read whole)
Every rank ends with the full logits `[B, k, V]`.

`ShardedFastLlama.shape` is the per-rank shape (nq/N heads, nkv/N kv heads, I/N intermediate): the engine
sizes its KV cache from it and runs the unchanged `FastLlama.forward`; `full_shape` is the model's. The mixed
prefill/decode step's ragged pass (`fast.ragged.forward_ragged`) runs the same eager layers, so on a shard each
rank writes its heads' K/V of every chunk and verify row, and the sums are these all-reduces.
Every rank must call forward with the same inputs in the same order (the engine does: its random draws
are a function of (seed, position), the same on every rank; the seed must be the same too).

Loading (`load_sharded`) reads only this rank's slices from the checkpoint's safetensors files
(`safe_open(...).get_slice`), never the full weights; `shard_model` slices a model already in memory.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from specdec.distributed.allreduce import DEFAULT_ONE_SHOT_BYTES, check_all_reduce, make_all_reduce
from specdec.fast.kernels.linear import linear
from specdec.fast.model import Arch, FastLlama, LlamaShape

__all__ = ["ShardedFastLlama", "shard_shape", "load_sharded", "shard_model"]


def shard_shape(shape: LlamaShape, world_size: int) -> LlamaShape:
    """The per-rank shape of `shape` split over `world_size` ranks (ValueError unless heads and MLP divide)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {world_size!r}")
    if dataclasses.replace(shape.arch, layer_windows=()) != Arch():
        raise ValueError("tensor parallelism covers the Llama body (Llama, Mistral, Qwen2/3); this model's family "
                         "runs on one device")
    for name, value in (("attention heads", shape.n_heads), ("key/value heads", shape.n_kv_heads),
                        ("intermediate_size", shape.intermediate_size)):
        if value % world_size:
            raise ValueError(f"tensor_parallel_size {world_size} must divide the model's {name} ({value})")
    return dataclasses.replace(shape, n_heads=shape.n_heads // world_size, n_kv_heads=shape.n_kv_heads // world_size,
                               intermediate_size=shape.intermediate_size // world_size)


class ShardedFastLlama(FastLlama):
    """This rank's shard of a FastLlama (see the module doc); forward returns the full logits on every rank."""

    def __init__(self, full_shape: LlamaShape, group=None, *, inv_freq: torch.Tensor | None = None,
                 rope_scaling: float = 1.0, device="cpu", dtype: torch.dtype = torch.float32,
                 all_reduce: str = "auto", all_reduce_max_bytes: int = DEFAULT_ONE_SHOT_BYTES):
        check_all_reduce(all_reduce)
        if not dist.is_initialized():
            raise ValueError("ShardedFastLlama needs an initialized torch.distributed process group")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        super().__init__(shard_shape(full_shape, world), inv_freq=inv_freq, rope_scaling=rope_scaling,
                         device=device, dtype=dtype)
        self.full_shape = full_shape
        self.group = group
        self.rank = rank
        self.world_size = world
        s = self.shape
        self.vocab_parallel = world > 1 and not s.tie_word_embeddings and s.vocab_size % world == 0
        if self.vocab_parallel:  # (FastLlama allocated the full head first: freed here, reused by the allocator)
            self.lm_head = torch.nn.Parameter(torch.empty(s.vocab_size // world, s.dim, device=device, dtype=dtype),
                                              requires_grad=False)
        self.reduce = None
        self.set_all_reduce(all_reduce, all_reduce_max_bytes)

    def set_all_reduce(self, kind: str, max_bytes: int = DEFAULT_ONE_SHOT_BYTES) -> None:
        """Use the all-reduce `kind` ("auto" / "group" / "one_shot", see `specdec.distributed.allreduce`) from now on.
        Collective: every rank calls it together. Engines built before keep the graphs they captured."""
        self.reduce = make_all_reduce(kind, self.group, device=self.embed.device, dtype=self.embed.dtype,
                                      max_bytes=max_bytes)

    @property
    def all_reduce(self) -> str:
        return self.reduce.kind

    def all_ranks_min(self, value: int) -> int:
        """The smallest `value` over the ranks (collective: every rank calls it together). What each rank sizes from
        its own free memory — the paged pool's blocks — must be the same everywhere, or the ranks' schedulers part
        (one preempts where another does not) and the next all-reduce waits forever."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.embed.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def leader_int(self, value: int) -> int:
        """Rank 0's `value` on every rank (collective). What the engine decides from this rank's own timings — the
        "auto" prefill budget (`engine.prefill.ChunkBudget.agree`) — is rank 0's decision on every rank: rank 0
        schedules, the others follow, and every forward's batch is the same on every rank."""
        return self.leader_ints((value,))[0]

    def leader_ints(self, values) -> tuple[int, ...]:
        """Rank 0's `values` (a sequence of ints, the same length on every rank) on every rank, in one broadcast
        (collective): the γ policy's step choice and per-row caps (`engine.agreement.agree_choice`)."""
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.embed.device)
        dist.broadcast(t, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0, group=self.group)
        return tuple(int(v) for v in t.tolist())

    def _row_parallel(self, x: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor,
                      kernel: str = "reference") -> torch.Tensor:
        """x + Σ_r inp_r @ W_rᵀ `[N, dim]` (a new tensor): rank 0's GEMM adds the residual, then one all-reduce."""
        residual = x if self.rank == 0 else None
        if kernel == "reference":
            partial = inp @ weight.t() if residual is None else torch.addmm(residual, inp, weight.t())
        else:
            partial = linear(inp, weight, residual=residual, kernel=kernel)
        return self.reduce(partial)

    def _logits(self, x: torch.Tensor, kernel: str = "reference") -> torch.Tensor:
        if not self.vocab_parallel:
            return super()._logits(x, kernel)
        local = F.linear(x, self.lm_head)  # [B, k, V/N]: this rank's rows of the head
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1).float()


# ------------------------------------------------------------------------------------------------ loading
def _fill(fast: ShardedFastLlama, read) -> None:
    """Copy this rank's slices into `fast`. read(name, dim, start, length) → the HF tensor `name` narrowed
    along `dim` (dim None: the whole tensor)."""
    full, s, r = fast.full_shape, fast.shape, fast.rank
    hd = s.head_dim
    q_rows = (r * s.n_heads * hd, s.n_heads * hd)
    kv_rows = (r * s.n_kv_heads * hd, s.n_kv_heads * hd)
    mlp = (r * s.intermediate_size, s.intermediate_size)

    def put(param, tensor):
        param.copy_(tensor.to(device=param.device, dtype=param.dtype))

    with torch.no_grad():
        put(fast.embed, read("model.embed_tokens.weight", None, 0, 0))
        for i in range(full.n_layers):
            pre = f"model.layers.{i}."
            attn, mlp_pre = pre + "self_attn.", pre + "mlp."
            qkv = (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows))
            put(fast.wqkv[i], torch.cat([read(f"{attn}{n}.weight", 0, *rows) for n, rows in qkv]))
            put(fast.wo[i], read(attn + "o_proj.weight", 1, *q_rows))
            put(fast.w_gate_up[i], torch.cat([read(mlp_pre + "gate_proj.weight", 0, *mlp),
                                              read(mlp_pre + "up_proj.weight", 0, *mlp)]))
            put(fast.w_down[i], read(mlp_pre + "down_proj.weight", 1, *mlp))
            if s.qkv_bias:
                put(fast.bqkv[i], torch.cat([read(f"{attn}{n}.bias", 0, *rows) for n, rows in qkv]))
            if s.o_bias:
                put(fast.bo[i], read(attn + "o_proj.bias", None, 0, 0))
            if s.qk_norm:
                put(fast.q_norm[i], read(attn + "q_norm.weight", None, 0, 0))
                put(fast.k_norm[i], read(attn + "k_norm.weight", None, 0, 0))
            put(fast.attn_norm[i], read(pre + "input_layernorm.weight", None, 0, 0))
            put(fast.mlp_norm[i], read(pre + "post_attention_layernorm.weight", None, 0, 0))
        put(fast.final_norm, read("model.norm.weight", None, 0, 0))
        if fast.vocab_parallel:
            rows = s.vocab_size // fast.world_size
            put(fast.lm_head, read("lm_head.weight", 0, r * rows, rows))
        elif not s.tie_word_embeddings:
            put(fast.lm_head, read("lm_head.weight", None, 0, 0))


def _rope(config) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling exactly as the transformers model computes them (its rotary module)."""
    from transformers import AutoModelForCausalLM

    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    module = sys.modules[model_class.__module__]
    rotary = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    emb = rotary(config=config)
    if getattr(emb, "rope_type", "default") == "dynamic":
        raise ValueError("FastLlama does not support dynamic RoPE scaling (its frequencies depend on the length)")
    return emb.inv_freq, float(getattr(emb, "attention_scaling", 1.0))


def _safetensors_files(folder: Path) -> dict[str, Path]:
    """HF tensor name → the safetensors file holding it (after `inspect_checkpoint` checked the folder)."""
    from specdec.loading import SAFETENSORS_INDEX

    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        return {name: folder / "model.safetensors" for name in fh.keys()}


def load_sharded(path: str | Path, group=None, *, device="cpu", dtype: torch.dtype | None = None,
                 all_reduce: str = "auto") -> ShardedFastLlama:
    """This rank's shard of a local transformers checkpoint (Llama / Mistral / Qwen2 / Qwen3, safetensors).

    Reads only this rank's slices of the sharded matrices (plus the replicated tensors). `dtype` None = the
    checkpoint's own dtype. The folder is checked first (`specdec.loading.inspect_checkpoint`). `all_reduce`:
    "auto", "group" or "one_shot" (see `specdec.distributed.allreduce`).
    """
    from safetensors import safe_open
    from transformers import AutoConfig, GenerationConfig

    from specdec.loading import inspect_checkpoint

    check_all_reduce(all_reduce)
    folder = Path(path)
    inspect_checkpoint(folder, what="target")
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    shape = LlamaShape.from_hf(config)
    files = _safetensors_files(folder)
    if not files:
        raise ValueError(f"target: {folder} has no safetensors weights; tensor parallelism loads safetensors only")
    handles = {}

    def read(name, dim, start, length):
        if name not in files:
            raise ValueError(f"target: {folder} has no tensor {name!r}")
        file = files[name]
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt", device="cpu")
        part = handles[file].get_slice(name)
        if dim is None:
            return part[:]
        return part[start : start + length] if dim == 0 else part[:, start : start + length]

    if dtype is None:
        dtype = read("model.embed_tokens.weight", 0, 0, 1).dtype
    inv_freq, scaling = _rope(config)
    fast = ShardedFastLlama(shape, group, inv_freq=inv_freq, rope_scaling=scaling, device=device, dtype=dtype,
                            all_reduce=all_reduce)
    _fill(fast, read)
    fast.config = config
    try:
        fast.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except OSError:  # no generation_config.json: transformers' defaults, from the model config
        fast.generation_config = GenerationConfig.from_model_config(config)
    return fast.eval()


def shard_model(model, group=None, *, device=None, dtype: torch.dtype | None = None,
                all_reduce: str = "auto") -> ShardedFastLlama:
    """This rank's shard of a transformers Llama-family model already in memory (sliced, then copied)."""
    shape = LlamaShape.from_hf(model.config)
    params = dict(model.named_parameters())
    ref = params["model.embed_tokens.weight"]
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if getattr(rotary, "rope_type", "default") == "dynamic":
        raise ValueError("FastLlama does not support dynamic RoPE scaling (its frequencies depend on the length)")
    fast = ShardedFastLlama(shape, group, inv_freq=getattr(rotary, "inv_freq", None),
                            rope_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
                            device=device if device is not None else ref.device, dtype=dtype or ref.dtype,
                            all_reduce=all_reduce)

    def read(name, dim, start, length):
        tensor = params[name].detach()
        return tensor if dim is None else tensor.narrow(dim, start, length)

    _fill(fast, read)
    fast.config = model.config
    fast.generation_config = getattr(model, "generation_config", None)
    return fast.eval()
