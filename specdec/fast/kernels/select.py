"""Choosing between a fused Triton kernel and its eager reference (`kernel="auto" | "triton" | "reference"`).

Triton is imported lazily (the first time a kernel is built), so `import specdec` works without it, and
TRITON_INTERPRET=1 (the tests' CPU mode) only has to be set before the first kernel call.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["KERNEL_CHOICES", "check_kernel", "triton_available", "use_triton"]

KERNEL_CHOICES = ("auto", "triton", "reference")


def check_kernel(kernel, name: str = "kernel") -> str:
    """`kernel` itself, or a ValueError naming the argument."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"{name} must be 'auto', 'triton' or 'reference', got {kernel!r}")
    return kernel


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install (no driver, wrong version)
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(kernel: str, device: torch.device, supported: bool = True, what: str = "this kernel") -> bool:
    """True where the Triton kernel runs: "auto" on CUDA with Triton and a supported shape; "triton" always
    (a ValueError when it cannot run: no Triton, CPU tensors outside the interpreter, unsupported shape)."""
    check_kernel(kernel)
    if kernel == "reference":
        return False
    if kernel == "auto":  # (on CPU, triton is not even imported)
        return device.type == "cuda" and supported and triton_available()
    if not triton_available():
        raise ValueError("kernel='triton' needs the triton package (pip install 'specdec[kernels]')")
    if device.type != "cuda" and not _interpreting():
        raise ValueError(f"kernel='triton' needs CUDA tensors (or TRITON_INTERPRET=1), got device {device}")
    if not supported:
        raise ValueError(f"kernel='triton' does not cover the shape given to {what}")
    return True


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
