"""What the slot-attention kernels share (`triton_attention`, the split-K decode kernel; `_invariant_attention`, the
bitwise mode's; imported only where Triton is installed): a program's query rows, the scores, which slots a query
sees, and one block's step of the online softmax in base 2.

A program holds the G·k query rows that read one KV head: tile row r = query i · G + head-in-group g
(`query_rows`). Scores are prescaled into base 2 (scale · log2 e; a softcap c first maps s · scale to
c · tanh(s · scale / c)). Every helper is inlined where it is called, so a kernel built from them is the same
program as one that spells them out.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["dot", "tanh", "query_rows", "scores", "visible", "online_step"]


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b in fp32; IEEE (fp32 inputs) keeps full fp32 products instead of TF32."""
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def tanh(x):
    """tanh from exp (saturates to ±1 without overflow trouble: exp → inf gives 1, exp → 0 gives −1)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def query_rows(pid_bh, tile, k_len, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program (row b · KV head, …, row tile) → b (int64), its KV head, the tile's rows `[BLOCK_M]`, which of them
    are queries (rows < G · k_len), each row's query i and head."""
    b = (pid_bh // KV_HEADS).to(tl.int64)
    kvh = pid_bh % KV_HEADS
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # tile row r = query i · GROUP + head-in-group g
    row_ok = rows < GROUP * k_len
    qi = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    return b, kvh, rows, row_ok, qi, head


@triton.jit
def scores(q, keys, scale_log2, softcap, scale, SOFTCAP: tl.constexpr, IEEE: tl.constexpr):
    """q `[BLOCK_M, D]` · keys `[BLOCK_N, D]`ᵀ → base-2 scores `[BLOCK_M, BLOCK_N]` fp32 (SOFTCAP: first
    c·tanh(s·scale / c))."""
    if SOFTCAP:
        s = softcap * tanh(dot(q, tl.trans(keys), IEEE) * (scale / softcap)) * 1.4426950408889634
    else:
        s = dot(q, tl.trans(keys), IEEE) * scale_log2
    return s


@triton.jit
def visible(j, j_ok, pos, window, WINDOWED: tl.constexpr):
    """`[BLOCK_M, BLOCK_N]`: query rows at positions pos `[BLOCK_M]` see slots j `[BLOCK_N]` (in range: j_ok) at or
    before their own position, and under a window W only those after position − W."""
    seen = (j[None, :] <= pos[:, None]) & j_ok[None, :]
    if WINDOWED:
        seen = seen & (j[None, :] > pos[:, None] - window)
    return seen


@triton.jit
def online_step(s, seen, m, lsum):
    """One key block of the online softmax: the scores s where seen (else −inf) against the running row maxima m and
    sums lsum `[BLOCK_M]` → the block's weights p `[BLOCK_M, BLOCK_N]`, the factor alpha `[BLOCK_M]` the running
    accumulator is scaled by, the new maxima and sums. Rows that saw nothing yet stay at zero weight (alpha is
    exactly 1 where a block adds nothing to a row that saw something)."""
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    lsum = lsum * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, lsum
