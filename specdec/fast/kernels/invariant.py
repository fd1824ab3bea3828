"""Batch-invariant kernels: the bitwise-exact mode's GEMM and attention (issue 26, item 1).

A kernel is batch-invariant when every output element is computed by the same sequence of floating-point
operations whatever else shares the call: how many rows a GEMM has (1 for a plain decode step, γ+1 per request
for a verify pass, 64·(γ+1) for a full batch, 512 for a prefill chunk), which positions sit next to it, how long
the cache span is. Then a request's logits at a position are the same bits in a plain step and in a verify pass,
alone and in any batch, and greedy and seeded output cannot depend on any of that (`FastLlama.bitwise`).

  invariant_linear      y = x @ Wᵀ (+ bias) (+ residual). Every output element sums over K in one fixed order:
                        CUDA (and Triton's interpreter on request): one Triton kernel whose summation order —
                        BLOCK_K and a FIXED split-K (K ranges summed in split order) — is a function of the
                        weight's (N, K) only, the same for every M; its tiles follow M's range where a device check
                        finds the bits unchanged (`_invariant_config.config_for`, `_invariant_triton.launch_config`,
                        `matmul`); CPU: torch's BLAS called only on fixed-shape tiles of
                        ROW_TILE rows (MKL's sgemm picks its kernel — and its summation order — by shape: M = 1
                        runs a GEMV, other M other blockings; for one shape a row's result does not depend on the
                        other rows nor on its place in the tile, `tests/fast/kernels/test_invariant.py` checks it)
  invariant_attention   `slot_attention`'s function: each query's keys are reduced in blocks of KEY_BLOCK slots
                        aligned at slot 0, blocks visited in slot order, so a query reads the same blocks in the
                        same order whether 1 or γ+1 queries share its row, whatever the batch and the span; blocks
                        entirely past a query's position (or before its window) are exact no-ops (weight 0, scale 1).
                        CUDA: a split-K Triton kernel whose splits are fixed ranges of slots (its SPLIT_SLOTS, from
                        slot 0, not a share of the live length), merged in split order; CPU: the same blocked
                        reduction in torch ops.

Norms, RoPE, SiLU·mul, softmax and the sampler are per row (or per element) already: on CUDA the fused Triton
kernels run one row per program; on CPU torch's per-row reductions depend only on the row length (checked end
to end by tests/engine/test_engine_bitwise.py). What this module does not make invariant: the reference kernels
(cuBLAS, SDPA) — the bitwise mode never calls them.
"""

from __future__ import annotations

import torch

from specdec.fast.kernels.select import interpreting, kernel_module

__all__ = ["invariant_linear", "invariant_attention", "invariant_linear_reference",
           "invariant_attention_reference", "ROW_TILE", "KEY_BLOCK", "invariant_unsupported",
           "triton_kernels"]

ROW_TILE = 8  # CPU: rows per BLAS call (every call has exactly this many rows; the last tile is zero-padded)
KEY_BLOCK = 32  # slots per attention block, aligned at slot 0 (CPU and Triton)


def _triton():
    """The Triton kernels' module (`_invariant_triton`), or None where Triton does not import."""
    return kernel_module("_invariant_triton")


def triton_kernels():
    """The Triton kernels' module (`matmul`, `MATMUL`, `MatmulConfig`, ...) for benchmarks that time its launch
    configs (scripts/bench_bitwise.py); None where Triton does not import."""
    return _triton()


def _use_triton(t: torch.Tensor, kernel: str) -> bool:
    if kernel not in ("auto", "triton", "torch"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'torch', got {kernel!r}")
    if kernel == "torch":
        return False
    if kernel == "triton":
        if _triton() is None:
            raise ValueError("kernel='triton' needs the triton package (pip install 'specdec[kernels]')")
        if not (t.is_cuda or interpreting()):
            raise ValueError(f"kernel='triton' needs CUDA tensors (or TRITON_INTERPRET=1), got device {t.device}")
        return True
    if not t.is_cuda:
        return False
    if _triton() is None:
        raise RuntimeError("bitwise mode on CUDA needs the triton package (pip install 'specdec[kernels]')")
    return True


# ---------------------------------------------------------------------------------------------------- linear
def invariant_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                               residual: torch.Tensor | None = None) -> torch.Tensor:
    """The torch path: x `[..., K]` @ weight `[N, K]`ᵀ (+ bias `[N]`) (+ residual `[..., N]`) → `[..., N]`, computed
    as BLAS products of exactly ROW_TILE rows each (a fresh zero-padded tile: the same shape, alignment and
    therefore summation order for every row), then bias and residual added elementwise."""
    n, k = weight.shape
    lead = x.shape[:-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    wt = weight.t()
    for start in range(0, m, ROW_TILE):
        stop = min(start + ROW_TILE, m)
        tile = torch.zeros(ROW_TILE, k, dtype=x.dtype, device=x.device)
        tile[: stop - start] = rows[start:stop]
        out[start:stop] = torch.mm(tile, wt)[: stop - start]
    if bias is not None:
        out = out + bias
    out = out.view(*lead, n)
    return out if residual is None else residual + out


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     kernel: str = "auto") -> torch.Tensor:
    """x `[..., K]` @ weight `[N, K]`ᵀ (+ bias `[N]`) (+ residual `[..., N]`) → `[..., N]` in x's dtype, each row's
    bits independent of the other rows. out (optional, contiguous; may be `residual`) receives the result.
    kernel: "auto" (Triton on CUDA, torch on CPU), "triton" (also in the interpreter), "torch"."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's K ({k})")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"weight ({weight.dtype}, {weight.device}) must match x ({x.dtype}, {x.device})")
    want = (*x.shape[:-1], n)
    for name, t in (("residual", residual), ("out", out)):
        if t is not None and (tuple(t.shape) != want or t.dtype != x.dtype):
            raise ValueError(f"{name} must be {list(want)} of x's dtype, got {list(t.shape)} {t.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [{n}], got {list(bias.shape)}")
    if not _use_triton(x, kernel):
        result = invariant_linear_reference(x, weight, bias, residual=residual)
        return result if out is None else out.copy_(result)
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    res = None if residual is None else residual.reshape(-1, n)
    if res is not None and res.stride(-1) != 1:
        res = res.contiguous()
    if out is not None and not out.is_contiguous():
        raise ValueError("out must be contiguous")
    dest = torch.empty(rows.shape[0], n, device=x.device, dtype=x.dtype) if out is None else out.view(-1, n)
    if rows.shape[0]:
        _triton().matmul(rows, weight if weight.stride(-1) == 1 else weight.contiguous(), bias, res, dest)
    return dest.view(want) if out is None else out


# ------------------------------------------------------------------------------------------------- attention
def invariant_unsupported(q: torch.Tensor, keys: torch.Tensor) -> str | None:
    """Why the Triton attention kernel cannot run these arguments (None when it can)."""
    dim = q.shape[-1]
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or keys.dtype != q.dtype:
        return f"q and keys must share float16, bfloat16 or float32, got {q.dtype} and {keys.dtype}"
    if dim < 16 or dim > 256 or dim & (dim - 1):
        return f"head dim must be a power of two in [16, 256], got {dim}"
    return None


def _check_attention(q, keys, values, positions, window) -> None:
    batch, k, heads, dim = q.shape
    if keys.shape[0] != batch or keys.shape[-1] != dim or heads % keys.shape[1] or values.shape != keys.shape:
        raise ValueError(f"keys/values must be [B, H_kv, S, D] with H % H_kv == 0 for q {tuple(q.shape)}, "
                         f"got {tuple(keys.shape)} and {tuple(values.shape)}")
    if tuple(positions.shape) != (batch, k):
        raise ValueError(f"positions must be [B, k] = {(batch, k)}, got {tuple(positions.shape)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")


def invariant_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                                  positions: torch.Tensor, scale: float | None = None, *,
                                  window: int | None = None) -> torch.Tensor:
    """The torch path: q `[B, k, H, D]`, keys/values `[B, H_kv, S, D]`, positions `[B, k]` → `[B, k, H, D]`.

    In float32, on fixed-shape tiles: the G·k query rows of a KV head in tiles of ROW_TILE rows, the slots in
    blocks of KEY_BLOCK aligned at slot 0; scores per (row tile, key block) as one batched BLAS product of one shape
    ([ROW_TILE, D] @ [D, KEY_BLOCK], whatever the batch, k or span: the same summation for every score); the
    softmax's maximum over all visible slots (exact whatever the span); exp; the weighted values per (row tile,
    key block) as one [ROW_TILE, KEY_BLOCK] @ [KEY_BLOCK, D] product, and the row sums per block; the blocks then
    accumulated one after the other in slot order (a running sum: blocks past the query's position add exact
    zeros). Masks as `slot_attention` (j <= position, within the window, never the junk slot S − 1).
    """
    batch, k, heads, dim = q.shape
    kv_heads, num_slots = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    # only the blocks up to the furthest query (the later ones would add exact zeros; a host read is cheap here)
    live = min(int(positions.max()) + 1, num_slots - 1) if positions.numel() else 1
    blocks = max(-(-live // KEY_BLOCK), 1)
    kb = _blocks(keys, blocks).view(batch, kv_heads, 1, blocks, KEY_BLOCK, dim)
    vb = _blocks(values, blocks).view(batch, kv_heads, 1, blocks, KEY_BLOCK, dim)
    scale = dim ** -0.5 if scale is None else float(scale)
    rows = k * group
    tiles = -(-rows // ROW_TILE)
    qf = q.float().reshape(batch, k, kv_heads, group, dim).permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, rows, dim)
    qt = _row_tiles(qf, tiles).unsqueeze(3)  # [B, H_kv, T, 1, R, D]
    scores = torch.matmul(qt, kb.transpose(-1, -2))  # [B, H_kv, T, blocks, R, KEY_BLOCK]
    span = blocks * KEY_BLOCK
    scores = scores.permute(0, 1, 2, 4, 3, 5).reshape(batch, kv_heads, tiles * ROW_TILE, span)[:, :, :rows] * scale
    j = torch.arange(span, device=q.device)
    pos = positions[:, None, :, None].expand(batch, 1, k, group).reshape(batch, 1, rows, 1)
    seen = (j <= pos) & (j < num_slots - 1)
    if window is not None:
        seen &= j > pos - window
    scores = scores.masked_fill(~seen, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - torch.where(top == float("-inf"), 0.0, top))  # [B, H_kv, rows, S']
    sums = weights.view(batch, kv_heads, rows, blocks, KEY_BLOCK).sum(-1).cumsum(-1)[..., -1]  # [B, H_kv, rows]
    wt = _row_tiles(weights, tiles).view(batch, kv_heads, tiles, ROW_TILE, blocks, KEY_BLOCK).transpose(3, 4)
    acc = torch.matmul(wt, vb).cumsum(3)[:, :, :, -1]  # [B, H_kv, T, R, D]
    acc = acc.reshape(batch, kv_heads, tiles * ROW_TILE, dim)[:, :, :rows]
    out = acc / torch.where(sums == 0, 1.0, sums)[..., None]
    return out.view(batch, kv_heads, k, group, dim).permute(0, 2, 1, 3, 4).reshape(batch, k, heads, dim).to(q.dtype)


def _row_tiles(x: torch.Tensor, tiles: int) -> torch.Tensor:
    """x `[B, H, rows, C]` zero-padded to tiles · ROW_TILE rows, as `[B, H, tiles, ROW_TILE, C]`."""
    pad = tiles * ROW_TILE - x.shape[2]
    x = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    return x.reshape(x.shape[0], x.shape[1], tiles, ROW_TILE, x.shape[-1])


def _blocks(cache: torch.Tensor, blocks: int) -> torch.Tensor:
    """The first `blocks` · KEY_BLOCK slots of `cache [B, H_kv, S, D]` in float32, zero-padded past S."""
    span = blocks * KEY_BLOCK
    out = cache[:, :, :span].float()
    return torch.nn.functional.pad(out, (0, 0, 0, span - out.shape[2])) if out.shape[2] < span else out


def invariant_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                        scale: float | None = None, *, window: int | None = None,
                        kernel: str = "auto") -> torch.Tensor:
    """`slot_attention`'s function with every query's result independent of the other queries, the batch and the
    span. kernel: "auto" (Triton on CUDA, torch on CPU), "triton" (also in the interpreter), "torch"."""
    _check_attention(q, keys, values, positions, window)
    if not _use_triton(q, kernel):
        return invariant_attention_reference(q, keys, values, positions, scale, window=window)
    why = invariant_unsupported(q, keys)
    if why is not None:
        raise ValueError(f"bitwise attention: {why}")
    return _triton().attention(q, keys, values, positions, scale, window=window)
