"""Varlen paged attention: one call over a ragged batch of rows, each with its own number of new query tokens,
reading K/V through the rows' block tables (`specdec.fast.ragged` feeds it; the pool layout is
`fast.cache.PagedKVCache`'s).

Terms:
  ragged batch   B rows; row b brings `counts[b]` new tokens (a prefill chunk: tens to hundreds; a decode / verify
                 row: 1 + γ_b), flattened in row order into N = Σ counts tokens; `query_start [B + 1]` int32 is
                 the prefix sum (flash-attn's / vLLM's cu_seqlens): row b's tokens are flat [query_start[b],
                 query_start[b + 1])
  start          `starts[b]`: positions row b had in its cache before this pass; its i-th new token sits at
                 position starts[b] + i, and its K/V are already in the pool when attention runs (written first)
  causal mask    the query at position t of row b sees row b's slots j <= t (its own prefix and itself); with a
                 sliding window W only t − W < j <= t; a softcap c maps scores s to c·tanh(s / c) (Gemma 2) —
                 the masks and scalings of `kernels.attention.slot_attention`, whose junk slot plays no role here
                 (a ragged batch has no padding)

Three paths of one function, `ragged_attention(kernel=...)`:
  "reference"  torch: rows grouped by query count, each group one `slot_attention_reference` call (SDPA with the
               additive mask; the matmul path under a softcap) over its rows' gathered blocks — the static path's
               own function, so a group computes what a static forward of those rows computes over the same span
  invariant    `invariant=True` (the bitwise mode): the same groups through `invariant.invariant_attention`, whose
               every query's bits do not depend on the span, the group or the batch
  "triton"     one launch: a program per (row tile, KV head) holds BLOCK_M query rows of one row (token i's head g
               at tile row i·G + g, G = H / H_kv) and walks that row's slots [first, its largest position + 1) in
               blocks of BLOCK_N through the block table, online softmax in fp32 (base 2); a prefill tile reads
               only up to its own positions, a windowed layer only its last W + tile span. Two launches at most:
               the short rows (G·count ≤ 32, decode / verify) in tiles of 16–32 query rows, the long ones (prefill
               chunks) in tiles of 64–128. No split-K: at a few rows over long contexts the decode kernel
               (`triton_attention`, split-K) keeps more SMs busy.
"auto": Triton for CUDA tensors of a supported shape, else the reference.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import torch

from specdec.fast.kernels.attention import slot_attention_bias, slot_attention_reference
from specdec.fast.kernels.invariant import invariant_attention

__all__ = ["RaggedLayout", "block_m_for", "ragged_attention", "ragged_attention_reference", "ragged_unsupported"]


@dataclass(frozen=True)
class RaggedLayout:
    """Where a ragged batch's queries sit (built once per batch, read by every layer).

    counts       host tuple [B]: new tokens per row (each ≥ 1)
    starts       host tuple [B]: cached positions per row before the pass
    query_start  `[B + 1]` int32 on the device (cu_seqlens)
    positions    `[N]` long on the device: each token's position, starts[row] + i
    block_table  `[B, max_blocks]` int32 on the device: row b's position t in block table[b, t // block_size]
    launches     (optional) the Triton path's launches, fixed: ((tiles `[T, 2]` int32, BLOCK_M), ...) — a mixed step's
                 bounded batch (`engine.mixed_shapes`), whose grids must not follow the step's counts (CUDA graphs);
                 a tile past its row's query rows does nothing. None: built from `counts` per batch
    Rows may feed no token (count 0: a bounded batch's unused rows): no group, no tile.
    """

    counts: tuple[int, ...]
    starts: tuple[int, ...]
    query_start: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    launches: tuple | None = None
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # groups, masks, tiles: per batch, reused

    @property
    def num_rows(self) -> int:
        return len(self.counts)

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)

    def groups(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
        """Rows of equal query count: (their table rows `[R, W]`, flat token index `[R, k]`, positions `[R, k]`, the
        span they read, one slot past their last position: the reference's junk slot), built once a batch."""
        if "groups" not in self._memo:
            by_count: dict[int, list[int]] = {}
            for row, count in enumerate(self.counts):
                if count:
                    by_count.setdefault(count, []).append(row)
            first = [0]
            for count in self.counts:
                first.append(first[-1] + count)
            device, out = self.positions.device, []
            for count, rows in by_count.items():
                index = torch.tensor([[first[r] + i for i in range(count)] for r in rows])
                end = max(self.starts[r] + count for r in rows)  # (one slot past the last: the reference's junk)
                index = index.to(device)
                table = self.block_table.index_select(0, torch.tensor(rows, device=device))
                out.append((table, index, self.positions[index], end + 1))
            self._memo["groups"] = out
        return self._memo["groups"]

    def tiles(self, block_m: int, group: int, rows: tuple[int, ...]) -> torch.Tensor:
        """A Triton launch's tiles `[T, 2]` int32 (row, tile within the row) over `rows`, BLOCK_M query rows a tile."""
        key = ("tiles", block_m, group, rows)
        if key not in self._memo:
            pairs = [(row, t) for row in rows for t in range(-(-self.counts[row] * group // block_m))]
            host, device = torch.tensor(pairs, dtype=torch.int32).view(-1, 2), self.positions.device
            if device.type == "cuda":  # (pinned: the copy never waits for the work queued before it)
                host = host.pin_memory()
            self._memo[key] = host.to(device, non_blocking=True)
        return self._memo[key]

    def memo(self, key, build):
        """A value built once per batch (a group's mask for one window and dtype)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]


def block_m_for(query_rows: int, dim: int, fp32: bool) -> int:
    """The Triton launch's BLOCK_M (tile query rows) for rows of up to `query_rows` query rows (G · count): the next
    power of two ≥ 16, at most 64 (head dim > 128 or fp32) or 128."""
    return min(max(16, 1 << max(query_rows - 1, 0).bit_length()), 64 if dim > 128 or fp32 else 128)


def _gather(pool: torch.Tensor, table: torch.Tensor, span: int) -> torch.Tensor:
    """Rows' first `span` positions `[R, H_kv, span, D]` from a pool `[num_blocks, size, H_kv, D]` through
    table rows `[R, max_blocks]` (zero slots past the table's width)."""
    size = pool.shape[1]
    blocks = min(-(-span // size), table.shape[1])
    rows = pool[table[:, :blocks].long()].flatten(1, 2)  # [R, blocks·size, H_kv, D]
    if rows.shape[1] < span:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, 0, 0, span - rows.shape[1]))
    return rows[:, :span].transpose(1, 2)


def ragged_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layout: RaggedLayout,
                               scale: float | None = None, *, window: int | None = None,
                               softcap: float | None = None, invariant: bool = False) -> torch.Tensor:
    """q `[N, H, D]`, keys/values pools `[num_blocks, block_size, H_kv, D]` → `[N, H, D]`, by groups of rows of
    one query count (see the module doc); invariant: `invariant_attention` for each group (no softcap)."""
    out = torch.empty_like(q)
    heads, dim = q.shape[1:]
    group_heads = heads // keys.shape[2]
    for g, (table, index, pos, span) in enumerate(layout.groups()):
        k_rows, v_rows = _gather(keys, table, span), _gather(values, table, span)
        qg = q[index]  # [R, k, H, D]
        if invariant:
            res = invariant_attention(qg, k_rows, v_rows, pos, scale, window=window)
        else:
            bias = layout.memo(("bias", g, window, q.dtype, group_heads),
                               lambda: slot_attention_bias(pos, span, group_heads, q.dtype, window))
            res = slot_attention_reference(qg, k_rows, v_rows, pos, scale, bias=bias, window=window,
                                           softcap=softcap)
        out.index_copy_(0, index.reshape(-1), res.reshape(-1, heads, dim))
    return out


@functools.cache
def _triton_kernel():
    """The Triton kernel (imported on first use, so TRITON_INTERPRET set before takes effect), or None."""
    try:
        from specdec.fast.kernels import _ragged_triton
    except ImportError:
        return None
    return _ragged_triton


def ragged_unsupported(q: torch.Tensor, keys: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot run these arguments (None when it can)."""
    dim = q.shape[-1]
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or keys.dtype != q.dtype:
        return f"q and keys must share float16, bfloat16 or float32, got {q.dtype} and {keys.dtype}"
    if dim < 16 or dim > 256 or dim & (dim - 1):
        return f"head dim must be a power of two in [16, 256], got {dim}"
    interpreting = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
    if not (q.is_cuda or interpreting):
        return "needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
    return None


def ragged_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layout: RaggedLayout,
                     scale: float | None = None, *, window: int | None = None, softcap: float | None = None,
                     kernel: str = "auto", invariant: bool = False) -> torch.Tensor:
    """Causal attention of a ragged batch's new tokens over their rows' blocks: q `[N, H, D]`, keys/values the
    layer's pools `[num_blocks, block_size, H_kv, D]` (this pass's K/V already written) → `[N, H, D]` in q's dtype.

    kernel: "auto" | "triton" | "reference" (module doc); invariant: the bitwise mode's attention (torch or its own
    Triton kernel over the gathered rows; `kernel` is then ignored)."""
    if kernel not in ("auto", "triton", "reference"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'reference', got {kernel!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive or None, got {softcap!r}")
    if q.dim() != 3 or q.shape[0] != layout.num_tokens:
        raise ValueError(f"q must be [N, H, D] with N = {layout.num_tokens} tokens, got {tuple(q.shape)}")
    if (keys.dim() != 4 or values.shape != keys.shape or keys.shape[-1] != q.shape[-1]
            or q.shape[1] % keys.shape[2]):
        raise ValueError(f"keys/values must be pools [num_blocks, block_size, H_kv, D] with H % H_kv == 0 for q "
                         f"{tuple(q.shape)}, got {tuple(keys.shape)} and {tuple(values.shape)}")
    if invariant:
        if softcap is not None:
            raise ValueError("invariant=True (the bitwise mode) has no softcap")
        return ragged_attention_reference(q, keys, values, layout, scale, window=window, invariant=True)
    if kernel == "reference" or (kernel == "auto" and not q.is_cuda):
        return ragged_attention_reference(q, keys, values, layout, scale, window=window, softcap=softcap)
    module = _triton_kernel()
    why = "triton does not import" if module is None else ragged_unsupported(q, keys)
    if why is not None:
        if kernel == "auto":
            return ragged_attention_reference(q, keys, values, layout, scale, window=window, softcap=softcap)
        raise ValueError(f"kernel='triton': {why}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return module.attention(q, keys, values, layout, scale, window=window, softcap=softcap)
