"""`QuantWeight`: one block-quantized matrix `[N, K]` in the layout the CPU kernel reads (`quant_cpu.cpp`).

    w[n, k] = scale[n, k // group] · q[n, k] + offset[n, k // group]     (offset None = 0)

bits 4: q ∈ 0..15, two to a byte, `qs` uint8 `[N, K/2]`: byte j of group g (32 weights) holds q[32g + j] in its low
        nibble and q[32g + 16 + j] in its high one; group 32.
bits 8: q ∈ −128..127, `qs` int8 `[N, K]`; group 32, or 16 (Q6_K's sub-blocks).
scale, offset: float32 `[N, K/group]`.

GGUF's block types map onto it exactly (`blocks.py`): each dequantized weight is the same float32 as gguf's (and so
transformers') dequantization, because every product there (an fp16 scale times a small integer, or an fp16 scale
times a 6-bit sub-block scale) is exact in float32. `join` stacks matrices by rows (q|k|v, gate|up) and, where their
types differ (Q4_K q with a Q6_K v), widens the 4-bit ones to 8 bits and the 32-groups to 16 — still exact, more bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["QuantWeight", "join", "quantized", "quantized_weights", "put_quantized", "embedding", "dense_table",
           "ATTRIBUTE"]

ATTRIBUTE = "specdec_quant"  # the attribute of a model's parameter that carries its QuantWeight (`fast.quant.attach`)


def quantized(weight: torch.Tensor) -> "QuantWeight | None":
    """The `QuantWeight` a model's weight stands for (`fast.quant.attach`), or None for a plain tensor."""
    return getattr(weight, ATTRIBUTE, None)


def put_quantized(model, name: str, layer: int | None, weight) -> None:
    """`model`'s parameter `name` (or `name[layer]`) replaced in place by a "meta" parameter of the quantized
    `weight`'s shape carrying it under `ATTRIBUTE` (GGUF blocks, FP8, int4: the one hook the GEMM helpers read)."""
    p = torch.nn.Parameter(torch.empty(weight.shape, device="meta"), requires_grad=False)
    setattr(p, ATTRIBUTE, weight)
    if layer is None:
        setattr(model, name, p)
    else:
        getattr(model, name)[layer] = p


def embedding(tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`F.embedding(tokens, table)`: tokens `[...]` → `[..., dim]`; a table kept quantized (a "meta" parameter
    carrying a `QuantWeight`, `fast.quant.attach`) gathers its rows dequantized (`QuantWeight.gather`: the same
    float32 as the dense dequantized table's rows, bit for bit), so no dense copy of the table is ever held."""
    if table.is_meta:
        quant = quantized(table)
        if not isinstance(quant, QuantWeight):
            raise ValueError(f"embedding: a meta table {tuple(table.shape)} without the quantized rows to gather")
        return quant.gather(tokens)
    return torch.nn.functional.embedding(tokens, table)


def dense_table(table: torch.Tensor) -> torch.Tensor:
    """`table` `[V, dim]` as a dense tensor: itself, or a quantized one's every row dequantized (a transient copy:
    for the rare whole-table comparison, never the hot path)."""
    return quantized(table).dequantize() if table.is_meta and quantized(table) is not None else table


def quantized_weights(model) -> list:
    """The distinct quantized matrices (`quantized` of each parameter: GGUF blocks, FP8, int4) a model carries."""
    found = {}
    for p in model.parameters():
        q = quantized(p)
        if q is not None:
            found[id(q)] = q
    return list(found.values())


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """A quantized `[N, K]` matrix (see the module doc); `source`: the GGUF type(s) it came from, e.g. "Q4_1"."""

    qs: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    bits: int
    group: int
    shape: tuple[int, int]
    source: str

    def __post_init__(self):
        n, k = self.shape
        if self.bits not in (4, 8) or self.group not in (16, 32) or (self.bits == 4 and self.group != 32):
            raise ValueError(f"QuantWeight: bits 4 (group 32) or 8 (group 16 or 32), got bits {self.bits} group "
                             f"{self.group}")
        if k % 32:
            raise ValueError(f"QuantWeight: K = {k} is not a multiple of 32")
        want = (n, k // 2) if self.bits == 4 else (n, k)
        if tuple(self.qs.shape) != want or self.qs.dtype != (torch.uint8 if self.bits == 4 else torch.int8):
            raise ValueError(f"QuantWeight: qs must be {'uint8' if self.bits == 4 else 'int8'} {want}, got "
                             f"{self.qs.dtype} {tuple(self.qs.shape)}")
        for name, t in (("scale", self.scale), ("offset", self.offset)):
            if t is not None and (tuple(t.shape) != (n, k // self.group) or t.dtype != torch.float32):
                raise ValueError(f"QuantWeight: {name} must be float32 {(n, k // self.group)}, got {t.dtype} "
                                 f"{tuple(t.shape)}")

    @property
    def nbytes(self) -> int:
        """Bytes held (qs, scale, offset)."""
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scale, self.offset) if t is not None)

    def values(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """q of rows [start, stop) as int16 `[n, K]`."""
        qs = self.qs[start:stop]
        if self.bits == 8:
            return qs.to(torch.int16)
        lo, hi = (qs & 15).view(qs.shape[0], -1, 16), (qs >> 4).view(qs.shape[0], -1, 16)
        return torch.cat([lo, hi], dim=-1).view(qs.shape[0], -1).to(torch.int16)

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The float32 rows [start, stop) `[n, K]`: the reference the kernel is tested against."""
        q = self.values(start, stop).float().view(-1, self.shape[1] // self.group, self.group)
        w = q * self.scale[start:stop, :, None]
        if self.offset is not None:
            w = w + self.offset[start:stop, :, None]
        return w.view(-1, self.shape[1])

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """The rows `index` (any shape, int64) dequantized: float32 `[*index.shape, K]`, each row the same values as
        `dequantize()`'s (the same elementwise products; only the rows asked for are made) — an embedding's gather."""
        flat = index.reshape(-1).to(device=self.qs.device, dtype=torch.long)
        return self.select_rows(flat).dequantize().view(*index.shape, self.shape[1])

    def select_rows(self, index: torch.Tensor) -> "QuantWeight":
        """The rows `index` (a permutation or subset), still quantized."""
        pick = lambda t: None if t is None else t.index_select(0, index).contiguous()  # noqa: E731
        return QuantWeight(pick(self.qs), pick(self.scale), pick(self.offset), self.bits, self.group,
                           (int(index.numel()), self.shape[1]), self.source)

    def widened(self, bits: int, group: int) -> "QuantWeight":
        """The same weights with more bits per value and / or smaller groups (exact)."""
        if (bits, group) == (self.bits, self.group):
            return self
        if bits < self.bits or group > self.group or self.group % group:
            raise ValueError(f"cannot narrow a {self.bits}-bit group-{self.group} weight to {bits}-bit group {group}")
        qs = self.values().to(torch.int8) if bits == 8 and self.bits == 4 else self.qs  # (0..15 fits int8)
        repeat = self.group // group
        scale = self.scale.repeat_interleave(repeat, dim=1)
        offset = None if self.offset is None else self.offset.repeat_interleave(repeat, dim=1)
        return QuantWeight(qs.contiguous(), scale, offset, bits, group, self.shape, self.source)


def join(weights: list[QuantWeight]) -> QuantWeight:
    """Stack matrices of one K by rows `[ΣN, K]` (q|k|v, gate|up), widened to a common layout where they differ."""
    if len({w.shape[1] for w in weights}) != 1:
        raise ValueError(f"join: the matrices' K differ: {[w.shape for w in weights]}")
    bits, group = max(w.bits for w in weights), min(w.group for w in weights)
    parts = [w.widened(bits, group) for w in weights]
    offsets = [p.offset for p in parts]
    if any(o is not None for o in offsets):
        offsets = [torch.zeros_like(p.scale) if o is None else o for p, o in zip(parts, offsets)]
        offset = torch.cat(offsets)
    else:
        offset = None
    sources = "+".join(dict.fromkeys(w.source for w in weights))
    return QuantWeight(torch.cat([p.qs for p in parts]), torch.cat([p.scale for p in parts]), offset, bits, group,
                       (sum(p.shape[0] for p in parts), parts[0].shape[1]), sources)
