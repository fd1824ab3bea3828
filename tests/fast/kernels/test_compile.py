"""The fused kernels lower all the way to an sm_90 cubin (Triton's own compiler, no GPU needed).

The interpreter tests check the kernels' arithmetic; this checks what only the compiler sees (types of values
merged across branches, constexpr use, layouts). Runs in a subprocess: the test session sets TRITON_INTERPRET.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from specdec.fast.kernels import mlp, norm, rope

    def build(fn, sig, consts):
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
        triton.compile(src, target=GPUTarget("cuda", 90, 32))

    build(norm._kernel(), dict(x_ptr="*bf16", delta_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16",
          stride_x="i64", stride_delta="i64", stride_out="i64", dim="i32", eps="fp32"), {"BLOCK": 4096, "ADD": True})
    for extra in (False, True):
        sig = dict(qkv_ptr="*bf16", q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", slot_ptr="*i64",
                   cos_ptr="*bf16", sin_ptr="*bf16", bias_ptr="*bf16", qw_ptr="*bf16", kw_ptr="*bf16",
                   tokens_per_row="i32", stride_qkv="i32", stride_cos="i32", stride_sin="i32", skb="i32", skh="i32",
                   sks="i32", skd="i32", svb="i32", svh="i32", svs="i32", svd="i32", eps="fp32")
        build(rope._kernel(), sig, {"H": 32, "HKV": 8, "D": 128, "BLOCK_H": 4, "BLOCK_D": 128, "BIAS": extra,
                                    "QK_NORM": extra})
    build(mlp._kernel(), dict(x_ptr="*bf16", out_ptr="*bf16", stride_x="i32", stride_out="i32", inter="i32"),
          {"BLOCK": 1024})
    print("compiled")
''')


def test_kernels_compile_for_sm90():
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    if version < (3, 3):
        pytest.skip("the ASTSource signature format used here is Triton >= 3.3")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[3])  # the checkout whose specdec is under test
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas next to Triton")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
