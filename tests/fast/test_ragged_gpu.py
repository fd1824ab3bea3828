"""CUDA checks of the ragged forward (`fast.ragged`): the Triton varlen kernel on the device equals the reference
(fp32, bf16), and a mixed batch through it equals each row alone through `FastLlama.forward` (the fused layer on a
static cache) — fp32 to 1e-4, bf16 to a relative 2e-2 (different kernels: a difference is rounding)."""

import pytest
import torch

from specdec.fast import FastLlama, LlamaShape
from specdec.fast.kernels.ragged_attention import ragged_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_kernel_on_the_device_matches_the_reference():
    from fast.kernels.test_ragged_attention import layout_for, pools  # (the CPU tests' builders)

    counts, starts = (300, 1, 5, 9, 1), (0, 700, 40, 2, 1500)
    lay, _ = layout_for(counts, starts, 16, 200, seed=1)
    keys, values = pools(200, 16, 8, 128, seed=1)
    q = torch.randn(sum(counts), 32, 128)
    ref = ragged_attention(q, keys, values, lay, kernel="reference")
    cuda = lambda t: t.cuda()  # noqa: E731
    lay_cuda = type(lay)(lay.counts, lay.starts, cuda(lay.query_start), cuda(lay.positions), cuda(lay.block_table))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for window, softcap in ((None, None), (64, None), (None, 30.0)):
            want = ref if window is None and softcap is None else ragged_attention(
                q, keys, values, lay, window=window, softcap=softcap, kernel="reference")
            out = ragged_attention(q.cuda().to(dtype), keys.cuda().to(dtype), values.cuda().to(dtype), lay_cuda,
                                   window=window, softcap=softcap, kernel="triton")
            err = ((out.float().cpu() - want).norm() / want.norm()).item()
            assert err < tol, (dtype, window, softcap, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_batch_equals_each_row_alone_on_cuda(dtype):
    from fast.test_ragged import MIX, TEXT, Pool, ragged  # (the CPU test's rows and pool)

    shape = LlamaShape(vocab_size=64, dim=256, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=32,
                       intermediate_size=512)
    fast = FastLlama.random(shape, device="cuda", dtype=dtype, std=0.05)
    with torch.inference_mode():
        got = ragged(fast, Pool(fast), MIX)
        for n, t, s, k, m in MIX:
            cache = fast.new_cache(1, 63)
            if s:
                fast(torch.tensor([TEXT[t][:s]], device="cuda"), cache)
            want = fast(torch.tensor([TEXT[t][s : s + k]], device="cuda"), cache)[0, k - m :]
            if dtype == torch.float32:
                torch.testing.assert_close(got[n], want, atol=1e-4, rtol=0)
            elif m:
                assert ((got[n] - want).norm() / want.norm()).item() < 2e-2, n
