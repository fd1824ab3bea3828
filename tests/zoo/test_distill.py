from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdec.zoo.data import TokenData
from specdec.zoo.distill import acceptance_per_position, alpha_on_batches, distill_draft, kl_loss
from specdec.zoo.presets import PRESETS
from specdec.zoo.models import build_model
from specdec.zoo.train import train_model

TINY = PRESETS["tiny"]


def test_acceptance_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    beta = acceptance_per_position(p_logits, q_logits, 1.0)
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    for i in range(5):
        assert beta[i] == pytest.approx(sum(min(float(p[i, x]), float(q[i, x])) for x in range(7)), abs=1e-6)
    greedy = acceptance_per_position(p_logits, q_logits, 0.0)
    assert torch.equal(greedy, (p_logits.argmax(-1) == q_logits.argmax(-1)).float())
    assert float(acceptance_per_position(p_logits, p_logits, 1.0).min()) == pytest.approx(1.0)
    assert float(kl_loss(p_logits, p_logits, torch.ones(5, dtype=torch.bool))) == pytest.approx(0.0, abs=1e-6)


def test_distillation_raises_alpha(code_data, tmp_path):
    data = TokenData.load(code_data)
    vocab = data.meta["vocab_size"]
    target, _ = train_model(TINY.target, data, replace(TINY.target_train, steps=30), vocab_size=vocab,
                            device="cpu", progress=False)
    draft = build_model(TINY.drafts[0].shape, vocab, seed=1)  # untrained: far from the target
    cfg = replace(TINY.drafts[0].distill, train=replace(TINY.drafts[0].distill.train, steps=30, lr=3e-3))
    result = distill_draft(target, draft, data, cfg, log_path=tmp_path / "distill.csv", device="cpu", progress=False)
    assert result.alpha_after[1.0] > result.alpha_before[1.0] + 0.05
    assert set(result.alpha_after) == {0.0, 1.0}  # greedy α is reported too (too noisy to assert on 30 steps)
    assert (tmp_path / "distill.csv").is_file()
    assert not any(p.requires_grad for p in target.parameters())  # the teacher stayed frozen


def test_alpha_agrees_with_specdec_analysis(code_data):
    analysis = pytest.importorskip("specdec.analysis")
    if not hasattr(analysis, "measure_alpha"):
        pytest.skip("specdec.analysis.measure_alpha not available")
    data = TokenData.load(code_data)
    vocab = data.meta["vocab_size"]
    target, draft = build_model(TINY.target, vocab, seed=0), build_model(TINY.drafts[0].shape, vocab, seed=1)
    batches = data.val_batches(4, 32, 1)
    ours = alpha_on_batches(target, draft, batches, device="cpu")
    seqs = batches[0].tolist()
    for t in (0.0, 1.0):
        theirs = analysis.measure_alpha(target, draft, seqs, temperature=t).alpha
        assert ours[t] == pytest.approx(theirs, abs=1e-4)


def test_generate_greedy_matches_hf_generate(code_data):
    from specdec.zoo.distill import generate_greedy, prompts_from_stream

    data = TokenData.load(code_data)
    target, _ = train_model(TINY.target, data, replace(TINY.target_train, steps=10), vocab_size=data.meta["vocab_size"],
                            device="cpu", progress=False)
    prompts = prompts_from_stream(data.val, 3, 8, seed=0)
    ours = generate_greedy(target, prompts, 12, batch_size=2, device="cpu")
    assert ours.shape == (3, 20) and torch.equal(ours[:, :8], prompts)
    hf = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=12,
                         min_new_tokens=12, do_sample=False)
    eos = (hf[:, 8:] == 2).cumsum(1) > 0  # HF may stop at </s>; ours runs on
    assert torch.equal(ours[:, 8:][~eos], hf[:, 8:][~eos])


def test_pair_with_generated_pool_and_target_init(code_data, tmp_path):
    from transformers import AutoModelForCausalLM

    from specdec.zoo.pipeline import train_pair
    from specdec.zoo.presets import DistillConfig, DraftRecipe, GeneratedPool, ModelShape

    quick = replace(TINY.target_train, steps=12, eval_every=6)
    distill = DistillConfig(replace(quick, lr=2e-3), alpha_batches=1, generated_fraction=0.5)
    preset = replace(
        TINY, target_train=quick,
        pool=GeneratedPool(prompt_len=8, new_tokens=24, batch_size=8, max_seconds=5, val_sequences=4),
        drafts=(DraftRecipe(ModelShape("llama", dim=64, layers=1, heads=2, ff=128, max_len=256), init="target",
                            distill=distill),
                DraftRecipe(TINY.drafts[0].shape, pretrain=quick, distill=distill)),
        export_dtype="float16", max_shard_size="200KB",
    )
    summary = train_pair(preset, code_data, tmp_path / "pair", device="cpu", progress=False)
    first, second = summary["drafts"]
    assert first["copied_from_target"] == ["embed_tokens", "norm", "layers.0"]
    assert summary["generated_pool"]["val_sequences"] == 4
    for d in (first, second):
        assert set(d["distill"]["alpha_generated_after"]) == {"0.0", "1.0"}
    assert "steps" in second and "steps" not in first  # only the scratch drafter was pre-trained
    for name in ("target", "draft0", "draft1"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "pair" / name)
        assert model.dtype == torch.float32
    assert (tmp_path / "pair" / "logs" / "distill1.csv").is_file()
