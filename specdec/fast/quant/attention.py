"""The quantized CPU engine's attention: `cpu_attention`, `kernels.attention.slot_attention`'s function for a few new
queries per row over a static or paged slot cache, by `attn_cpu.cpp` (built with the q8 kernel, `kernel.py`).

Why not the reference (`slot_attention_reference`: one SDPA call over the gathered cache with an additive mask):
it gathers and reads the table's whole width (the engine's span, not the row's live length) in every layer, and its
result for a query depends on how many queries share the call (SDPA's kernel and its blocking follow the shapes) —
in fp32 a last-bit difference, which the next layer's 8-bit activations can turn into another greedy token. Here
each (query, head) reads exactly its own slots, in slot order, with a fixed arithmetic (`attn_cpu.cpp`'s header): a
query's output is the same bits alone, in a verify pass of γ + 1 tokens, or in any batch. Its difference from the
reference is float rounding (the exponential is a polynomial, ~1 ulp), tested in `tests/fast/quant/test_attention.py`.

`FastLlama` layers take it where `cpu_attention` is set on the model (`fast.quant.attach` sets it on a GGUF model
kept quantized, when the kernel builds): CPU float32, no token tree.
"""

from __future__ import annotations

import functools

import torch

from specdec.fast.quant.kernel import kernel_available

__all__ = ["cpu_attention", "cpu_attention_unsupported", "CPU_ATTENTION_MAX_QUERIES"]

CPU_ATTENTION_MAX_QUERIES = 32  # new tokens a row up to which the layers take it (decode / verify; prefill chunks:
# SDPA, whose cost per query does not grow with the chunk as this loop's does)


@functools.lru_cache(maxsize=64)
def _indices(batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the static cache's table `[B, 1]` int32: block b = row b, each query's row `[B·k]`): made once per shape (a
    decode step's layers all ask for the same; the op only reads them) — 3 small tensor ops a layer less."""
    return torch.arange(batch, dtype=torch.int32).view(batch, 1), torch.arange(batch).repeat_interleave(k)


def cpu_attention_unsupported(q: torch.Tensor, keys: torch.Tensor, tree=None) -> str | None:
    """Why `cpu_attention` cannot run these arguments (None when it can)."""
    if tree is not None:
        return "token trees take the reference"
    if q.device.type != "cpu" or q.dtype != torch.float32 or keys.dtype != torch.float32:
        return f"float32 CPU tensors only, got {q.dtype} / {keys.dtype} on {q.device.type}"
    if not kernel_available():
        return "the CPU kernels did not build"
    return None


def cpu_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                  scale: float | None = None, *, window: int | None = None, softcap: float | None = None,
                  block_table: torch.Tensor | None = None) -> torch.Tensor:
    """q `[B, k, H, D]`, keys / values `[B, H_kv, S, D]` (static) or pools `[P, block_size, H_kv, D]` with
    block_table `[B, max_blocks]` int32, positions `[B, k]` → `[B, k, H, D]`: query i of row b reads slots
    j ≤ positions[b, i] (not the span's last, the junk slot; with a window only the last `window`)."""
    if not kernel_available():
        raise RuntimeError("cpu_attention: specdec's CPU kernels did not build (the reason was logged)")
    batch, k, heads, dim = q.shape
    static, rows = _indices(batch, k)
    if block_table is None:
        pool_k, pool_v, table = keys.transpose(1, 2), values.transpose(1, 2), static  # [B, S, H_kv, D]: block b = row b
    else:
        pool_k, pool_v, table = keys, values, block_table.contiguous()
    span = table.shape[1] * pool_k.shape[1]
    out = torch.empty(batch * k, heads, dim)
    pos = positions.reshape(-1)
    torch.ops.specdec_attn.attn_decode(q.reshape(batch * k, heads, dim), pool_k, pool_v, table, rows,
                                       pos if pos.dtype == torch.int64 and pos.is_contiguous() else
                                       pos.long().contiguous(),
                                       dim ** -0.5 if scale is None else float(scale), window or 0,
                                       float(softcap or 0.0), span - 2, out)
    return out.view(batch, k, heads, dim)
