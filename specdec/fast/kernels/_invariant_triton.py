"""Triton kernels behind `specdec.fast.kernels.invariant` (imported only where Triton is installed): the GEMM here,
the attention in `_invariant_attention` (re-exported).

matmul     program (m tile, n tile, k split) computes out[m-block, n-block] = Σ_k x·wᵀ over its split's K range in
           BLOCK_K steps with one `tl.dot` shape. The summation order — BLOCK_K and the number of K splits — is a
           function of the weight's (N, K) alone (`_invariant_config.fixed_config`), never of M. With one split the
           program adds bias/residual and stores; with several, each split stores its fp32 partial `[splits, M,
           N]` and `_reduce` sums them one after the other in split order (then bias, then residual) — or, fused
           (`fuse_splits`, for large M), one program computes each split's sum from zero and adds them in the same
           order itself. The tile (block_m × block_n, warps, stages) may follow M's range (`config_for(n, k, m)`)
           where `tile_probe`'s device check (once per process, dtype and base tile) finds the bits unchanged;
           else the fixed config runs for every M. Tiles are held transposed, `[BLOCK_N, BLOCK_M]` (weights as the
           wide operand, as in `_linear_triton`); the grid runs the m tiles of one weight block next to each other.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from specdec.fast.kernels import _invariant_config
from specdec.fast.kernels._invariant_attention import SPLIT_SLOTS, attention  # noqa: F401  (invariant.py's entry)
from specdec.fast.kernels._invariant_config import (MATMUL, MatmulConfig, Tile, candidates_for,  # noqa: F401
                                                    config_for, fixed_config, range_tiles)

__all__ = ["MatmulConfig", "MATMUL", "SPLIT_SLOTS", "Tile", "TileProbe", "config_for", "fixed_config", "launch_config",
           "tile_probe", "tile_probes", "probe_tiles", "matmul", "attention"]

logger = logging.getLogger(__name__)

TILES_ENV = "SPECDEC_BITWISE_TILES"  # "probe" (default), "by_m" (no device check), "fixed"
TILES_BY_M: bool | None = None  # True / False override the environment; None: the environment, else the probe


@dataclass(frozen=True)
class TileProbe:
    """The device check behind `launch_config` for one (device, dtype, base tile): the base's block_k with 2 K
    splits, 160 × 256 outputs over K = 8 · block_k of wide-range random inputs, stored in fp32 (the accumulators'
    own bits), computed by the base tile and by every candidate M-range tile, splits stored (and fused, where the
    table may fuse them: `_invariant_config.FUSE_PROGRAMS`). checked /
    differs: those configs' names, and the ones whose bits differed from the base's (or that did not compile or
    fit: `errors` says why); reason: why the check did not run (then the fixed config is kept)."""

    dtype: str
    base: str
    checked: tuple[str, ...]
    differs: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    reason: str = ""

    @property
    def same(self) -> bool:
        """Every candidate tile gave the base's bits."""
        return bool(self.checked) and not self.differs and not self.reason

    def agrees(self, config: MatmulConfig) -> bool:
        """Whether config's tile (its splits fused or stored as config's) gave the base's bits."""
        name = replace(config, split_k=2).name()
        return not self.reason and name in self.checked and name not in self.differs


_PROBES: dict[tuple, TileProbe] = {}
_LAUNCH: dict[tuple, MatmulConfig] = {}  # launch_config's answers (the host cost of a Triton launch is enough)
PROBE_SHAPE = (160, 256, 8)  # the probe's M, N and K steps (K = steps · block_k, in 2 splits)


def _tiles_mode() -> str:
    if TILES_BY_M is not None:
        return "by_m" if TILES_BY_M else "fixed"
    mode = os.environ.get(TILES_ENV, "probe") or "probe"
    if mode not in ("probe", "by_m", "fixed"):
        raise ValueError(f"{TILES_ENV} must be 'probe', 'by_m' or 'fixed', got {mode!r}")
    return mode


def probe_tiles(base: MatmulConfig, dtype: torch.dtype, device) -> TileProbe:
    """Run the check `TileProbe` describes (syncs the device; never under graph capture)."""
    ref = replace(base, split_k=2, fuse_splits=False)
    m, n, steps = PROBE_SHAPE
    k = steps * base.block_k
    gen = torch.Generator().manual_seed(0)

    def draw(rows: int, cols: int) -> torch.Tensor:  # magnitudes over 2^-6..2^6: the order shows in the low bits
        v = torch.randn(rows, cols, generator=gen) * torch.exp2(torch.randint(-6, 7, (rows, cols), generator=gen))
        return v.to(device=device, dtype=dtype)

    x, w = draw(m, k), draw(n, k)
    want = torch.empty(m, n, device=device, dtype=torch.float32)
    matmul(x, w, None, None, want, ref)
    checked, differs, errors = [], [], []
    fuses = (False,) if _invariant_config.FUSE_PROGRAMS is None else (False, True)  # only what the table can run
    for _, tiles in range_tiles(base):
        for tile in tiles:
            for fuse in fuses:
                cfg = ref.with_tile(tile, fuse)
                if cfg == ref or cfg.name() in checked:
                    continue
                got = torch.empty_like(want)
                checked.append(cfg.name())
                try:
                    matmul(x, w, None, None, got, cfg)
                except Exception as exc:  # noqa: BLE001  a tile the device cannot compile or hold: not used
                    kind = "does not fit" if isinstance(exc, OutOfResources) else type(exc).__name__
                    differs.append(cfg.name())
                    errors.append(f"{cfg.name()}: {kind}: {str(exc)[:80]}")
                    continue
                if not torch.equal(got, want):
                    differs.append(cfg.name())
    return TileProbe(str(dtype), ref.name(), tuple(checked), tuple(differs), tuple(errors))


def tile_probes() -> tuple[TileProbe, ...]:
    """The device checks `launch_config` ran in this process so far (benchmarks report them)."""
    return tuple(_PROBES.values())


def tile_probe(base: MatmulConfig, dtype: torch.dtype, device) -> TileProbe | None:
    """The device check for weights whose fixed config is `base`, run once per process, device, dtype and base
    tile, logged; None where it does not apply: fp32 (its IEEE FMA tiles would outgrow shared memory) and outside
    CUDA (Triton's interpreter), where the fixed config runs. Under CUDA graph capture (no sync allowed) an
    unchecked base keeps the fixed config for the rest of the process."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    key = (device, dtype, base.tile, base.block_k)
    result = _PROBES.get(key)
    if result is None:
        if torch.cuda.is_current_stream_capturing():
            result = TileProbe(str(dtype), base.name(), (), reason="first used under CUDA graph capture")
        else:
            result = probe_tiles(base, dtype, device)
        _PROBES[key] = result
        agree = [c for c in result.checked if c not in result.differs]
        log = logger.info if result.same else logger.warning
        log("bitwise GEMM tiles for %s %s base %s: same bits %s; differ %s%s", device, dtype, result.base,
            agree or "none", list(result.differs) or "none", f" ({result.reason})" if result.reason else "")
    return result


def launch_config(n: int, k: int, m: int, dtype: torch.dtype, device) -> MatmulConfig:
    """The config `matmul` runs for M rows of an [N, K] weight: `fixed_config(n, k)` up to SMALL_M rows; above,
    per TILES_BY_M / $SPECDEC_BITWISE_TILES: "fixed" that config, "by_m" the preferred M-range config
    (`config_for(n, k, m)`, no check), "probe" (the default) the first candidate of m's range whose tile
    `tile_probe` found bit-identical to the fixed config, else the fixed config."""
    mode = _tiles_mode()
    key = (n, k, m, dtype, device, mode)
    config = _LAUNCH.get(key)
    if config is None:
        base = fixed_config(n, k)
        candidates = candidates_for(base, n, m)
        if candidates[0] == base or mode == "fixed":
            config = base
        elif mode == "by_m":
            config = candidates[0]
        else:
            probe = tile_probe(base, dtype, device)
            config = next((c for c in candidates if probe is not None and probe.agrees(c)), base)
        if len(_LAUNCH) >= 4096:  # (prefill chunks of many lengths)
            _LAUNCH.clear()
        _LAUNCH[key] = config
    return config


@triton.jit
def _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, k_lo, k_hi, stride_xm, stride_wn, IEEE: tl.constexpr,
             STAGES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ over k in [k_lo, k_hi) of w[n, k] · x[m, k] in fp32 `[BLOCK_N, BLOCK_M]`, from zero, one `tl.dot` per
    BLOCK_K step in K order."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_lo + offs_k)[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        k_ok = (k0 + offs_k) < k_hi
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


# M and the row strides are not specialized: one binary per config for every M in its range.
@triton.jit(do_not_specialize=["M", "stride_xm", "stride_rm", "stride_om"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr, part_ptr, M, N, K, K_RANGE, stride_xm, stride_wn, stride_rm,
                   stride_om, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, IEEE: tl.constexpr,
                   STAGES: tl.constexpr, SPLIT: tl.constexpr, SERIAL: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = pid_k * K_RANGE
    acc = _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, k_lo, tl.minimum(k_lo + K_RANGE, K), stride_xm,
                   stride_wn, IEEE, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    for s in tl.static_range(1, SERIAL):  # fused splits: split s's own sum, added in split order (as `_reduce`)
        acc += _k_range(w_ptr, x_ptr, offs_n, offs_m, n_ok, m_ok, s * K_RANGE, tl.minimum(s * K_RANGE + K_RANGE, K),
                        stride_xm, stride_wn, IEEE, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT:  # partial [splits, M, N] in fp32; `_reduce` finishes
        part = part_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
        tl.store(part, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        if HAS_RES:
            acc += tl.load(r_ptr + offs_m[None, :].to(tl.int64) * stride_rm + offs_n[:, None], mask=mask,
                           other=0.0).to(tl.float32)
        tl.store(o_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None],
                 acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "stride_rm", "stride_om"])
def _reduce(part_ptr, b_ptr, r_ptr, o_ptr, M, N, stride_rm, stride_om, SPLITS: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """Row m of the output, BLOCK columns: Σ over splits in split order (fp32), + bias, + residual, stored."""
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.load(part_ptr + m * N + cols, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + (s * M + m) * N + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(r_ptr + m * stride_rm + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + cols, acc.to(o_ptr.dtype.element_ty), mask=ok)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias, residual, out: torch.Tensor,
           config: MatmulConfig | None = None) -> None:
    """out `[M, N]` = x `[M, K]` @ weight `[N, K]`ᵀ (+ bias) (+ residual `[M, N]`); rows K/N-contiguous. out may be
    residual itself (each element is read and written by one program). config: `launch_config(N, K, M, ...)`
    unless given (benchmarks, probes and tests; a config of another order gives other bits)."""
    m, k = x.shape
    n = weight.shape[0]
    c = launch_config(n, k, m, x.dtype, x.device) if config is None else config
    k_range = c.k_range(k)
    splits = -(-k // k_range) if k else 1
    stored = splits > 1 and not c.fuse_splits
    part = torch.empty(splits, m, n, device=x.device, dtype=torch.float32) if stored else out
    bias_arg = bias if bias is not None else out
    res_arg = residual if residual is not None else out
    stride_rm = residual.stride(0) if residual is not None else 0
    grid = (triton.cdiv(m, c.block_m), triton.cdiv(n, c.block_n), splits if stored else 1)
    _matmul_kernel[grid](
        x, weight, bias_arg, res_arg, out, part, m, n, k, k_range, x.stride(0), weight.stride(0), stride_rm,
        out.stride(0), HAS_BIAS=bias is not None, HAS_RES=residual is not None, IEEE=x.dtype == torch.float32,
        STAGES=c.num_stages, SPLIT=stored, SERIAL=1 if stored else splits, BLOCK_M=c.block_m,
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, num_warps=c.num_warps, num_stages=c.num_stages)
    if stored:
        block = 1024 if n >= 1024 else triton.next_power_of_2(max(n, 16))
        _reduce[(m, triton.cdiv(n, block))](part, bias_arg, res_arg, out, m, n, stride_rm, out.stride(0),
                                            SPLITS=splits, HAS_BIAS=bias is not None,
                                            HAS_RES=residual is not None, BLOCK=block, num_warps=4)
