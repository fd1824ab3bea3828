"""`specdec.rng`'s draws as single Triton launches, bit-identical to its torch reference.

  exponentials(seed, position, stream, size)   [B, n, size] Exp(1): one launch over (B·n rows, size blocks)
  uniforms(seed, position, stream)             [B, n] U(0, 1): one launch
  race(probs, seed, position, stream)          [B] tokens: argmax_v probs[b, v] / E_v with E the row's
                                               `exponentials` at its one position, never materialized (one
                                               launch, a second to merge splits of long rows)
  neg_log_unit(bits)                           -ln of the unit value of uint32 hashes (for exhaustive tests)

`specdec.rng` dispatches here for CUDA tensors (kernel="auto"); the kernels live in `_random_triton` (imported
on first use, so importing this module does not import triton). Inputs are checked by `rng`; here seed and
position are int64, probs a float tensor `[B, V]`.
"""

from __future__ import annotations

import functools

import torch

from specdec.fast.kernels.select import interpreting, next_power_of_2

__all__ = ["exponentials", "uniforms", "race", "neg_log_unit", "race_splits"]

BLOCK = 1024  # noise elements per program
RACE_BLOCK = 1024  # columns per race iteration
TARGET_PROGRAMS = 528  # a long row is split until about four programs per SM (H200: 132 SMs) are busy
MAX_SPLITS = 256


@functools.cache
def _triton():
    from specdec.fast.kernels import _random_triton

    return _random_triton


def _pairs(seed: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seed [B], position [B, n] → both as [B, n] views (broadcast, no copies)."""
    return torch.broadcast_tensors(seed[:, None], position)


def exponentials(seed: torch.Tensor, position: torch.Tensor, stream: int, size: int) -> torch.Tensor:
    """`rng.exponentials` → [B, n, size] float32."""
    s, p = _pairs(seed, position)
    rows, n = p.shape
    out = torch.empty(rows, n, size, dtype=torch.float32, device=p.device)
    if out.numel():
        _triton().exponentials_kernel[(rows * n, triton_cdiv(size, BLOCK))](
            s, p, out, s.stride(0), s.stride(1), p.stride(0), p.stride(1), n, size,
            STREAM=int(stream), BLOCK=BLOCK, INTERPRET=interpreting(), num_warps=4)
    return out


def uniforms(seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """`rng.uniforms` → [B, n] float32."""
    s, p = _pairs(seed, position)
    rows, n = p.shape
    out = torch.empty(rows, n, dtype=torch.float32, device=p.device)
    total = rows * n
    if total:
        block = min(1024, max(32, next_power_of_2(total)))
        _triton().uniforms_kernel[(triton_cdiv(total, block),)](
            s, p, out, s.stride(0), s.stride(1), p.stride(0), p.stride(1), n, total,
            STREAM=int(stream), BLOCK=block, num_warps=4)
    return out


def race_splits(rows: int, size: int) -> tuple[int, int]:
    """(splits, chunk): a row's columns cut into `splits` ranges of `chunk` (a multiple of RACE_BLOCK), enough
    that rows · splits programs fill the GPU; from shapes only, so a graph captures one fixed launch."""
    blocks = triton_cdiv(size, RACE_BLOCK)
    splits = max(1, min(blocks, triton_cdiv(TARGET_PROGRAMS, max(rows, 1)), MAX_SPLITS))
    chunk = triton_cdiv(blocks, splits) * RACE_BLOCK
    return triton_cdiv(size, chunk), chunk


def race(probs: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """probs [B, V], seed [B], position [B] → tokens [B] (int64): `(probs.float() / E).argmax(-1)` with
    E = `rng.exponentials(seed, position[:, None], stream, V)[:, 0]`, as torch picks it (first NaN, else
    the first maximum)."""
    if probs.stride(-1) != 1:
        probs = probs.contiguous()
    rows, size = probs.shape
    token = torch.empty(rows, dtype=torch.long, device=probs.device)
    if rows == 0:
        return token
    splits, chunk = race_splits(rows, size)
    k = _triton()
    parts_val = parts_idx = token  # unused with one split
    if splits > 1:
        parts_val = torch.empty(rows, splits, dtype=torch.float32, device=probs.device)
        parts_idx = torch.empty(rows, splits, dtype=torch.int32, device=probs.device)
    k.race_kernel[(rows, splits)](
        probs, seed, position, token, parts_val, parts_idx, probs.stride(0), seed.stride(0), position.stride(0),
        size, chunk, STREAM=int(stream), BLOCK=RACE_BLOCK, SPLITS=splits, INTERPRET=interpreting(), num_warps=4)
    if splits > 1:
        k.race_combine_kernel[(rows,)](parts_val, parts_idx, token, SPLITS=splits,
                                       BLOCK=max(32, next_power_of_2(splits)), num_warps=1)
    return token


def neg_log_unit(bits: torch.Tensor) -> torch.Tensor:
    """bits: int64 tensor of uint32 values h → -ln(((h >> 9) + 0.5) · 2^-23) as the kernels compute it."""
    flat = bits.reshape(-1).contiguous()
    out = torch.empty(flat.shape, dtype=torch.float32, device=bits.device)
    if flat.numel():
        block = 1024
        _triton().neg_log_unit_kernel[(triton_cdiv(flat.numel(), block),)](
            flat, out, flat.numel(), BLOCK=block, INTERPRET=interpreting(), num_warps=4)
    return out.view(bits.shape)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
