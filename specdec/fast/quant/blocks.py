"""GGUF block types → `QuantWeight`, decoded from the raw blocks (numpy `uint8 [rows, bytes per row]`, e.g. a
memory map of the file) without a dense float32 copy of the matrix.

  type   block  → bits  group  w =                        exact?
  Q4_0   32       4     32     d·q − 8d                   yes (d·q, 8d exact in fp32)
  Q4_1   32       4     32     d·q + m                    yes (the GGUF's own scale and min)
  Q4_K   256      4     32     (d·sc)·q − dmin·mn         yes (the 6-bit sub-block scale and min folded into one fp32
                                                          scale and offset per 32: d·sc has ≤ 17 significant bits)
  Q5_0   32       8     32     d·(q − 16)                 yes (5-bit values held in 8 bits)
  Q5_1   32       8     32     d·q + m                    yes
  Q5_K   256      8     32     (d·sc)·q − dmin·mn         yes
  Q6_K   256      8     16     (d·sc)·(q − 32)            yes (16-value sub-blocks: group 16)
  Q8_0   32       8     32     d·q                        yes

Every row is dequantized by the kernel to the float32 gguf's `quants.dequantize` (what transformers loads) gives;
`tests/fast/quant` checks each type against it, with a wrong scale as the negative control. The 5- and 6-bit types
are held in 8 bits (8.5–9 bits a weight with the scales, against the file's 5.5–6.6): exact, not as small.
Other types (Q2_K, Q3_K, IQ*, TQ*) are refused by name (`SUPPORTED`).
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.fast.quant.weight import QuantWeight

__all__ = ["SUPPORTED", "BLOCK_BYTES", "from_blocks", "pack4"]

# type name → (values per block, bytes per block)
BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q5_0": (32, 22), "Q5_1": (32, 24),
               "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_0": (32, 34)}
SUPPORTED = tuple(BLOCK_BYTES)
_ROWS_AT_ONCE = 2048  # rows decoded per numpy pass (bounds the transients: a few MB)


def _f16(b: np.ndarray) -> np.ndarray:
    """fp16 bytes [..., 2] → float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def pack4(q: np.ndarray) -> np.ndarray:
    """4-bit values `[n, K]` (0..15) → the kernel's bytes `[n, K/2]` (byte j of a 32-group: q[j] | q[16 + j] << 4)."""
    g = q.reshape(q.shape[0], -1, 2, 16).astype(np.uint8)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """Q4_0/Q4_1/Q5_0/Q5_1's 16 bytes a block → its 32 low-4-bit values [nb, 32] (j: low nibble, 16 + j: high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes → 256 low-4-bit values [nb, 256] (per 32 bytes: 32 low nibbles, then 32 high)."""
    c = qs.reshape(qs.shape[0], 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (c & 0x0F).reshape(qs.shape[0], 256)


def _scale_min_k(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K-quants' 12 bytes of 6-bit sub-block scales and mins → ([nb, 8], [nb, 8]) as uint8."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _decode(kind: str, b: np.ndarray):
    """Blocks `[nb, bytes]` → (q [nb, values] integer — Q4_0/Q4_1: their packed bytes [nb, 16] —, scale
    [nb, groups], offset [nb, groups] or None)."""
    nb = b.shape[0]
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _f16(b[:, 0:2])[:, None]
        if kind == "Q8_0":
            return b[:, 2:34].view(np.int8), d, None
        head = 4 if kind in ("Q4_1", "Q5_1") else 2
        m = _f16(b[:, 2:4])[:, None] if head == 4 else None
        if kind.startswith("Q4"):  # (their bytes are the kernel's layout already: `from_blocks` takes them as they are)
            return b[:, head:head + 16], d, (m if m is not None else -8.0 * d)
        qh = np.ascontiguousarray(b[:, head:head + 4]).view(np.uint32)  # bit j: value j's fifth bit
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles32(b[:, head + 4:head + 20]) | (high << 4)
        return (q.astype(np.int8) - np.int8(16), d, None) if kind == "Q5_0" else (q, d, m)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
        sc, mn = _scale_min_k(b[:, 4:16])
        scale, offset = d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))
        if kind == "Q4_K":
            return _nibbles_k(b[:, 16:144]), scale, offset
        qh = b[:, 16:48].reshape(nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit s: sub-block s
        return _nibbles_k(b[:, 48:176]) | ((qh & 1).reshape(nb, 256) << 4), scale, offset
    if kind == "Q6_K":
        ql = b[:, 0:128].reshape(nb, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        qh = b[:, 128:192].reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        q = (ql & 0x0F).reshape(nb, 256) | ((qh & 0x03).reshape(nb, 256) << 4)
        d = _f16(b[:, 208:210])[:, None]
        return q.astype(np.int8) - np.int8(32), d * b[:, 192:208].view(np.int8).astype(np.float32), None
    raise ValueError(f"GGUF block type {kind} is not one specdec reads quantized (it reads {', '.join(SUPPORTED)})")


def from_blocks(kind: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantWeight:
    """A `QuantWeight` `[N, K]` from a GGUF tensor's raw blocks `uint8 [N, K / values per block · bytes]`."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"GGUF block type {kind} is not one specdec reads quantized (it reads {', '.join(SUPPORTED)})")
    n, k = shape
    per, size = BLOCK_BYTES[kind]
    if k % per or raw.dtype != np.uint8 or raw.shape != (n, k // per * size):
        raise ValueError(f"{kind} tensor [{n}, {k}]: expected raw blocks uint8 [{n}, {k // per * size}], got "
                         f"{raw.dtype} {tuple(raw.shape)}")
    bits = 4 if kind.startswith("Q4") else 8
    group = 16 if kind == "Q6_K" else 32
    qs = np.empty((n, k // 2 if bits == 4 else k), dtype=np.uint8 if bits == 4 else np.int8)
    scale = np.empty((n, k // group), dtype=np.float32)
    offset = None
    for start in range(0, n, _ROWS_AT_ONCE):
        stop = min(start + _ROWS_AT_ONCE, n)
        q, s, o = _decode(kind, np.asarray(raw[start:stop]).reshape(-1, size))
        rows = stop - start
        packed = kind in ("Q4_0", "Q4_1")  # (16 bytes a block, q[j] | q[16 + j] << 4: `pack4`'s layout)
        qs[start:stop] = q.reshape(rows, k // 2) if packed else pack4(q.reshape(rows, k)) if bits == 4 else \
            q.reshape(rows, k)
        scale[start:stop] = s.reshape(rows, -1)
        if o is not None:
            offset = np.empty_like(scale) if offset is None else offset
            offset[start:stop] = o.reshape(rows, -1)
    return QuantWeight(torch.from_numpy(qs), torch.from_numpy(scale),
                       None if offset is None else torch.from_numpy(offset), bits, group, (n, k), kind)
