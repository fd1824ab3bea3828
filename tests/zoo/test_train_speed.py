"""The GPU training speed-ups (specdec/zoo/speed.py and run_training's fast path), checked on CPU for
exactness: the fused step skipped on the device, causal SDPA without a mask, the one-lse loss, device windows.
Throughput itself was measured on a GPU (BENCHMARKS.md; the script: git show 26f890c:scripts/train_speed.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec.zoo.data import TokenData
from specdec.zoo.presets import PRESETS, ModelShape
from specdec.zoo.speed import DeviceWindows, causal_attention, skip_non_finite_step
from specdec.zoo.models import build_model
from specdec.zoo.train import MAX_CONSECUTIVE_SKIPS, run_training
from specdec.zoo.train_steps import lm_loss

TINY = PRESETS["tiny"]


def test_lm_loss_matches_cross_entropy_and_z_loss():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen) * 3
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    targets[0, :2] = -100
    loss, ce = lm_loss(logits, targets, z_loss=1e-2)
    ref_ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    lse = torch.logsumexp(logits.flatten(0, 1)[targets.flatten() != -100], -1)
    assert torch.allclose(ce, ref_ce, atol=1e-6)
    assert torch.allclose(loss, ref_ce + 1e-2 * lse.pow(2).mean(), atol=1e-6)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_causal_attention_matches_hf_sdpa(kv_heads):
    model = build_model(ModelShape("llama", dim=32, layers=2, heads=4, ff=64, kv_heads=kv_heads, max_len=64), 97).eval()
    ids = torch.randint(3, 97, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        with causal_attention(model) as on:
            assert on and model.config._attn_implementation != "sdpa"
            out = model(input_ids=ids).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(out, ref, atol=1e-5)


def test_causal_attention_refuses_a_mask_and_leaves_t5_alone():
    model = build_model(TINY.target, 97)
    ids = torch.randint(3, 97, (1, 8))
    with causal_attention(model), pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]]))
    with causal_attention(build_model(PRESETS["tiny-ende"].target, 97)) as on:
        assert not on


def test_skip_on_device_changes_nothing_then_steps():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.1, fused=True)
    p.grad = torch.full((3,), float("nan"))
    flag = skip_non_finite_step(opt, torch.tensor(float("nan")), torch.tensor(1.0))
    assert float(flag) == 1.0 and torch.equal(p.data, torch.ones(3)) and float(opt.state[p]["step"]) == 0
    p.grad = torch.ones(3)
    flag = skip_non_finite_step(opt, torch.tensor(2.0), torch.tensor(1.0))
    assert float(flag) == 0.0 and (p.data < 1).all() and float(opt.state[p]["step"]) == 1
    with pytest.raises(ValueError, match="fused"):
        skip_non_finite_step(torch.optim.AdamW([p]), torch.tensor(1.0), torch.tensor(1.0))


def test_device_windows_are_stream_slices():
    stream = np.arange(1000, dtype=np.uint16)
    batch = DeviceWindows(stream, torch.device("cpu"), seed=0)(4, 9)
    assert batch.shape == (4, 10) and batch.dtype == torch.long
    assert (batch[:, 1:] - batch[:, :-1] == 1).all()


def test_fast_path_trains_logs_every_n_and_skips_on_device(code_data, tmp_path):
    data = TokenData.load(code_data)
    cfg = replace(TINY.target_train, steps=30, eval_every=15, log_every=10)
    model = build_model(TINY.target, data.meta["vocab_size"])
    result = run_training(model, data, cfg, device="cpu", progress=False, fast=True, log_path=tmp_path / "log.csv")
    assert result.fast and not result.compiled and result.steps == 30 and result.skipped_steps == 0
    assert result.val_curve[-1][1] < result.val_curve[0][1] - 1.0
    steps = [int(r.split(",")[0]) for r in (tmp_path / "log.csv").read_text().splitlines()[1:]]
    assert steps == [0, 10, 15, 20, 30]

    draft = build_model(TINY.drafts[0].shape, data.meta["vocab_size"])
    before = {k: v.clone() for k, v in draft.state_dict().items()}

    def nan_loss(m, batch):
        out = m(input_ids=batch[:, :-1]).logits.float().mean() * float("nan")
        return out, out.detach()

    result = run_training(draft, data, replace(cfg, steps=4), loss_fn=nan_loss, device="cpu", progress=False,
                          fast=True)
    assert result.skipped_steps == 4
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    with pytest.raises(FloatingPointError, match="consecutive"):
        run_training(draft, data, replace(cfg, steps=MAX_CONSECUTIVE_SKIPS + 5), loss_fn=nan_loss, device="cpu",
                     progress=False, fast=True)


def test_time_budget_is_met_by_replanning(code_data):
    data = TokenData.load(code_data)
    cfg = replace(TINY.target_train, steps=100_000, max_seconds=4.0, eval_every=20)
    result = run_training(build_model(TINY.target, data.meta["vocab_size"]), data, cfg, device="cpu", progress=False)
    assert 30 < result.steps < 100_000
    assert 2.5 < result.seconds < 4.0 * 1.1 + 0.5  # stops near the budget, evaluations included
    assert result.val_curve[-1][0] == result.steps  # the planned last step was reached (not cut by the guard)


def test_compiled_graph_attends_causally_without_a_mask():
    """Under torch.compile (torch < 2.14) HF's own SDPA path passes a [B, 1, T, T] mask (no flash kernel);
    inside `causal_attention` the captured graph calls SDPA with is_causal=True and no mask."""
    model = build_model(ModelShape("llama", dim=32, layers=1, heads=2, ff=64, max_len=64), 97)
    ids = torch.randint(3, 97, (2, 16))
    calls = []

    def capture(gm, inputs):
        calls.extend((n.kwargs.get("attn_mask"), n.kwargs.get("is_causal"), len(n.args)) for n in gm.graph.nodes
                     if "scaled_dot_product" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    with causal_attention(model):
        torch.compile(model, backend=capture)(input_ids=ids, use_cache=False)
    torch._dynamo.reset()
    assert calls == [(None, True, 3)]
