"""RoPE + KV-cache write in one kernel equals its eager reference, which equals transformers' rotation.

Checked: q out, keys/values written at each token's slot of a strided cache view, padding tokens only
touching the junk slot, every other slot left alone; the q|k|v bias (Qwen2) and Qwen3's per-head q/k RMSNorm
fused in.
"""

import pytest
import torch

from specdec.fast.kernels.rope import rope_cache_write, rope_cache_write_reference

pytest.importorskip("triton")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CASES = [pytest.param("cpu", torch.float32, 1e-5, id="cpu-fp32"),
         pytest.param("cuda", torch.bfloat16, 2e-2, id="cuda-bf16", marks=[pytest.mark.gpu, CUDA])]
H, HKV, D, S = 4, 2, 16, 24


def _tables(positions: int, dim: int, dtype, device):
    """cos and the signed sin, as FastLlama.rope_tables builds them."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = emb.sin()
    sin_signed = torch.cat([-sin[:, : dim // 2], sin[:, dim // 2 :]], dim=-1)
    return emb.cos().to(device, dtype), sin_signed.to(device, dtype)


def _case(device, dtype, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = 3
    qkv = torch.randn(batch, k, (H + 2 * HKV) * D, generator=g).to(device, dtype)
    lengths = torch.tensor([0, 5, 11])
    valid = torch.ones(batch, k, dtype=torch.bool)
    if k > 1:
        valid[1, 0] = False  # one padding token (left) in row 1
    positions = (lengths[:, None] + valid.long().cumsum(1) - 1).clamp_min(0)
    slots = torch.where(valid, positions, torch.full_like(positions, S - 1))
    return qkv, positions.to(device), slots.to(device), valid


@pytest.mark.parametrize("device, dtype, tol", CASES)
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("extra", ["plain", "bias", "qk_norm"])
def test_rope_cache_write_matches_reference(device, dtype, tol, k, extra):
    qkv, positions, slots, valid = _case(device, dtype, k)
    cos, sin = _tables(32, D, dtype, device)
    g = torch.Generator().manual_seed(7)
    norms = dict(q_norm=(1 + torch.randn(D, generator=g)).to(device, dtype),
                 k_norm=(1 + torch.randn(D, generator=g)).to(device, dtype)) if extra == "qk_norm" else {}
    if extra == "bias":
        norms["bias"] = torch.randn(qkv.shape[-1], generator=g).to(device, dtype)
    caches = []
    for kernel in ("reference", "triton"):
        slot_cache = torch.zeros(3, 2, HKV, S, D, device=device, dtype=dtype)  # keys and values interleaved
        keys, values = slot_cache[:, 0], slot_cache[:, 1]  # strided views, as a layer of a larger cache
        q = rope_cache_write(qkv, keys, values, positions, slots, cos, sin, H, eps=1e-6, kernel=kernel, **norms)
        assert q.shape == (3, k, H, D) and q.is_contiguous()
        caches.append((q, slot_cache))
    (q_ref, c_ref), (q_got, c_got) = caches
    torch.testing.assert_close(q_got, q_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(c_got, c_ref, atol=tol, rtol=tol)  # one padding token: the junk slot agrees too
    written = torch.zeros(3, S, dtype=torch.bool)
    written[torch.arange(3)[:, None], slots.cpu()] = True
    assert (c_got.abs().sum(dim=(1, 2, 4)).cpu() > 0).eq(written).all()  # nothing else touched
    assert bool(written[:, S - 1].any()) == (k > 1)  # the padding token went to the junk slot


def test_reference_rotation_equals_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half  # noqa: F401

    qkv, positions, slots, _ = _case("cpu", torch.float32, 4, seed=3)
    cos, sin = _tables(32, D, torch.float32, "cpu")
    keys, values = torch.zeros(3, HKV, S, D), torch.zeros(3, HKV, S, D)
    q = rope_cache_write_reference(qkv, keys, values, positions, slots, cos, sin, H)
    x = qkv.view(3, 4, H + 2 * HKV, D).transpose(1, 2)  # [B, heads, k, D] as transformers holds them
    plain_sin = torch.cat([-sin[:, : D // 2], sin[:, D // 2 :]], dim=-1)
    q_hf, k_hf = apply_rotary_pos_emb(x[:, :H], x[:, H : H + HKV], cos[positions], plain_sin[positions])
    torch.testing.assert_close(q, q_hf.transpose(1, 2), atol=1e-6, rtol=0)
    b, i = 2, 3  # row 2's last token
    torch.testing.assert_close(keys[b, :, slots[b, i]], k_hf[b, :, i], atol=1e-6, rtol=0)
    torch.testing.assert_close(values[b, :, slots[b, i]], x[b, H + HKV :, i], atol=0, rtol=0)


def test_shape_checks():
    qkv, positions, slots, _ = _case("cpu", torch.float32, 2)
    cos, sin = _tables(32, D, torch.float32, "cpu")
    keys = torch.zeros(3, HKV, S, D)
    with pytest.raises(ValueError, match="qkv"):
        rope_cache_write(qkv, keys, keys.clone(), positions, slots, cos, sin, H + 1)
    with pytest.raises(ValueError, match="positions"):
        rope_cache_write(qkv, keys, keys.clone(), positions[:, :1], slots, cos, sin, H)
    with pytest.raises(ValueError, match="bias"):
        rope_cache_write(qkv, keys, keys.clone(), positions, slots, cos, sin, H, bias=torch.zeros(3))
    with pytest.raises(ValueError, match="q_norm"):
        rope_cache_write(qkv, keys, keys.clone(), positions, slots, cos, sin, H, q_norm=torch.ones(D))
