from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdec.zoo.data import TokenData
from specdec.zoo.distill import acceptance_per_position, alpha_on_batches, distill_draft, kl_loss
from specdec.zoo.presets import PRESETS
from specdec.zoo.train import build_model, train_model

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
    draft = build_model(TINY.drafts[0], vocab, seed=1)  # untrained: far from the target
    cfg = replace(TINY.distill, train=replace(TINY.distill.train, steps=30, lr=3e-3))
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
    target, draft = build_model(TINY.target, vocab, seed=0), build_model(TINY.drafts[0], vocab, seed=1)
    batches = data.val_batches(4, 32, 1)
    ours = alpha_on_batches(target, draft, batches, device="cpu")
    seqs = batches[0].tolist()
    for t in (0.0, 1.0):
        theirs = analysis.measure_alpha(target, draft, seqs, temperature=t).alpha
        assert ours[t] == pytest.approx(theirs, abs=1e-4)
