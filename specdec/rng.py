"""Counter-based random numbers: a pure function of (seed, position, stream, element), no generator state.

The engine batches requests that come and go; each must draw the same numbers whatever else is in the
batch, and the draws must be capturable in a CUDA graph. So a uniform is a hash of its coordinates:

    u(seed, position, stream, element) ∈ (0, 1)      23-bit resolution, never 0 or 1

`position` is the absolute token position the draw decides, `stream` what it decides (a draft, its accept
test, the step's next token). Why reusing a coordinate is still exact: a step that starts at position L only
commits decisions whose coordinates are >= L, each coordinate decides at most one committed outcome, and
whether a draw was discarded (a rejection earlier in the step) never depends on the draw itself.

The hash is `lowbias32` (Chris Wellons' integer-hash search), chained over the coordinates, computed on
int64 tensors holding 32-bit values with multiplications split in 16-bit halves, so nothing overflows.
"""

from __future__ import annotations

import torch

__all__ = ["DRAFT", "ACCEPT", "NEXT", "uniforms", "exponentials"]

DRAFT, ACCEPT, NEXT = 0, 1, 2  # streams
_MASK = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2^32 for x in [0, 2^32), without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + ((x * hi) & 0xFFFF) * 65536) & _MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _row_keys(seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """seed [B] (int64, >= 0), position [B, n] → a 32-bit key per (row, position)."""
    lo, hi = seed & _MASK, (seed >> 32) & _MASK
    row = _mix(lo ^ _mix(hi ^ 0x9E3779B9))[:, None]
    pos = _mix((position * 4 + stream) & _MASK)
    return _mix(row ^ pos ^ ((position >> 30) & 0xFFFF))


def _to_unit(h: torch.Tensor) -> torch.Tensor:
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def uniforms(seed: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """One U(0, 1) per (row, position): seed [B], position [B, n] → [B, n] float32."""
    return _to_unit(_mix(_row_keys(seed, position, stream)))


def exponentials(seed: torch.Tensor, position: torch.Tensor, stream: int, size: int) -> torch.Tensor:
    """`size` Exp(1) draws per (row, position): seed [B], position [B, n] → [B, n, size] float32."""
    keys = _row_keys(seed, position, stream)[..., None]
    element = _mix(torch.arange(size, device=seed.device, dtype=torch.long) ^ 0x5BD1E995)
    return -torch.log(_to_unit(_mix(keys ^ element)))
