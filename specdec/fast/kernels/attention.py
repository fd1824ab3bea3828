"""Attention of k new tokens per row over a static slot cache.

Terms (as in `specdec.fast.model`): row b's token at position t lives in slot t of `keys/values [B, H_kv, S, D]`;
slot S−1 is the junk slot (never attended to). Query i of row b sits at `positions[b, i]` and sees slots
j <= positions[b, i] (j < S−1); with a sliding `window` W only the last W of them, positions[b, i] − W < j
(transformers' sliding-window mask). Query heads are grouped over KV heads: head h reads KV head h // (H / H_kv).
softcap c (Gemma 2): scores become c·tanh(scores / c) before the mask and the softmax.
A token tree (`TreeMask`): the queries are nodes of a draft tree laid out from slot `base[b]` on (node t in slot
base + t); a query still sees slots j <= positions[b, i] (its own slot), but of those from base on only its
ancestors and itself — the committed text below base and its own path, nothing of its siblings' subtrees.

A rollback stays a length move under a window: the cache keeps every position of a row, and the mask (not
an eviction) hides what falls out of the window, so whatever was rejected is simply overwritten later.

Two implementations of one function: `slot_attention_reference` (eager SDPA with an additive mask: reads every
slot, and SDPA picks a different kernel for k = 1 than for k > 1) and the Triton split-K kernel in
`triton_attention` (reads only each row's live slots, one kernel for k = 1..32). `slot_attention(kernel=...)`
chooses; "auto" takes the kernel on CUDA where triton imports and the shape is supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdec.fast.kernels.select import interpreting, kernel_module

__all__ = ["slot_attention", "slot_attention_reference", "slot_attention_bias", "causal_prefix_attention",
           "triton_unsupported", "TreeMask", "MAX_TREE_SLOTS", "SDPA_BACKENDS"]

MAX_TREE_SLOTS = 64  # a tree's slots: one int64 bit mask per query


@dataclass(frozen=True)
class TreeMask:
    """Token-tree visibility: base `[B]` long, the row's first tree slot; ancestors `[B, k]` int64, bit t set when
    tree slot base + t is the query itself or one of its ancestors (t < 64). Rows may share one mask by
    broadcasting (`expand`). No host synchronization: capturable."""

    base: torch.Tensor
    ancestors: torch.Tensor

    def allowed(self, num_slots: int) -> torch.Tensor:
        """`[B, k, S]` bool: what the tree lets query i of row b see (the positions bound is applied apart)."""
        j = torch.arange(num_slots, device=self.base.device)
        rel = j[None, :] - self.base[:, None]  # [B, S]
        bit = (self.ancestors[:, :, None] >> rel.clamp(0, MAX_TREE_SLOTS - 1)[:, None, :]) & 1
        return (rel < 0)[:, None, :] | ((bit != 0) & (rel < MAX_TREE_SLOTS)[:, None, :])


def slot_attention_bias(positions: torch.Tensor, num_slots: int, group: int, dtype: torch.dtype,
                        window: int | None = None, tree: TreeMask | None = None) -> torch.Tensor:
    """The reference's additive mask: positions `[B, k]` → `[B, 1, group·k, S]` (0 where query row r may read slot
    j: j <= its position, j > its position − window when a window is given, and j is not the junk slot S − 1;
    −inf elsewhere). It depends on the positions, the span and the window only, so a forward builds it once for
    all its layers of one window (`slot_attention_reference(bias=...)`)."""
    batch, k = positions.shape
    j = torch.arange(num_slots, device=positions.device)
    allowed = (j[None, None, :] <= positions[:, :, None]) & (j < num_slots - 1)  # [B, k, S]
    if window is not None:
        allowed &= j[None, None, :] > positions[:, :, None] - window
    if tree is not None:
        allowed &= tree.allowed(num_slots)
    bias = torch.zeros(allowed.shape, device=positions.device, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return bias[:, None, None].expand(batch, 1, group, k, num_slots).reshape(batch, 1, group * k, num_slots)


def slot_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                             scale: float | None = None, *, bias: torch.Tensor | None = None,
                             window: int | None = None, softcap: float | None = None,
                             tree: TreeMask | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The eager definition: q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, positions `[B, k]` → `[B, k, H, D]`.

    One SDPA call over the whole cache with an additive mask (`slot_attention_bias`; pass `bias` when it is
    already built for these positions, this span and this window); the query heads that share a KV head are
    folded into the query length (plain MHA over H_kv heads). With a softcap, the scores are computed as
    transformers' eager attention does (matmul · scale, c·tanh(·/c), + mask, softmax in float32). sinks `[H]`
    (gpt-oss's attention sinks): one more logit per head in each softmax denominator, read by no value (the scores
    computed as with a softcap).
    """
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    if bias is None:
        bias = slot_attention_bias(positions, num_slots, group, q.dtype, window, tree)
    q = q.reshape(batch, k, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * k, dim)
    if softcap is None and sinks is None:
        with sdpa_kernel(SDPA_BACKENDS):
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)
    else:
        scores = torch.matmul(q, keys.transpose(2, 3)) * (dim ** -0.5 if scale is None else scale)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores + bias
        if sinks is None:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        else:  # folded row g·k + i is head kv·G + g
            sink = sinks.to(scores.dtype).view(1, kv_heads, group, 1, 1).expand(batch, kv_heads, group, k, 1)
            scores = torch.cat([scores, sink.reshape(batch, kv_heads, group * k, 1)], dim=-1)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)[..., :-1]
        out = torch.matmul(probs.to(q.dtype), values)
    return out.view(batch, kv_heads, group, k, dim).permute(0, 3, 1, 2, 4).reshape(batch, k, heads, dim)


#: the SDPA backends the engine's eager attention may take: not cuDNN's, which builds an execution plan for every
#: new shape (batch, query length, span) — 40–170 ms of host time each on an H200, so an admission whose rows or
#: chunk buckets were not seen before stalled every running stream (issue 21: `scripts/prefill_first_calls.py`);
#: the memory-efficient kernel computes the same masked attention with no per-shape setup
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

def causal_prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """`slot_attention_reference` for a block of fresh rows' first positions: q `[B, k, H, D]` holds positions
    0..k-1 of every row (a row's padding columns after its tokens: their outputs are meaningless) and slots
    [0, k) of keys/values `[B, H_kv, S, D]` hold what this forward wrote there → `[B, k, H, D]`. Causal attention
    over those k slots, as `slot_attention_reference` computes it for queries whose positions are their columns,
    without a mask: the flash kernel, no per-shape plan (an admission's prefill; no window, no softcap)."""
    batch, k, heads, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    keys, values = keys[:, :, :k], values[:, :, :k]
    if group > 1:  # query head h reads KV head h // group (the reference's folding)
        keys = keys[:, :, None].expand(batch, kv_heads, group, k, dim).reshape(batch, heads, k, dim)
        values = values[:, :, None].expand(batch, kv_heads, group, k, dim).reshape(batch, heads, k, dim)
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True, scale=scale)
    return out.transpose(1, 2)


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_TRITON_K = 32  # longer query blocks (prefill chunks) take the reference under kernel="auto"


def _triton_module():
    """The Triton kernels' module (`triton_attention`), or None where triton does not import."""
    return kernel_module("triton_attention")


def triton_unsupported(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       positions: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot run these arguments (None when it can)."""
    dim = q.shape[-1]
    if q.dtype not in _TRITON_DTYPES or keys.dtype != q.dtype or values.dtype != q.dtype:
        return f"q, keys and values must share one of {_TRITON_DTYPES}, got {q.dtype}, {keys.dtype}, {values.dtype}"
    if dim < 16 or dim > 256 or dim & (dim - 1):
        return f"head dim must be a power of two in [16, 256], got {dim}"
    if not (q.is_cuda or interpreting()):
        return "needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
    if positions.dtype not in (torch.int32, torch.int64):
        return f"positions must be int32 or int64, got {positions.dtype}"
    return None


def slot_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                   scale: float | None = None, *, window: int | None = None, softcap: float | None = None,
                   kernel: str = "auto", num_splits: int | None = None,
                   bias: torch.Tensor | None = None, tree: TreeMask | None = None,
                   block_table: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`slot_attention_reference`'s function. kernel: "auto" (the fused kernel where one runs), "triton", "reference".

    block_table `[B, max_blocks]` int32 (optional): keys/values are a block pool `[N, block_size, H_kv, D]` and row
    b's slot j lives in block table[b, j // block_size] (`fast.cache.PagedKVCache`); the Triton kernel reads
    through the table, the reference gathers each row's blocks first.

    "auto" takes the Triton split-K kernel for CUDA tensors of a supported shape with k <= 32 when triton
    imports, else the reference; "triton" insists (ValueError where it cannot run). num_splits overrides the
    kernel's split count (tests); None picks it from shapes. bias: the reference's mask when already built
    (tree included). tree: a token tree's visibility (`TreeMask`; not with a window). sinks `[H]`: attention sinks
    (one more logit per head in each softmax denominator; both implementations).
    """
    if kernel not in ("auto", "triton", "reference"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'reference', got {kernel!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive or None, got {softcap!r}")
    batch, k, heads, dim = q.shape
    if sinks is not None and (sinks.shape != (heads,) or not sinks.is_floating_point()):
        raise ValueError(f"sinks must be a floating-point [H] = [{heads}], got {sinks.dtype} {tuple(sinks.shape)}")
    if tree is not None:
        if window is not None:
            raise ValueError("tree: token-tree attention with a sliding window is not supported")
        if tree.base.shape != (batch,) or tree.ancestors.shape != (batch, k) or tree.ancestors.dtype != torch.long:
            raise ValueError(f"tree: base must be [B] = [{batch}] and ancestors int64 [B, k] = [{batch}, {k}], got "
                             f"{tuple(tree.base.shape)} and {tree.ancestors.dtype} {tuple(tree.ancestors.shape)}")

    pool = None
    if block_table is not None:  # (the reference reads the rows' blocks gathered; the kernel reads the pool)
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.dtype != torch.int32:
            raise ValueError(f"block_table must be int32 [B, max_blocks] with B = {batch}, got {block_table.dtype} "
                             f"{tuple(block_table.shape)}")
        if keys.dim() != 4 or keys.shape[-1] != dim or heads % keys.shape[2] or values.shape != keys.shape:
            raise ValueError(f"with a block_table keys/values must be pools [N, block_size, H_kv, D] with H % H_kv "
                             f"== 0 for q {tuple(q.shape)}, got {tuple(keys.shape)} and {tuple(values.shape)}")
        pool = (keys, values)

    def rows():
        """keys/values `[B, H_kv, S, D]` (a pool's: each row's blocks gathered in table order)."""
        if pool is None:
            return keys, values
        index, blocks, size = block_table.long(), block_table.shape[1], keys.shape[1]
        return tuple(t[index].view(batch, blocks * size, *t.shape[2:]).transpose(1, 2) for t in pool)

    def reference():
        return slot_attention_reference(q, *rows(), positions, scale, bias=bias, window=window, softcap=softcap,
                                        tree=tree, sinks=sinks)

    if kernel == "reference" or (kernel == "auto" and (not q.is_cuda or k > MAX_TRITON_K)):
        return reference()
    if pool is None and (keys.shape[0] != batch or keys.shape[-1] != dim or heads % keys.shape[1]
                         or values.shape != keys.shape):
        raise ValueError(f"keys/values must be [B, H_kv, S, D] with H % H_kv == 0 for q {tuple(q.shape)}, "
                         f"got {tuple(keys.shape)} and {tuple(values.shape)}")
    if positions.shape != (batch, k):
        raise ValueError(f"positions must be [B, k] = {(batch, k)}, got {tuple(positions.shape)}")
    module = _triton_module()
    why = "triton does not import" if module is None else triton_unsupported(q, keys, values, positions)
    if why is not None:
        if kernel == "auto":
            return reference()
        raise ValueError(f"kernel='triton': {why}")
    # (the kernel takes the table's row stride: a view of the engine's [max_batch, max_blocks] table is read in place,
    # no copy per layer in every decode step)
    table = None if pool is None else block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    paged = {} if pool is None else dict(block_table=table)
    if sinks is not None:
        paged["sinks"] = sinks.contiguous()
    if tree is None:
        return module.attention(q, keys, values, positions, scale, num_splits=num_splits, window=window,
                                softcap=softcap, **paged)
    return module.attention(q, keys, values, positions, scale, num_splits=num_splits, softcap=softcap,
                            tree_base=tree.base.contiguous(), tree_bits=tree.ancestors, **paged)
