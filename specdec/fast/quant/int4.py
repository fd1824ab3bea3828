"""`Int4Weight`: a 4-bit weight-only matrix `[N, K]` from a GPTQ or AWQ checkpoint, in the layout the GPU kernel reads
(`fast.kernels.quant_triton`, format 0):

    w[n, k] = (q[k, n] − z[k // G, n]) · s[k // G, n]        q, z ∈ 0..15 (z ≤ 16: GPTQ's stored zero + 1), G = group

qweight int32 `[N, K/8]`: k = 8i + j sits in bits 4j..4j+3 of word i of row n (GPTQ's own words, transposed so each
output row's words are contiguous, as the kernel's K-major tiles read them); zeros uint8 `[K/G, N]` (unpacked: 1/64
of the packed weight's bytes at G = 128); scales `[K/G, N]` in the checkpoint's dtype.

Layouts read (`from_gptq`, `from_awq`), exactly — the same integers, zeros and scales, so the dequantized weight is
the checkpoint's own:
  GPTQ  qweight int32 `[K/8, N]` (packed along K), qzeros int32 `[K/G, N/8]` (packed along N, n = 8i + j in bits 4j),
        scales `[K/G, N]`, g_idx `[K]`. checkpoint_format "gptq" (auto-gptq, v1) stores z − 1, "gptq_v2" z itself.
        Act-order (a g_idx other than k // G) is refused: its groups are not contiguous runs of K.
  AWQ   (GEMM version) qweight int32 `[K, N/8]` and qzeros `[K/G, N/8]` packed along N in the order
        0, 2, 4, 6, 1, 3, 5, 7 (nibble p holds column 8i + order[p]), scales `[K/G, N]`; z stored as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Int4Weight", "from_gptq", "from_awq", "join", "unpack_rows", "unpack_columns", "pack_rows", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of an AWQ int32 holds column 8i + AWQ_ORDER[p]


def _shifts(device) -> torch.Tensor:
    return torch.arange(0, 32, 4, dtype=torch.int32, device=device)  # (made on the device: no copy, capture-safe)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 `[R/8, C]` packed along rows (row 8i + j in bits 4j) → uint8 `[R, C]`."""
    q = (packed[:, None, :] >> _shifts(packed.device)[None, :, None]) & 0xF
    return q.reshape(-1, packed.shape[1]).to(torch.uint8)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """uint8 values 0..15 `[R, C]` (R % 8 == 0) → int32 `[R/8, C]` (row 8i + j in bits 4j): `unpack_rows`'s inverse."""
    parts = q.to(torch.int32).view(-1, 8, q.shape[1]) << _shifts(q.device)[None, :, None]
    out = parts[:, 0].contiguous()
    for j in range(1, 8):
        out |= parts[:, j]
    return out


def unpack_columns(packed: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 `[R, C/8]` packed along columns (nibble p holds column 8i + order[p], order None = p) → uint8 `[R, C]`."""
    q = (packed[:, :, None] >> _shifts(packed.device)[None, None, :]) & 0xF  # [R, C/8, nibble]
    if order is not None:
        where = [order.index(c) for c in range(8)]  # column c's nibble
        q = q[:, :, where]
    return q.reshape(packed.shape[0], -1).to(torch.uint8)


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A 4-bit `[N, K]` matrix (module doc); `source`: "GPTQ" or "AWQ" (for the log line)."""

    qweight: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group: int
    shape: tuple[int, int]
    source: str

    def __post_init__(self):
        n, k = self.shape
        if self.group < 16 or self.group & (self.group - 1) or k % self.group:
            raise ValueError(f"Int4Weight: the group must be a power of two ≥ 16 dividing K = {k}, got {self.group}")
        checks = (("qweight", self.qweight, (n, k // 8), (torch.int32,)),
                  ("zeros", self.zeros, (k // self.group, n), (torch.uint8,)),
                  ("scales", self.scales, (k // self.group, n), (torch.float16, torch.bfloat16, torch.float32)))
        for name, t, want, dtypes in checks:
            if tuple(t.shape) != want or t.dtype not in dtypes or not t.is_contiguous():
                raise ValueError(f"Int4Weight: {name} must be a contiguous {'/'.join(map(str, dtypes))} {want}, got "
                                 f"{t.dtype} {tuple(t.shape)}")

    @property
    def format(self) -> str:
        return f"{self.source} int4 (group {self.group})"

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.zeros, self.scales))

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def values(self) -> torch.Tensor:
        """q as uint8 `[K, N]`."""
        return unpack_rows(self.qweight.t())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`[N, K]` in `dtype`, computed in float32 (the reference the kernel is tested against)."""
        g = self.group
        q = self.values().view(-1, g, self.shape[0]).float()
        w = (q - self.zeros.float()[:, None]) * self.scales.float()[:, None]
        return w.reshape(self.shape[1], self.shape[0]).t().to(dtype)

    def kernel_args(self):
        return "int4", self.qweight, self.zeros, self.scales, self.group

    def to(self, device) -> "Int4Weight":
        return Int4Weight(self.qweight.to(device), self.zeros.to(device), self.scales.to(device), self.group,
                          self.shape, self.source)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
        """x `[..., K]` @ Wᵀ (+ bias) → `[..., N]` in x's dtype (`fast.kernels.quant_linear.weight_only`)."""
        from specdec.fast.kernels.quant_linear import weight_only

        return weight_only(x, self, bias, None, kernel)

    def add_linear_(self, residual: torch.Tensor, x: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
        """residual += x @ Wᵀ in place; returns residual."""
        from specdec.fast.kernels.quant_linear import weight_only

        return weight_only(x, self, None, residual, kernel)


def join(weights: list) -> "Int4Weight":
    """Stack matrices of one K by output rows (q|k|v, gate|up)."""
    first = weights[0]
    if any(w.shape[1] != first.shape[1] or w.group != first.group for w in weights):
        raise ValueError(f"join: K and group must agree, got {[(w.shape, w.group) for w in weights]}")
    cat = lambda name: torch.cat([getattr(w, name) for w in weights], dim=1).contiguous()  # noqa: E731
    return Int4Weight(torch.cat([w.qweight for w in weights]).contiguous(), cat("zeros"), cat("scales"),
                      first.group, (sum(w.shape[0] for w in weights), first.shape[1]), first.source)


def _group_of(k: int, rows: int) -> int:
    if rows < 1 or k % rows:
        raise ValueError(f"the scales' rows ({rows}) must divide K = {k}")
    return k // rows


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None = None,
              *, bits: int = 4, checkpoint_format: str = "gptq", name: str = "weight") -> Int4Weight:
    """A GPTQ linear's tensors (module doc) → `Int4Weight`; ValueError naming `name` for what it does not cover."""
    if bits != 4:
        raise ValueError(f"{name}: GPTQ with bits={bits} is not covered (4-bit only)")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"{name}: GPTQ checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    group = _group_of(k, scales.shape[0])
    if g_idx is not None and not torch.equal(g_idx.long().cpu(), torch.arange(k) // group):
        raise ValueError(f"{name}: act-order GPTQ (desc_act, a permuted g_idx) is not covered")
    zeros = unpack_columns(qzeros.to(torch.int32))[:, :n].to(torch.int16)
    zeros = zeros + 1 if checkpoint_format == "gptq" else zeros
    return Int4Weight(qweight.to(torch.int32).t().contiguous(), zeros.to(torch.uint8).contiguous(),
                      scales.contiguous(), group, (n, k), "GPTQ")


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, bits: int = 4,
             name: str = "weight") -> Int4Weight:
    """An AWQ (GEMM) linear's tensors (module doc) → `Int4Weight`, repacked along K (the same integers)."""
    if bits != 4:
        raise ValueError(f"{name}: AWQ with bits={bits} is not covered (4-bit only)")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    group = _group_of(k, scales.shape[0])
    if k % 8:
        raise ValueError(f"{name}: K = {k} is not a multiple of 8")
    q = unpack_columns(qweight.to(torch.int32), AWQ_ORDER)
    zeros = unpack_columns(qzeros.to(torch.int32), AWQ_ORDER)[:, :n]
    return Int4Weight(pack_rows(q).t().contiguous(), zeros.contiguous(), scales.contiguous(), group, (n, k), "AWQ")
