"""The flat pool entries a forward's new K/V go to, through the block table, in one launch.

`paged_slots_reference` is the definition (`fast.cache.PagedKVCache.write_index`): slot t of row b lands in block
`table[b, t // block_size]` at offset `t % block_size`, i.e. flat entry `block · block_size + offset`; the junk slot
(the span's last, where padding writes) and anything past it go to the null block's entry 0. In torch that is ~10
small kernels per forward (a floor division, a clamp, a gather, a cast, a product, a remainder, a sum, a comparison,
a fill, a select); on an H200 they cost a batch-1 speculative step ~100 µs of its ~1.1 ms (five forwards: γ = 4
draft steps and the verify), the paged pool's main cost over the static layout there
(`scripts/profile_paged_draft.py`). The Triton kernel computes the same integers in one launch.

Shapes: table `[B, C]` int32 (a row's stride free, columns contiguous), slots `[B, k]` long → `[B, k]` long.
"""

from __future__ import annotations

import functools
import logging

import torch

from specdec.fast.kernels.select import next_power_of_2, use_triton

__all__ = ["paged_slots", "paged_slots_reference"]

logger = logging.getLogger(__name__)
_FAILED: list[str] = []


def paged_slots_reference(table: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """The definition (the module doc): `[B, k]` long flat pool entries."""
    span = table.shape[1] * block_size
    block = table.gather(1, (slots // block_size).clamp(max=table.shape[1] - 1)).long()
    flat = block * block_size + slots % block_size
    return torch.where(slots >= span - 1, torch.zeros_like(flat), flat)


def paged_slots(table: torch.Tensor, slots: torch.Tensor, block_size: int, *, kernel: str = "auto") -> torch.Tensor:
    """`paged_slots_reference`'s integers. kernel: "auto" (Triton on CUDA), "triton" (forced; also in Triton's
    interpreter), "reference". No host synchronization: capturable in a CUDA graph once warm."""
    if table.dim() != 2 or slots.dim() != 2 or slots.shape[0] != table.shape[0]:
        raise ValueError(f"paged_slots needs table [B, C] and slots [B, k], got {tuple(table.shape)} and "
                         f"{tuple(slots.shape)}")
    supported = (table.dtype == torch.int32 and slots.dtype == torch.long and table.shape[1] > 0
                 and (table.stride(1) == 1 or table.shape[1] == 1) and table.device == slots.device)
    if not use_triton(kernel, slots.device, supported and not (kernel == "auto" and _FAILED), "paged_slots"):
        return paged_slots_reference(table, slots, block_size)
    if kernel == "auto" and not (slots.is_cuda and torch.cuda.is_current_stream_capturing()):
        try:  # (the first call compiles, in a warm-up before any capture: a build failure falls back, once, loudly)
            return _launch(table, slots, block_size)
        except Exception as err:  # noqa: BLE001 - a Triton/driver build error
            _FAILED.append(f"{type(err).__name__}: {err}")
            logger.warning("paged_slots: the Triton kernel failed (%s); torch runs instead", _FAILED[0])
            return paged_slots_reference(table, slots, block_size)
    return _launch(table, slots, block_size)


def _launch(table: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    batch, k = slots.shape
    slots = slots.contiguous()
    out = torch.empty_like(slots)
    if slots.numel():
        _kernel()[(batch,)](table, slots, out, k, table.shape[1], table.stride(0), table.shape[1] * block_size,
                            SIZE=block_size, BLOCK=next_power_of_2(k), num_warps=1)
    return out


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def paged_slots_kernel(table_ptr, slots_ptr, out_ptr, k, cols, stride_row, span, SIZE: tl.constexpr,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < k
        slot = tl.load(slots_ptr + row * k + offs, mask=mask, other=0)
        col = tl.minimum(slot // SIZE, cols - 1)
        block = tl.load(table_ptr + row * stride_row + col, mask=mask, other=0).to(tl.int64)
        flat = tl.where(slot >= span - 1, 0, block * SIZE + slot % SIZE)
        tl.store(out_ptr + row * k + offs, flat, mask=mask)

    return paged_slots_kernel
