"""The bitwise GEMM's M-range tiles (`_invariant_config.config_for(n, k, m)`, `_invariant_triton.launch_config`): only
the tile, warps, stages and fused-vs-stored splits follow M; the summation order (BLOCK_K, split-K) stays a function
of (N, K). On CPU: the table's invariants, and Triton-interpreter runs at several tile shapes (numpy arithmetic:
equal bits there prove the indexing, not the hardware) with the device probe's logic and its negative control. On
the GPU (marked): the proof — a row's output bits on the 8B matrix shapes are the same at every M with the M-range
tiles, and a config of another order changes some bits (the check has power)."""

import importlib.util
from dataclasses import replace

import pytest
import torch

from specdec.fast.kernels import _invariant_config as cfgs
from specdec.fast.kernels._invariant_config import MatmulConfig, Tile, config_for, fixed_config

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
pytestmark = pytest.mark.usefixtures("fixed_order_dot")  # the interpreter's tl.dot without the host's BLAS
LLAMA_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
            "lm_head": (128256, 4096)}
HEIGHTS = [1, 5, 8, 64, 65, 320, 512]


def rnd(*shape, seed=0, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ the table
def test_fixed_config_depends_on_the_weight_shape_only():
    """The 8B down projection (4096 × 14336) splits K four ways (512 programs at M = 1); the wide lm_head (its own
    64 × 128 tiles) and a small model's K = 576 do not split; every split keeps >= MIN_SPLIT_K."""
    assert fixed_config(4096, 14336).split_k == 4
    assert fixed_config(128256, 4096).split_k == 1 and fixed_config(576, 576).split_k == 1
    assert fixed_config(128256, 4096) == MatmulConfig(64, 128, 64, num_warps=8, num_stages=3)
    assert config_for(4096, 14336) == fixed_config(4096, 14336)
    for n, k in [(4096, 4096), (6144, 4096), (28672, 4096), (1000, 4096), (4096, 14336)]:
        c = fixed_config(n, k)
        assert c.k_range(k) >= cfgs.MIN_SPLIT_K or c.split_k == 1, (n, k, c)


@pytest.mark.parametrize("n, k", [*LLAMA_8B.values(), (576, 576), (1536, 576), (49152, 576), (1000, 80)])
def test_m_changes_the_tile_never_the_order(n, k):
    """For every M: the same (block_k, split_k) and K ranges as the fixed config; the fixed config itself up to
    SMALL_M rows; splits fused only where there are splits; each range's tile is the one `range_tiles` names."""
    base = fixed_config(n, k)
    ranges = cfgs.range_tiles(base)
    for m in [0, 1, 2, 5, 8, 15, 16, 17, 63, 64, 65, 127, 128, 129, 320, 512, 4096]:
        candidates = cfgs.candidates_for(base, n, m)
        assert config_for(n, k, m) == candidates[0]
        tiles = next(t for top, t in ranges if top is None or m <= top)
        assert [c.tile for c in candidates] == list(tiles)
        for c in candidates:
            assert c.order == base.order and c.k_range(k) == base.k_range(k), (m, c)
            assert not c.fuse_splits or c.split_k > 1
        if m <= cfgs.SMALL_M:
            assert candidates == (base,)


def test_the_table_varies_on_the_8b_shapes_and_refuses_bad_arguments():
    """Not a table that never changes: qkv and gate_up get another tile above SMALL_M rows (the measured ones:
    64 × 64, 64 × 128); the vocabulary-sized lm_head keeps its own at every M; no split is fused (FUSE_PROGRAMS)."""
    assert config_for(6144, 4096, 1).tile != config_for(6144, 4096, 64).tile == Tile(64, 64, 4, 3)
    assert config_for(28672, 4096, 320).tile == Tile(64, 128, 8, 3) != config_for(28672, 4096, 8).tile
    assert {config_for(128256, 4096, m) for m in (1, 64, 320, 512)} == {fixed_config(128256, 4096)}
    assert cfgs.FUSE_PROGRAMS is None and not any(config_for(n, k, m).fuse_splits for n, k in LLAMA_8B.values()
                                                   for m in (64, 320, 4096))
    with pytest.raises(ValueError, match="m must be"):
        config_for(64, 64, -1)
    with pytest.raises(ValueError, match="block_k"):
        MatmulConfig(32, 32, 24)
    with pytest.raises(ValueError, match="split_k"):
        MatmulConfig(32, 32, 32, split_k=0)
    with pytest.raises(ValueError, match="fuse_splits"):
        MatmulConfig(fuse_splits=1)


# ------------------------------------------------------------------------------------- Triton's interpreter
SMALL = MatmulConfig(16, 16, 16, 1, 1, split_k=3)  # K = 80: three ranges of 2 · 16, the last one ragged
SMALL_RANGES = ((16, (SMALL.tile,)), (32, (Tile(32, 32, 1, 1), Tile(32, 16, 1, 1))), (None, (Tile(64, 32, 2, 1),)))


@pytest.fixture
def kt(monkeypatch):
    if not HAS_TRITON:
        pytest.skip("needs triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs on CPU tensors (tests/conftest.py sets TRITON_INTERPRET without CUDA)")
    from specdec.fast.kernels import _invariant_triton

    monkeypatch.setattr(_invariant_triton, "_PROBES", {})
    monkeypatch.setattr(_invariant_triton, "_LAUNCH", {})
    return _invariant_triton


def test_interpreter_tiles_and_fused_splits_give_the_same_bits(kt):
    """Three tiles, splits stored (the reduce kernel) or fused (summed in the program), bias and residual: every
    element the same bits (numpy arithmetic: this proves the indexing and the split order). The control: another
    BLOCK_K or split count is another order, and shows in the bits."""
    n, k, m = 40, 80, 37
    x, w, b, r = rnd(m, k, seed=1), rnd(n, k, seed=2), rnd(n, seed=3), rnd(m, n, seed=4)
    x = x * torch.exp2(torch.randint(-8, 9, x.shape, generator=torch.Generator().manual_seed(5)))

    def run(c: MatmulConfig) -> torch.Tensor:
        out = torch.empty(m, n)
        kt.matmul(x, w, b, r, out, c)
        return out

    want = run(SMALL)
    torch.testing.assert_close(want, x @ w.T + b + r, rtol=1e-5, atol=1e-4)
    for _, tiles in SMALL_RANGES:
        for tile in tiles:
            for fuse in (False, True):
                assert torch.equal(run(SMALL.with_tile(tile, fuse)), want), (tile, fuse)
    assert not torch.equal(run(replace(SMALL, block_k=32)), want)
    assert not torch.equal(run(replace(SMALL, split_k=2)), want)


def test_interpreter_probe_and_its_negative_control(kt, monkeypatch):
    """`probe_tiles` on a small base: every candidate tile agrees; with tiles that (as a device summing a K slice
    another way would) also change the K step, it names them all."""
    monkeypatch.setattr(kt, "range_tiles", lambda base: SMALL_RANGES)
    monkeypatch.setattr(kt, "PROBE_SHAPE", (40, 64, 6))  # (the interpreter is slow)
    base = replace(SMALL, split_k=1)
    good = kt.probe_tiles(base, torch.float32, "cpu")
    assert good.same and len(good.checked) == 3 and good.base.endswith("_s2")  # the 3 other tiles, splits stored
    assert good.agrees(base.with_tile(Tile(32, 16, 1, 1))) and not good.agrees(replace(SMALL, fuse_splits=True))
    assert not good.agrees(base.with_tile(Tile(128, 16, 1, 1)))  # never checked
    monkeypatch.setattr(cfgs, "FUSE_PROGRAMS", 1)  # a table that fuses: the fused variants are checked too
    good = kt.probe_tiles(base, torch.float32, "cpu")
    assert good.same and len(good.checked) == 7 and good.agrees(replace(SMALL, fuse_splits=True))
    broken = lambda self, tile, fuse_splits=False: replace(  # noqa: E731
        self, block_m=tile.block_m, block_n=tile.block_n, block_k=32, fuse_splits=fuse_splits)
    monkeypatch.setattr(MatmulConfig, "with_tile", broken)
    bad = kt.probe_tiles(base, torch.float32, "cpu")
    assert not bad.same and bad.differs == bad.checked and len(bad.checked) == 8  # the base tile too


def test_launch_config_follows_the_probe(kt, monkeypatch):
    """Above SMALL_M rows the first candidate whose tile the probe found bit-identical runs (here the narrow one,
    the wide one having differed); none: the fixed config. One probe per (device, dtype, base tile)."""
    n, k, m = 6144, 4096, 320
    base = fixed_config(n, k)
    wide, narrow = cfgs.candidates_for(base, n, m)
    mid_wide, mid_narrow = cfgs.candidates_for(base, n, 64)
    name = lambda c: replace(c, split_k=2).name()  # noqa: E731  (the probe's own configs have 2 splits)
    checked = tuple(name(c) for c in (wide, narrow, mid_wide, mid_narrow))
    verdicts = iter([kt.TileProbe("bf16", "b", checked, differs=(name(wide), name(mid_wide))),
                     kt.TileProbe("bf16", "b", checked, differs=checked)])
    calls = []
    monkeypatch.setattr(kt, "probe_tiles", lambda *a: calls.append(a) or next(verdicts))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert kt.launch_config(n, k, m, torch.bfloat16, "cuda") == narrow != wide
    assert kt.launch_config(n, k, 64, torch.bfloat16, "cuda") == mid_narrow != mid_wide
    assert kt.launch_config(n, k, 8, torch.bfloat16, "cuda") == base and len(calls) == 1  # once per key
    assert kt.launch_config(n, k, m, torch.float16, "cuda") == base and len(calls) == 2  # another dtype: probed


def test_tiles_switch(kt, monkeypatch):
    """TILES_BY_M / $SPECDEC_BITWISE_TILES: forced on (the preferred tiles) or off without a probe; a bad value is
    refused by name; under graph capture an unprobed base keeps the fixed config (no device sync there); fp32 and
    off CUDA, "probe" means fixed."""
    n, k, m = 28672, 4096, 320
    base = fixed_config(n, k)
    monkeypatch.setattr(kt, "TILES_BY_M", True)
    assert kt.launch_config(n, k, m, torch.bfloat16, "cpu") == config_for(n, k, m) != base
    monkeypatch.setattr(kt, "TILES_BY_M", False)
    assert kt.launch_config(n, k, m, torch.bfloat16, "cpu") == base
    monkeypatch.setattr(kt, "TILES_BY_M", None)
    monkeypatch.setenv(kt.TILES_ENV, "by_m")
    assert kt.launch_config(n, k, m, torch.bfloat16, "cpu") == config_for(n, k, m)
    monkeypatch.setenv(kt.TILES_ENV, "sometimes")
    with pytest.raises(ValueError, match=kt.TILES_ENV):
        kt.launch_config(n, k, m, torch.bfloat16, "cpu")
    monkeypatch.setenv(kt.TILES_ENV, "probe")
    monkeypatch.setattr(kt, "probe_tiles", lambda *a: pytest.fail("probed"))
    assert kt.launch_config(n, k, m, torch.bfloat16, "cpu") == base
    assert kt.launch_config(n, k, m, torch.float32, "cuda") == base
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert kt.launch_config(n, k, m, torch.bfloat16, "cuda") == base
    assert "capture" in next(iter(kt._PROBES.values())).reason


# ------------------------------------------------------------------------------------------------------ GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def grnd(*shape, seed=0, dtype=torch.bfloat16):
    """Random normal on the GPU (the 8B weights, 0.5G elements for lm_head, are slow to draw on the host)."""
    return torch.randn(*shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)


def placed(target: torch.Tensor, m: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    """m random rows with the target rows `[T, K]` at spread places (which place, and which neighbours, change
    with m), and those places."""
    rows = grnd(m, target.shape[1], seed=seed, dtype=target.dtype)
    count = min(len(target), m)
    places = sorted({(i * (m - 1)) // max(count - 1, 1) for i in range(count)} if count > 1 else {m - 1})
    rows[places] = target[: len(places)]
    return rows, places


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("matrix, dtype, choice", [*((name, torch.bfloat16, 0) for name in LLAMA_8B),
                                                   ("qkv", torch.float16, 0), ("gate_up", torch.float16, 0),
                                                   ("qkv", torch.bfloat16, 1), ("down", torch.bfloat16, 1)])
def test_gpu_m_range_tiles_keep_every_bit_on_the_8b_shapes(monkeypatch, matrix, dtype, choice):
    """The proof: with the M-range tiles forced on (choice 0: the preferred candidates, wide tiles; 1: the narrow
    ones a 32-wide base also has), a row's output bits (in x's dtype, through `invariant_linear`, the residual
    added in place where the model does) are those of the row alone, for M in 1, 5, 8, 64, 65, 320, 512, at spread
    places among other random rows; and at M = 320 and 512 the fp32 accumulators themselves (fp32 outputs) of the
    M-range configs equal the fixed config's."""
    from specdec.fast.kernels import _invariant_triton as kt
    from specdec.fast.kernels.invariant import invariant_linear

    monkeypatch.setattr(kt, "TILES_BY_M", True)
    monkeypatch.setattr(kt, "_LAUNCH", {})  # (launch_config's cache: the table may be patched below)
    if choice:
        ranges = cfgs.range_tiles
        monkeypatch.setattr(cfgs, "range_tiles", lambda base: tuple((top, t[choice:] or t) for top, t in ranges(base)))
    n, k = LLAMA_8B[matrix]
    w = grnd(n, k, seed=1, dtype=dtype) / k ** 0.5
    with_residual = matrix in ("o", "down")
    target = grnd(4, k, seed=2, dtype=dtype)
    res_target = grnd(4, n, seed=3, dtype=dtype)

    def call(rows, res):
        if not with_residual:
            return invariant_linear(rows, w)
        out = res.clone()
        return invariant_linear(rows, w, residual=out, out=out)

    alone = torch.cat([call(target[i : i + 1], res_target[i : i + 1]) for i in range(4)])
    tiles = set()
    for m in HEIGHTS:
        rows, places = placed(target, m, seed=m)
        res, _ = placed(res_target, m, seed=1000 + m)
        got = call(rows, res)
        for i, p in enumerate(places):
            assert torch.equal(got[p], alone[i]), (matrix, m, p)
        c = kt.launch_config(n, k, m, dtype, w.device)
        assert c.order == kt.fixed_config(n, k).order
        tiles.add(c.tile)
    if len(cfgs.range_tiles(kt.fixed_config(n, k))) > 1:
        assert len(tiles) >= 2, tiles  # the M-range tiles did run (lm_head: its own tile at every M)
    for m in (320, 512):
        rows, _ = placed(target, m, seed=m)
        fixed = torch.empty(m, n, device="cuda", dtype=torch.float32)
        kt.matmul(rows, w, None, None, fixed, kt.fixed_config(n, k))
        for c in {*cfgs.candidates_for(kt.fixed_config(n, k), n, m), *cfgs.candidates_for(kt.fixed_config(n, k), n, 64),
                  replace(kt.config_for(n, k, m), fuse_splits=True)}:
            acc = torch.empty_like(fixed)
            kt.matmul(rows, w, None, None, acc, c)
            assert torch.equal(acc, fixed), (matrix, m, c.name())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("matrix", ["qkv", "down"])
def test_gpu_another_order_changes_bits(matrix):
    """The negative control: the same inputs under another split count (other K ranges, summed separately) give
    different fp32 accumulators for some element, so the equalities above could have failed. (Another BLOCK_K
    with the same K ranges need not: a `tl.dot` over BLOCK_K runs the 16-wide tensor-core steps one after the
    other into the same accumulator, the same chain whatever BLOCK_K; bench_bitwise.py records whether it does.)"""
    from specdec.fast.kernels import _invariant_triton as kt

    n, k = LLAMA_8B[matrix]
    w = grnd(n, k, seed=1) / k ** 0.5
    x = grnd(64, k, seed=2)
    base = kt.fixed_config(n, k)

    def acc(c):
        out = torch.empty(64, n, device="cuda", dtype=torch.float32)
        kt.matmul(x, w, None, None, out, c)
        return out

    want = acc(base)
    torch.testing.assert_close(want, x.float() @ w.float().T, rtol=1e-3, atol=1e-3)
    other = replace(base, split_k=1 if base.split_k > 1 else 2)
    assert base.k_range(k) != other.k_range(k)
    assert not torch.equal(acc(other), want), other.name()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_probe_passes_for_every_8b_base(dtype):
    """The probe the engine relies on agrees with the proof: on this GPU every base tile of the 8B shapes keeps
    its bits under every candidate M-range tile (where one differs, `launch_config` runs another candidate or the fixed
    config: slower, still exact)."""
    from specdec.fast.kernels import _invariant_triton as kt

    for base in {kt.fixed_config(n, k) for n, k in LLAMA_8B.values()}:
        result = kt.probe_tiles(base, dtype, torch.device("cuda"))
        others = {t for _, tiles in cfgs.range_tiles(base) for t in tiles} - {base.tile}
        if not others:  # a vocabulary-sized base runs its own tile at every M: the probe has nothing to check
            assert result.checked == () and not result.differs and not result.reason, result
            continue
        assert result.checked and result.same, result
