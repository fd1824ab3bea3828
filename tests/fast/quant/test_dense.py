"""8-bit block copies of dense matrices (`fast.quant.dense`) and the feature head's products through them on the
quantized CPU path."""

from __future__ import annotations

import pytest
import torch

from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.fast.quant import kernel as qkernel
from specdec.fast.quant.dense import SOURCE, attach, detach, q8_blocks
from specdec.fast.quant.weight import ATTRIBUTE, quantized


def test_q8_blocks_round_each_weight_to_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(40, 96) * torch.rand(40, 1) * 3
    w[3, :32] = 0.0  # a zero group: scale 0, values 0
    q = q8_blocks(w)
    assert (q.bits, q.group, q.offset, q.shape) == (8, 32, None, (40, 96))
    step = q.scale.repeat_interleave(32, dim=1)
    err = (q.dequantize() - w).abs()
    assert bool((err <= step / 2 * (1 + 1e-6) + 1e-12).all())
    assert torch.equal(q.dequantize()[3, :32], torch.zeros(32))
    # the negative control: a scale off by 1% in one group breaks the bound there
    bad = q.scale.clone()
    bad[5, 1] *= 1.01
    assert not bool(((q.values().float().view(40, 3, 32) * bad[..., None]).view(40, 96) - w).abs()
                    .le(step / 2 * (1 + 1e-6) + 1e-12).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_blocks(torch.randn(4, 40))


def _random(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 2 else 1.0) + (1.0 if p.dim() == 1 else 0))


def _pair():
    shape = LlamaShape(vocab_size=96, dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, intermediate_size=96,
                       tie_word_embeddings=True)
    target = FastLlama(shape, device="cpu", dtype=torch.float32)
    head = FeatureHead(HeadConfig.for_target(shape))
    _random(target, 1)
    _random(head, 2)
    return target.eval(), head.eval()


def _head_out(head: FeatureHead, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    cache = head.layer.new_cache(1, 32)
    with torch.inference_mode():
        return head(features, tokens, cache)


@pytest.mark.skipif(not qkernel.kernel_available(), reason="the quantized kernel did not build here")
def test_the_head_multiplies_through_8_bit_copies_only_on_a_quantized_target():
    target, head = _pair()
    linears = head._linear_weights()
    assert len(linears) == 5  # fc, q|k|v, o, gate|up, down
    torch.manual_seed(3)
    features, tokens = torch.randn(1, 5, 64), torch.randint(0, 96, (1, 5))
    dense_out = _head_out(head.bind(target), features, tokens)
    assert all(quantized(p) is None for p in linears)  # a dense target: dense products

    setattr(target.lm_head, ATTRIBUTE, q8_blocks(target.lm_head))  # the target's head kept quantized
    head.bind(target)
    assert all(quantized(p) is not None and quantized(p).source == SOURCE for p in linears)
    quant_out = _head_out(head, features, tokens)
    assert not torch.equal(quant_out, dense_out)  # the copies are what runs
    assert float((quant_out - dense_out).norm() / dense_out.norm()) < 0.05
    # a row's output is the same alone and among the 5 (the kernel's row-count invariance reaches the head)
    assert torch.equal(_head_out(head, features[:, :1], tokens[:, :1]), quant_out[:, :1])

    delattr(target.lm_head, ATTRIBUTE)
    head.bind(target)  # back to a dense target: the copies are gone, the dense tensors untouched
    assert all(quantized(p) is None for p in linears)
    assert torch.equal(_head_out(head, features, tokens), dense_out)


def test_attach_leaves_other_quantized_weights_and_detach_only_its_own():
    a, b, c = (torch.nn.Parameter(torch.randn(8, 64), requires_grad=False) for _ in range(3))
    other = q8_blocks(b.data)
    object.__setattr__(other, "source", "Q4_1")  # (as a GGUF's weight would say)
    setattr(b, ATTRIBUTE, other)
    odd = torch.nn.Parameter(torch.randn(8, 40), requires_grad=False)  # K not a multiple of 32: left dense
    assert attach([a, b, c, odd]) == 2
    assert quantized(b) is other and quantized(odd) is None
    detach([a, b, c, odd])
    assert quantized(a) is None and quantized(c) is None and quantized(b) is other
