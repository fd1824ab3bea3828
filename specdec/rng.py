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
An exponential is -ln u rounded once to float32 from float64, so its bits are the same on every device.

This torch code is the reference (and the CPU path). On CUDA tensors the draws run as single Triton launches
with the same bits (`specdec.fast.kernels.random`); `kernel=` ("auto", "triton", "reference"; default the
module's `KERNEL`) picks the path, and `sample` draws a token by exponential race without materializing
the noise.
"""

from __future__ import annotations

import torch

__all__ = ["DRAFT", "ACCEPT", "NEXT", "SIBLING", "KERNEL", "uniforms", "exponentials", "sample"]

DRAFT, ACCEPT, NEXT = 0, 1, 2  # streams
SIBLING = 3  # token trees: the accept tests of a node's second, third, … child (the first child's is ACCEPT's)
_MASK = 0xFFFFFFFF
KERNEL = "auto"  # the default of every `kernel=` below; tests set "reference" or "triton" to force a path


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
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))  # exact in float32


def _neg_log(u: torch.Tensor) -> torch.Tensor:
    """-ln u for float32 u, rounded once to float32 from float64. Float32 logs differ by an ulp between
    libraries (torch's CPU log and numpy's disagree on 1.75M of the 2^23 possible u); but every one of those
    u has -ln u at least 74 float64 ulps away from a float32 rounding midpoint (tests/test_rng.py checks it
    exhaustively), so any float64 log within a few ulps (torch CPU / CUDA, numpy, libdevice) gives these bits."""
    return (-torch.log(u.double())).float()


def uniforms(seed: torch.Tensor, position: torch.Tensor, stream: int, *, kernel: str | None = None) -> torch.Tensor:
    """One U(0, 1) per (row, position): seed [B], position [B, n] → [B, n] float32."""
    if _use_kernel(kernel, seed, position):
        from specdec.fast.kernels import random

        return random.uniforms(seed, position, stream)
    return _to_unit(_mix(_row_keys(seed, position, stream)))


def exponentials(seed: torch.Tensor, position: torch.Tensor, stream: int, size: int, *,
                 kernel: str | None = None) -> torch.Tensor:
    """`size` Exp(1) draws per (row, position): seed [B], position [B, n] → [B, n, size] float32."""
    if _use_kernel(kernel, seed, position):
        from specdec.fast.kernels import random

        return random.exponentials(seed, position, stream, size)
    keys = _row_keys(seed, position, stream)[..., None]
    element = _mix(torch.arange(size, device=seed.device, dtype=torch.long) ^ 0x5BD1E995)
    return _neg_log(_to_unit(_mix(keys ^ element)))


def sample(probs: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, stream: int, *,
           kernel: str | None = None) -> torch.Tensor:
    """One token per row by exponential race: probs [B, V], seed [B], position [B] → [B] (long), the token of
    `core.sample(probs, noise=exponentials(seed, position[:, None], stream, V)[:, 0])`. The Triton path
    fuses the noise into the argmax (the [B, V] noise is never written)."""
    supported = probs.dim() == 2 and position.dim() == 1 and probs.is_floating_point()
    if _use_kernel(kernel, seed, position, supported):
        from specdec.fast.kernels import random

        return random.race(probs, seed, position, stream)
    from specdec.core import sample as race

    return race(probs, noise=exponentials(seed, position[:, None], stream, probs.shape[-1], kernel=kernel)[:, 0])


def _use_kernel(kernel: str | None, seed: torch.Tensor, position: torch.Tensor, supported: bool = True) -> bool:
    """Whether the Triton path runs (see `kernels.select.use_triton`); CPU calls with "auto" import nothing."""
    kernel = KERNEL if kernel is None else kernel
    if kernel == "reference" or (kernel == "auto" and seed.device.type != "cuda"):
        return False
    from specdec.fast.kernels.select import use_triton

    supported = supported and seed.dim() == 1 and seed.dtype == position.dtype == torch.long
    return use_triton(kernel, seed.device, supported, "specdec.rng")
