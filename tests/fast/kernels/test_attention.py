"""The Triton split-K slot attention equals its eager reference (CPU: Triton's interpreter; GPU: bf16 at real sizes)."""

import pytest
import torch

triton = pytest.importorskip("triton")

from specdec.fast.kernels.attention import slot_attention, slot_attention_reference  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter_new_enough():
    """Triton 3.6's interpreter cannot take loop bounds derived from program_id under NumPy 2 (3.8 can); compiled
    kernels (the GPU) are not affected."""
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if not torch.cuda.is_available() and version < (3, 8):
        pytest.skip(f"Triton {triton.__version__}'s interpreter; these CPU tests need triton >= 3.8")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def slot_cache_views(batch, kv_heads, num_slots, dim, *, dtype=torch.float32, device="cpu", seed=0):
    """keys/values `[B, H_kv, S, D]` as views of a bigger `[L, max_batch, H_kv, S_max, D]` cache (like SlotCache)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (2, batch + 2, kv_heads, num_slots + 24, dim)
    big_k = torch.randn(shape, generator=gen, device=device).to(dtype)
    big_v = torch.randn(shape, generator=gen, device=device).to(dtype)
    return big_k[1, 1 : batch + 1, :, :num_slots], big_v[1, 1 : batch + 1, :, :num_slots]


def verify_positions(batch, k, num_slots, *, seed=0, device="cpu"):
    """Positions `[B, k]` of k consecutive tokens per row: row 0 starts at 0, the last row ends at S−2 (the last
    usable slot), the rest start anywhere."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, num_slots - k, (batch,), generator=gen)
    starts[0] = 0
    starts[-1] = num_slots - 1 - k
    return (starts[:, None] + torch.arange(k)[None, :]).to(device)


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty returns NaN-filled memory: an output or scratch element never written shows up."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", poisoned)


@pytest.mark.parametrize("dim", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2), (8, 1)])
@pytest.mark.parametrize("k", [1, 2, 5, 9])
@pytest.mark.parametrize("batch", [1, 3])
def test_triton_matches_reference(batch, k, heads, kv_heads, dim, poisoned_empty):
    num_slots = 45 + 7 * k  # never a multiple of the 64-slot block
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, seed=k)
    q = torch.randn(batch, k, heads, dim, generator=torch.Generator().manual_seed(k + dim))
    positions = verify_positions(batch, k, num_slots, seed=batch + k)
    ref = slot_attention_reference(q, keys, values, positions)
    out = slot_attention(q, keys, values, positions, kernel="triton")
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("num_splits", [2, 3, 7])
def test_forced_splits_match_reference(num_splits, poisoned_empty):
    """Several splits (some with nothing to read: row 0 sees only slot 0) combine to the reference."""
    batch, k, heads, kv_heads, dim, num_slots = 3, 5, 4, 2, 16, 150
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, seed=num_splits)
    q = torch.randn(batch, k, heads, dim)
    positions = verify_positions(batch, k, num_slots, seed=num_splits)
    positions[0] = 0  # padding repeats a row's last position; here all of row 0 sits at slot 0
    ref = slot_attention_reference(q, keys, values, positions)
    out = slot_attention(q, keys, values, positions, kernel="triton", num_splits=num_splits)
    assert rel_err(out, ref) < 1e-5


def test_slots_past_the_live_length_and_the_junk_slot_are_never_read():
    """NaN in every slot past a row's largest position (the junk slot included) leaves the output untouched."""
    batch, k, heads, kv_heads, dim, num_slots = 2, 3, 4, 2, 16, 140
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim)
    q = torch.randn(batch, k, heads, dim)
    positions = torch.tensor([[10, 11, 12], [70, 71, num_slots - 1]])  # S−1: a padding token clamped to the junk slot
    ref = slot_attention_reference(q, keys, values, positions)
    for b, last in enumerate([12, num_slots - 2]):
        keys[b, :, last + 1 :] = float("nan")
        values[b, :, last + 1 :] = float("nan")
    for splits in (1, 3):
        out = slot_attention(q, keys, values, positions, kernel="triton", num_splits=splits)
        assert rel_err(out, ref) < 1e-5


def test_long_query_blocks_tile_over_rows():
    """k·G beyond one row tile (a prefill chunk under kernel="triton") still matches; scale passes through."""
    batch, k, heads, kv_heads, dim, num_slots = 1, 40, 8, 2, 16, 60
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim)
    q = torch.randn(batch, k, heads, dim)
    positions = torch.arange(k)[None, :] + 5
    ref = slot_attention_reference(q, keys, values, positions, scale=0.3)
    out = slot_attention(q, keys, values, positions, scale=0.3, kernel="triton", num_splits=2)
    assert rel_err(out, ref) < 1e-5


def test_fp16_inputs():
    keys, values = slot_cache_views(2, 2, 50, 32, dtype=torch.float16)
    q = torch.randn(2, 4, 4, 32).half()
    positions = verify_positions(2, 4, 50)
    out = slot_attention(q, keys, values, positions, kernel="triton")
    assert out.dtype == torch.float16
    assert rel_err(out, slot_attention_reference(q.float(), keys.float(), values.float(), positions)) < 2e-3


def test_dispatch_and_errors():
    keys, values = slot_cache_views(1, 2, 30, 24)
    q = torch.randn(1, 2, 4, 24)
    positions = torch.tensor([[3, 4]])
    ref = slot_attention_reference(q, keys, values, positions)
    assert torch.equal(slot_attention(q, keys, values, positions), ref)  # auto on CPU tensors: the reference
    assert torch.equal(slot_attention(q, keys, values, positions, kernel="reference"), ref)
    with pytest.raises(ValueError, match="head dim"):
        slot_attention(q, keys, values, positions, kernel="triton")  # D = 24 is not a power of two
    with pytest.raises(ValueError, match="kernel"):
        slot_attention(q, keys, values, positions, kernel="flash")
    with pytest.raises(ValueError, match="positions"):
        slot_attention(q, keys, values, positions[:, :1], kernel="triton")


def test_without_triton_auto_takes_the_reference_and_triton_says_why(monkeypatch):
    import sys

    from specdec.fast import kernels
    from specdec.fast.kernels import select

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "specdec.fast.kernels.triton_attention", raising=False)
    monkeypatch.delattr(kernels, "triton_attention", raising=False)
    select.triton_available.cache_clear()
    select.kernel_module.cache_clear()
    try:
        keys, values = slot_cache_views(1, 2, 30, 16)
        q, positions = torch.randn(1, 2, 4, 16), torch.tensor([[3, 4]])
        ref = slot_attention_reference(q, keys, values, positions)
        assert torch.equal(slot_attention(q, keys, values, positions), ref)
        with pytest.raises(ValueError, match="triton does not import"):
            slot_attention(q, keys, values, positions, kernel="triton")
    finally:
        select.triton_available.cache_clear()
        select.kernel_module.cache_clear()


def test_split_count_comes_from_shapes_only():
    from specdec.fast.kernels.triton_attention import MAX_SPLITS, choose_splits

    assert choose_splits(64, 16, 4096, num_sms=132) == 1  # 1024 programs fill the SMs already
    assert choose_splits(1, 16, 4096, num_sms=132) == 16  # batch 1: split the long rows
    assert choose_splits(1, 8, 512, num_sms=132) == 2  # short caches: few splits
    assert choose_splits(1, 1, 1 << 20, num_sms=132) == MAX_SPLITS
    keys, values = slot_cache_views(1, 2, 30, 16)
    with pytest.raises(ValueError, match="num_splits"):
        slot_attention(torch.randn(1, 1, 2, 16), keys, values, torch.tensor([[3]]), kernel="triton", num_splits=0)


def _brute_force(q, keys, values, positions, scale=None, window=None, softcap=None):
    """Attention written out per row and query, as transformers masks it: slots pos − W < j <= pos."""
    batch, k, heads, dim = q.shape
    group = heads // keys.shape[1]
    out = torch.empty_like(q)
    scale = dim ** -0.5 if scale is None else scale
    for b in range(batch):
        for i in range(k):
            pos = int(positions[b, i])
            lo = 0 if window is None else max(0, pos - window + 1)
            for h in range(heads):
                kk, vv = keys[b, h // group, lo : pos + 1], values[b, h // group, lo : pos + 1]
                s = kk @ q[b, i, h] * scale
                if softcap is not None:
                    s = torch.tanh(s / softcap) * softcap
                out[b, i, h] = torch.softmax(s, 0) @ vv
    return out


@pytest.mark.parametrize("window", [1, 4, 21, 200])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_sliding_window_and_softcap(window, softcap, poisoned_empty):
    """A window reads only the last W positions of each query (W = 1: itself; W past the length: everything);
    the reference and the kernel (one split and several) both equal the written-out definition."""
    batch, k, heads, kv_heads, dim, num_slots = 3, 5, 4, 2, 16, 90
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, seed=window)
    q = torch.randn(batch, k, heads, dim, generator=torch.Generator().manual_seed(window)) * 3
    positions = verify_positions(batch, k, num_slots, seed=window)
    expected = _brute_force(q, keys, values, positions, 0.4, window, softcap)
    ref = slot_attention_reference(q, keys, values, positions, 0.4, window=window, softcap=softcap)
    assert rel_err(ref, expected) < 1e-5
    for splits in (1, 3):
        out = slot_attention(q, keys, values, positions, 0.4, window=window, softcap=softcap, kernel="triton",
                             num_splits=splits)
        assert rel_err(out, expected) < 1e-5


def test_window_never_reads_slots_before_it():
    """NaN in every slot before each row's window (and past its end) leaves the kernel's output untouched."""
    batch, k, heads, kv_heads, dim, num_slots, window = 2, 3, 4, 2, 16, 140, 8
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim)
    q = torch.randn(batch, k, heads, dim)
    positions = torch.tensor([[30, 31, 32], [100, 101, 102]])
    ref = slot_attention_reference(q, keys, values, positions, window=window)
    for b in range(batch):
        first, last = int(positions[b, 0]) - window + 1, int(positions[b, -1])
        for t in (keys, values):
            t[b, :, :first] = float("nan")
            t[b, :, last + 1 :] = float("nan")
    for splits in (1, 2, 5):
        out = slot_attention(q, keys, values, positions, window=window, kernel="triton", num_splits=splits)
        assert rel_err(out, ref) < 1e-5
    with pytest.raises(ValueError, match="window"):
        slot_attention(q, keys, values, positions, window=0)
    with pytest.raises(ValueError, match="softcap"):
        slot_attention(q, keys, values, positions, softcap=-1.0)


# ----------------------------------------------------------------------------------------------- GPU (bf16)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("heads,kv_heads,dim", [(16, 16, 64), (32, 8, 128)])
@pytest.mark.parametrize("batch,num_slots", [(1, 4096), (8, 2048), (64, 512)])
@pytest.mark.parametrize("k", [1, 2, 5, 9, 17])
@pytest.mark.gpu
@needs_cuda
def test_bf16_on_cuda_matches_reference(batch, num_slots, k, heads, kv_heads, dim, poisoned_empty):
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, k, heads, dim, device="cuda").bfloat16()
    positions = verify_positions(batch, k, num_slots, device="cuda")
    ref = slot_attention_reference(q.float(), keys.float(), values.float(), positions)
    out = slot_attention(q, keys, values, positions, kernel="triton")
    assert out.dtype == torch.bfloat16
    assert torch.equal(slot_attention(q, keys, values, positions), out)  # auto takes the Triton kernel on CUDA
    err = rel_err(out, ref)
    bf16_ref_err = rel_err(slot_attention_reference(q, keys, values, positions), ref)
    assert err < max(2 * bf16_ref_err, 1e-2), (err, bf16_ref_err)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_follows_new_positions():
    """A captured launch (fixed split count) reads the positions it finds at replay time."""
    batch, k, heads, kv_heads, dim, num_slots = 2, 5, 32, 8, 128, 2048
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, k, heads, dim, device="cuda").bfloat16()
    positions = verify_positions(batch, k, num_slots, device="cuda")
    slot_attention(q, keys, values, positions)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = slot_attention(q, keys, values, positions)
    for seed in range(3):
        positions.copy_(verify_positions(batch, k, num_slots, seed=seed + 1, device="cuda"))
        graph.replay()
        ref = slot_attention_reference(q.float(), keys.float(), values.float(), positions)
        assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("window,softcap", [(None, 30.0), (64, None), (1000, 50.0)])
@pytest.mark.parametrize("batch,num_slots,k", [(1, 4096, 1), (8, 2048, 5)])
@pytest.mark.gpu
@needs_cuda
def test_bf16_window_and_softcap_on_cuda(batch, num_slots, k, window, softcap, poisoned_empty):
    heads, kv_heads, dim = 8, 4, 256  # Gemma's head dim
    keys, values = slot_cache_views(batch, kv_heads, num_slots, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, k, heads, dim, device="cuda").bfloat16()
    positions = verify_positions(batch, k, num_slots, device="cuda")
    ref = slot_attention_reference(q.float(), keys.float(), values.float(), positions, 0.0625, window=window,
                                   softcap=softcap)
    out = slot_attention(q, keys, values, positions, 0.0625, window=window, softcap=softcap, kernel="triton")
    bf16_ref_err = rel_err(slot_attention_reference(q, keys, values, positions, 0.0625, window=window,
                                                    softcap=softcap), ref)
    assert rel_err(out, ref) < max(2 * bf16_ref_err, 1e-2)


COMPILE = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec.fast.kernels import triton_attention as ta

strides = ["sqb", "sqk", "sqh", "sqd", "skb", "skh", "sks", "skd", "svb", "svh", "svs", "svd", "spb", "spk",
           "sob", "sok", "soh", "sod", "stb", "stk", "sab", "k_len", "num_slots", "rows_pad"]
for dtype, dim, block_n in (("bf16", 256, 32), ("fp32", 64, 32)):
    for windowed, softcap, tree, paged in ((False, False, False, False), (True, False, False, False),
                                           (False, True, False, False), (True, True, False, False),
                                           (False, False, True, False), (False, True, True, False),
                                           (False, False, False, True), (True, True, False, True),
                                           (False, False, True, True)):
            sig = dict(Q=f"*{dtype}", K=f"*{dtype}", V=f"*{dtype}", POS="*i64", OUT=f"*{dtype}", PART_ACC="*fp32",
                       PART_M="*fp32", PART_L="*fp32", TREE_BASE="*i64", TREE_BITS="*i64", TABLE="*i32",
                       SINKS="*fp32", **{n: "i32" for n in strides}, scale_log2="fp32", window="i32", softcap="fp32", scale="fp32")
            consts = dict(KV_HEADS=4, GROUP=2, HEAD_DIM=dim, BLOCK_M=16, BLOCK_N=block_n, NUM_SPLITS=4,
                          IEEE=dtype == "fp32", WINDOWED=windowed, SOFTCAP=softcap, TREE=tree, PAGED=paged,
                          PAGE=16, HAS_SINKS=windowed)  # (attention sinks: gpt-oss's windowed layers have them)
            src = ASTSource(fn=ta._split_attention, signature={**sig, **{k: "constexpr" for k in consts}},
                            constexprs=consts)
            triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("compiled")
'''


def test_window_and_softcap_variants_compile_for_sm90():
    """What only the compiler sees (the interpreter tests above check the arithmetic): every window/softcap/tree
    variant, static and paged (a block table), with and without attention sinks, lowers to an sm_90 cubin. No GPU needed; a subprocess, since the session sets TRITON_INTERPRET."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas next to Triton")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
