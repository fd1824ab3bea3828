"""Choosing between a fused Triton kernel and its eager reference (`kernel="auto" | "triton" | "reference"`).

Triton is imported lazily (the first time a kernel is built), so `import specdec` works without it, and
TRITON_INTERPRET=1 (the tests' CPU mode) only has to be set before the first kernel call. The host-side pieces every
kernel's wrapper shares live here, once: `interpreting` (Triton's own reading of TRITON_INTERPRET), `kernel_module`
(a module that imports triton, loaded on first use) and `sm_count` (the device's SMs, for launch heuristics).
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

__all__ = ["KERNEL_CHOICES", "NUM_SMS", "KernelChoice", "check_kernel", "interpreting", "kernel_module", "sm_count",
           "triton_available", "use_triton"]

KERNEL_CHOICES = ("auto", "triton", "reference")
NUM_SMS = 132  # an H100's / H200's: launch heuristics' count where there is no device to ask (CPU, the interpreter)
_TRUE = ("1", "true", "on", "yes", "y")  # the values Triton reads TRITON_INTERPRET as on (its `env_bool`)


def check_kernel(kernel, name: str = "kernel") -> str:
    """`kernel` itself, or a ValueError naming the argument."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"{name} must be 'auto', 'triton' or 'reference', got {kernel!r}")
    return kernel


class KernelChoice:
    """A model's checked kernel attribute (`FastLlama.kernels`, `HFBackendModel.kernels`): one of `KERNEL_CHOICES`,
    checked on every assignment (the ValueError names the attribute), kept in the instance's `_<name>`."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj, value) -> None:
        setattr(obj, self.slot, check_kernel(value, self.name))


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install (no driver, wrong version)
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET, read as Triton reads it: "1", "true",
    "on", "yes", "y" in any case; anything else — "0", "2", unset — compiles)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE


@functools.cache
def kernel_module(name: str):
    """`specdec.fast.kernels.<name>` — a module that imports triton — imported on first use (so TRITON_INTERPRET set
    before the first kernel call takes effect), or None where triton does not import (`triton_available`). An
    error inside the module itself is raised, not taken for a missing triton."""
    if not triton_available():
        return None
    return importlib.import_module(f"{__package__}.{name}")


@functools.cache
def sm_count(device: torch.device | None = None) -> int:
    """The streaming multiprocessors of a CUDA `device`; `NUM_SMS` for anything else (CPU tensors, None)."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


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
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"kernel='triton' needs CUDA tensors (or TRITON_INTERPRET=1), got device {device}")
    if not supported:
        raise ValueError(f"kernel='triton' does not cover the shape given to {what}")
    return True


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
