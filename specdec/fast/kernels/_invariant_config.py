"""Launch configs of the bitwise GEMM (`_invariant_triton.matmul`): what may change with M and what may not.

An output element's bits are fixed by its K reduction: the K splits (`split_k` ranges of `k_range(K)` elements,
summed in split order in fp32) and, inside a split, the BLOCK_K steps, each one `tl.dot` accumulated in K order.
That ORDER — (block_k, split_k) — is a function of the weight's (N, K) only (`fixed_config`).

The rest of a launch changes which program computes an element, not how: the output tile (block_m × block_n), the
warps, the pipeline stages, and whether one program runs its splits one after the other itself (`fuse_splits`: the
same fp32 partials added in the same order, without the partials' round trip through memory and the second
launch). `candidates_for` / `config_for(n, k, m)` pick those per M range (`range_tiles`): the fixed config up to
SMALL_M rows (decode steps: tuned for M = 1), taller tiles above (verify passes, batches, prefill). Whether the
tensor-core instruction Triton picks for another tile shape (on Hopper: mma.sync for a 32-wide tile, wgmma for 64
and more) sums an element's 16-wide K slice the same way is a fact of the hardware and the compiler, not of this
code: `_invariant_triton.tile_probe` checks every candidate tile on the device once per process, dtype and base
tile, and `launch_config` runs the first candidate of M's range that kept every bit (else the fixed config);
tests/fast/kernels/test_invariant_tiles.py proves it on the 8B shapes (GPU-marked; on an H200 every candidate,
wgmma or mma.sync, splits fused or stored, kept every bit — and so did another BLOCK_K over the same K ranges:
`tl.dot` runs the 16-wide steps one after the other into one accumulator; another split count did not).

Pure Python (no Triton import): the CPU tests check the table's invariants without the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["MatmulConfig", "Tile", "MATMUL", "fixed_config", "range_tiles", "config_for", "candidates_for", "SMALL_M",
           "FUSE_PROGRAMS"]


@dataclass(frozen=True)
class Tile:
    """The part of a launch that may change with M: output tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MatmulConfig:
    """One launch of the invariant GEMM. The summation order is `order` = (block_k, split_k): split_k K ranges
    (each a multiple of block_k, the last one ragged) reduced separately and then summed in split order (1: no
    split). fuse_splits: one program runs all its splits and sums them itself (the same order as the separate
    reduce kernel); only meaningful with split_k > 1."""

    block_m: int = 32
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1
    fuse_splits: bool = False

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"MatmulConfig.{name} must be a power of two >= 16, got {v!r}")
        for name in ("split_k", "num_warps", "num_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MatmulConfig.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.fuse_splits, bool):
            raise ValueError(f"MatmulConfig.fuse_splits must be True or False, got {self.fuse_splits!r}")

    @property
    def order(self) -> tuple[int, int]:
        """(block_k, split_k): what fixes an element's bits."""
        return self.block_k, self.split_k

    @property
    def tile(self) -> Tile:
        return Tile(self.block_m, self.block_n, self.num_warps, self.num_stages)

    def with_tile(self, tile: Tile, fuse_splits: bool = False) -> MatmulConfig:
        """This order with another tile (fuse_splits only where there are splits)."""
        return replace(self, block_m=tile.block_m, block_n=tile.block_n, num_warps=tile.num_warps,
                       num_stages=tile.num_stages, fuse_splits=fuse_splits and self.split_k > 1)

    def k_range(self, k: int) -> int:
        """K elements per split (a multiple of block_k)."""
        steps = -(-k // self.block_k)
        return -(-steps // self.split_k) * self.block_k

    def name(self) -> str:
        return (f"bm{self.block_m}_bn{self.block_n}_bk{self.block_k}_w{self.num_warps}_st{self.num_stages}"
                f"_s{self.split_k}{'f' if self.fuse_splits else ''}")


MATMUL = MatmulConfig()  # the wide-N default (gate_up); scripts/bench_bitwise.py times alternatives
TARGET_PROGRAMS = 512  # split K until an M = 1 launch has this many programs (H100/H200: 132 SMs, ~4 each) ...
MIN_SPLIT_K = 1024  # ... while every split keeps at least this many K elements
MAX_SPLITS = 8
VOCAB_N = 65536  # N from here on: an output head (one call per step, at every M)

SMALL_M = 16  # up to this many rows: the fixed config (decode steps)
FUSE_PROGRAMS: int | None = None  # fuse the K splits into one program when the tiles give this many programs;
# None: never — the fused splits measured slower than the stored ones at every 8B shape up to M = 320 (H200,
# BENCHMARKS.md: e.g. o 320 rows 94 vs 72 µs), but they keep the bits (tested) and stay a launch option


def fixed_config(n: int, k: int) -> MatmulConfig:
    """The config of an [N, K] weight for every M (the order, and the tiles of the small-M range) — a function of
    (N, K) only. From BENCHMARKS.md's bitwise GEMM rows (H200, bf16, 8B matrices): the narrow bn32/bk128 tile is
    fastest for N <= 8192 at M <= 64; bn64/bk64 for the wide gate_up at M = 1; a vocabulary-sized N (lm_head) takes
    64 × 128 tiles on 8 warps. K is split (fixed per shape) until an M = 1 launch fills the GPU: the 8B down
    projection (4096 × 14336) runs 4 splits (M = 1: 47 µs vs 96 unsplit; cuBLAS 34)."""
    if n >= VOCAB_N:
        return MatmulConfig(64, 128, 64, num_warps=8, num_stages=3)
    base = MatmulConfig(32, 32, 128) if n <= 8192 else MATMUL
    tiles = -(-n // base.block_n)
    splits = 1
    while splits < MAX_SPLITS and tiles * splits < TARGET_PROGRAMS and -(-k // (2 * splits)) >= MIN_SPLIT_K:
        splits *= 2
    return replace(base, split_k=splits)


def range_tiles(base: MatmulConfig) -> tuple[tuple[int | None, tuple[Tile, ...]], ...]:
    """The M ranges of a weight whose fixed config is `base`: (largest M of the range or None, its candidate
    tiles, preferred first), in order. Measured (H200, bf16, the 8B matrices in CUDA graphs at M = 64 and 320,
    BENCHMARKS.md): a 32-wide base (K steps of 128) runs fastest on 64 × 64 tiles on 4 warps (qkv 320 rows: 101 µs
    vs 179 fixed; down 222 vs 375) — wgmma on Hopper; it keeps a 64-row tile of its own width as a second choice
    (mma.sync, the base's own instruction) for a device whose wgmma would sum a K slice otherwise; a 64-wide base
    (gate_up) 64 × 128 on 8 warps (320 rows: 367 vs 520); a vocabulary-sized base (64 × 128 already) its own tile
    at every M (128 × 128 tiles: 1961 vs 1385 µs at 320 rows). 128 × 128 tiles lost everywhere."""
    if base.block_n >= 128:
        return ((None, (base.tile,)),)
    if base.block_n >= 64:
        above = (Tile(64, 128, 8, 3),)
    else:
        above = (Tile(64, 64, 4, 3), Tile(64, base.block_n, 4, 3))
    return ((SMALL_M, (base.tile,)), (None, above))


def config_for(n: int, k: int, m: int | None = None) -> MatmulConfig:
    """The launch config of an [N, K] weight for M rows: `fixed_config(n, k)` when m is None, else the preferred
    config of m's range (`candidates_for(...)[0]`). Which one runs is `_invariant_triton.launch_config`'s call."""
    base = fixed_config(n, k)
    return base if m is None else candidates_for(base, n, m)[0]


def candidates_for(base: MatmulConfig, n: int, m: int) -> tuple[MatmulConfig, ...]:
    """base's order with each candidate tile of m's range (`range_tiles`), preferred first, for N output columns;
    the splits fused into one program where the tiles alone give FUSE_PROGRAMS programs (never, as measured).
    `(base,)` up to SMALL_M rows."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise ValueError(f"m must be an integer >= 0, got {m!r}")
    tiles = next(t for top, t in range_tiles(base) if top is None or m <= top)
    out = []
    for tile in tiles:
        programs = -(-m // tile.block_m) * -(-n // tile.block_n)
        fuse = FUSE_PROGRAMS is not None and programs >= FUSE_PROGRAMS
        out.append(base if tile == base.tile else base.with_tile(tile, fuse_splits=fuse))
    return tuple(out)
