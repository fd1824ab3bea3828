"""The fast feature-head training path: the cached-feature loss equals the per-batch target pass's, the cache's
bounds name their argument, the KV-reusing unrolled pass equals the block-masked reference (values and
gradients), the fused KL kernel equals `distill.kl_loss`, and a cached run trains a head the engine loads (CPU, fp32)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.zoo.data import TokenData
from specdec.zoo.distill import kl_loss
from specdec.zoo.feature_head import HeadTrainConfig, TrainableHead, _target_pass, head_loss, train_head
from specdec.zoo.head_cache import build_feature_cache, check_cache_memory, target_features
from specdec.zoo.head_kl import kl_rows
from specdec.zoo.presets import PRESETS

TRAIN = replace(PRESETS["tiny"].target_train, steps=30, batch_size=4, seq_len=15, lr=3e-3, warmup_steps=3,
                weight_decay=0.0, z_loss=0.0)


@pytest.fixture(scope="module")
def setup(make_llama):
    target = make_llama(0, layers=2, hidden=32)
    for p in target.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng(0)  # a periodic stream with 10% random tokens: a head can learn the next feature
    stream = np.where(rng.random(4000) < 0.1, rng.integers(0, 64, 4000), (np.arange(4000) * 7) % 29).astype(np.uint16)
    data = TokenData(train=stream, val=stream[:600], tokenizer_dir=Path("."), meta={"vocab_size": 64})
    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)
    return target, data, head


def test_cached_loss_equals_the_target_pass_loss(setup):
    """Same batch: features from the cache + p = lm_head(features) give the loss (and gradients) of a fresh pass."""
    target, data, head = setup
    cfg = HeadTrainConfig(TRAIN, depth=3, feature_noise=0.1, kl_weight=0.5)
    cache = build_feature_cache(target, data, max_tokens=64 * 16, batch_size=4, seq_len=15,
                                rng=np.random.default_rng(1), device="cpu", dtype=torch.float32)
    assert cache.length == 16 and cache.tokens_held == 64 * 16 and cache.generated is None
    tokens, features = cache.sample(4, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 16) and features.shape == (4, 16, 32)
    results = []
    for cached in (True, False):
        head.zero_grad()
        if cached:
            hidden, p_logits = features, target.lm_head(features)
        else:
            hidden, p_logits = _target_pass(target, tokens)
        loss, regression, kl = head_loss(head, target, hidden, tokens, p_logits, cfg, torch.Generator().manual_seed(7))
        loss.backward()
        grads = [p.grad.clone() for p in head.fc.parameters()]
        results.append((loss.detach(), regression.detach(), kl.detach(), grads))
    (a, *ra, ga), (b, *rb, gb) = results
    assert float(a) > 0 and float(ra[1]) > 0
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ra, rb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-5)


def test_generated_rows_are_windows_of_the_pool_with_their_features(setup):
    target, data, _ = setup
    pool = torch.randint(0, target.config.vocab_size, (6, 24), generator=torch.Generator().manual_seed(3))
    cache = build_feature_cache(target, data, max_tokens=10 * 24, batch_size=4, seq_len=11, pool=pool,
                                generated_fraction=0.5, rng=np.random.default_rng(2), device="cpu",
                                dtype=torch.float32)
    assert cache.length == 12 and cache.generated.tokens.shape == (5, 24) and cache.corpus.tokens.shape == (10, 12)
    tokens, features = cache.sample(4, torch.Generator().manual_seed(0))
    full = target_features(target, pool)
    for row in range(2):  # the generated half: a window of some pool row, with that row's full-context features
        hits = [(r, o) for r in range(6) for o in range(13) if torch.equal(pool[r, o : o + 12], tokens[row])]
        assert hits
        r, o = hits[0]
        torch.testing.assert_close(features[row], full[r, o : o + 12], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(features[2:], target_features(target, tokens[2:]), atol=1e-5, rtol=1e-5)


def test_refresh_replaces_the_oldest_corpus_rows_with_fresh_features(setup):
    target, data, _ = setup
    cache = build_feature_cache(target, data, max_tokens=6 * 16, batch_size=2, seq_len=15,
                                rng=np.random.default_rng(1), device="cpu", dtype=torch.float32)
    before = cache.corpus.tokens.clone()
    for _ in range(2):
        cache.refresh(target, data, np.random.default_rng(5 + _), rows=4)
    assert cache.next_row == 2
    changed = (cache.corpus.tokens != before).any(1)
    assert changed.tolist() == [True] * 6  # rows 0..3, then 4, 5 and (the ring) 0, 1 again
    torch.testing.assert_close(cache.corpus.features, target_features(target, cache.corpus.tokens.long()),
                               atol=1e-5, rtol=1e-5)


def test_cache_bounds_name_the_argument(setup, code_data, tmp_path, capsys):
    target, data, _ = setup
    with pytest.raises(ValueError, match=r"feature_cache_tokens \(40\) must hold at least one batch"):
        build_feature_cache(target, data, max_tokens=40, batch_size=4, seq_len=15, rng=np.random.default_rng(0),
                            device="cpu")
    with pytest.raises(ValueError, match="feature_cache_tokens: 1000000000000 tokens .* free memory"):
        check_cache_memory(10**12, 1024, torch.bfloat16, "cpu")
    assert check_cache_memory(1000, 32, torch.float32, "cpu") == 1000 * (32 * 4 + 4)
    for bad in (dict(feature_cache_tokens=-1), dict(feature_cache_tokens=True), dict(log_every=0),
                dict(kl_kernel="fast")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HeadTrainConfig(TRAIN, **bad)
    with pytest.raises(ValueError, match="batch_reuse applies without the feature cache"):
        HeadTrainConfig(TRAIN, feature_cache_tokens=1000, batch_reuse=2)
    from specdec.cli import main

    base = ["train", "head", "--target", str(tmp_path), "--data", str(code_data), "--out", str(tmp_path / "h"),
            "--quiet"]
    assert main([*base, "--feature-cache-tokens", "-1"]) == 2
    assert "--feature-cache-tokens must be >= 0" in capsys.readouterr().err
    assert main([*base, "--feature-cache-tokens", "1000", "--batch-reuse", "2"]) == 2
    assert "--batch-reuse applies without the feature cache" in capsys.readouterr().err
    assert main([*base, "--feature-cache-refresh", "4"]) == 2
    assert "--feature-cache-refresh needs --feature-cache-tokens" in capsys.readouterr().err
    with pytest.raises(ValueError, match="feature_cache_refresh needs the feature cache"):
        HeadTrainConfig(TRAIN, feature_cache_refresh=4)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_unrolled_equals_the_block_masked_reference(kv_heads):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=kv_heads)).eval()
    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    tokens = torch.randint(0, 64, (2, 14), generator=torch.Generator().manual_seed(0))
    features = target.model(input_ids=tokens).last_hidden_state.detach()
    embed = target.get_input_embeddings().weight.detach()
    grads = []
    for fn in (head.unrolled, head.unrolled_reference):
        head.zero_grad()
        steps = fn(features, tokens, embed, 4)
        sum((s * torch.linspace(-1, 1, s.shape[-1])).sum() for s in steps).backward()
        grads.append((steps, [p.grad.clone() for p in head.parameters() if p.grad is not None]))
    (fast, g_fast), (ref, g_ref) = grads
    assert [s.shape[1] for s in fast] == [13, 12, 11, 10]
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert len(g_fast) == len(g_ref) > 5
    torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kl_is_the_kl_loss_with_its_gradient(dtype):
    """`kl_rows` (the Triton kernel; Triton's interpreter on CPU) = its eager reference = `distill.kl_loss`, on a
    shifted view of p like the training's `p_logits[:, s:]`, a vocabulary that is not a power of 2, and the
    gradient for per-position weights."""
    gen = torch.Generator().manual_seed(0)
    p_logits = (torch.randn(2, 7, 40, generator=gen) * 3).to(dtype)[:, 2:]
    q0 = torch.randn(2, 5, 40, generator=gen).to(dtype)
    weights = torch.rand(2, 5, generator=gen)
    out = {}
    for kernel in ("triton", "reference"):
        q = q0.clone().requires_grad_(True)
        kl = kl_rows(q, p_logits, kernel=kernel)
        (kl * weights).sum().backward()
        out[kernel] = (kl.detach(), q.grad.float())
    assert out["triton"][0].dtype == torch.float32 and out["triton"][0].shape == (2, 5)
    torch.testing.assert_close(out["triton"][0], out["reference"][0], atol=1e-5, rtol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16 gradients: one rounding apart
    torch.testing.assert_close(out["triton"][1], out["reference"][1], atol=tol, rtol=tol)
    want = kl_loss(p_logits, q0, torch.ones(2, 5, dtype=torch.bool))
    torch.testing.assert_close(out["reference"][0].mean(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="q_logits and p_logits must both be"):
        kl_rows(q0, p_logits[:, 1:])


def test_cached_training_lowers_the_loss_and_the_cli_writes_a_loadable_head(setup, code_data, tmp_path, capsys):
    target, data, _ = setup
    torch.set_num_threads(1)
    pool = torch.from_numpy(data.train[:160].astype(np.int64)).view(8, 20)
    cfg = HeadTrainConfig(TRAIN, alpha_batches=1, feature_cache_tokens=2000, generated_fraction=0.5, init="random",
                          feature_cache_refresh=5)
    head, result = train_head(target, data, cfg, device="cpu", pool=pool, log_path=tmp_path / "head.csv")
    assert result.steps == TRAIN.steps and len(result.losses) == TRAIN.steps and result.step_ms > 0
    assert sum(result.losses[-5:]) < 0.8 * sum(result.losses[:5])
    assert not any(p.requires_grad for p in target.parameters())
    assert len((tmp_path / "head.csv").read_text().splitlines()) == TRAIN.steps + 1

    from specdec.cli import main
    from specdec.zoo.models import build_model, save_model

    real = TokenData.load(code_data)
    folder = save_model(build_model(PRESETS["tiny"].target, real.meta["vocab_size"]), tmp_path / "target",
                        real.tokenizer_dir)
    code = main(["train", "head", "--target", str(folder), "--data", str(code_data), "--out", str(tmp_path / "h"),
                 "--steps", "4", "--batch-size", "4", "--seq-len", "32", "--device", "cpu", "--quiet",
                 "--feature-cache-tokens", "1024"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and summary["config"]["feature_cache_tokens"] == 1024
    from specdec.loading import load_model

    fast = FastLlama.from_hf(load_model(folder, device="cpu", dtype="float32"))
    assert FeatureHead.load(tmp_path / "h", target=fast).config.dim == 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_cached_path_matches_the_target_pass_and_trains(setup):
    """On the GPU (bf16 autocast, bf16 cache, fused AdamW skipped on the device): the cached loss is the
    target-pass loss within bf16 tolerance, and a cached run with refreshes trains."""
    target, data, head = setup
    target, head = copy.deepcopy(target).cuda(), copy.deepcopy(head).cuda()
    cfg = HeadTrainConfig(TRAIN, depth=3, feature_noise=0.0)
    cache = build_feature_cache(target, data, max_tokens=64 * 16, batch_size=4, seq_len=15,
                                rng=np.random.default_rng(1), device="cuda")
    assert cache.corpus.features.dtype == torch.bfloat16
    tokens, features = cache.sample(4, torch.Generator(device="cuda").manual_seed(0))
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        cached = head_loss(head, target, features, tokens, target.lm_head(features), cfg)[0]
        hidden, p_logits = _target_pass(target, tokens)
        fresh = head_loss(head, target, hidden, tokens, p_logits, cfg)[0]
    torch.testing.assert_close(cached.float(), fresh.float(), atol=2e-2, rtol=2e-2)
    gen = torch.Generator(device="cuda").manual_seed(0)  # the fused KL at the zoo's vocabulary, bf16
    p_logits = torch.randn(4, 100, 8192, device="cuda", generator=gen).bfloat16() * 4
    q0 = torch.randn(4, 100, 8192, device="cuda", generator=gen).bfloat16()
    grads = []
    for kernel in ("triton", "reference"):
        q = q0.clone().requires_grad_(True)
        kl = kl_rows(q, p_logits, kernel=kernel)
        kl.mean().backward()
        grads.append((kl.detach(), q.grad.float()))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-8, rtol=1e-2)
    run = HeadTrainConfig(replace(TRAIN, steps=60), alpha_batches=1, feature_cache_tokens=2000,
                          feature_cache_refresh=4, log_every=7)
    _, result = train_head(target, data, run, device="cuda")
    assert result.steps == 60 and len(result.losses) == 60 and all(np.isfinite(result.losses))
    assert sum(result.losses[-5:]) < sum(result.losses[:5])
