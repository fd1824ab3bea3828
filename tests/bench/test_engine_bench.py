"""engine_bench's arithmetic on CPU: the two predictions from timed stats, and batch-1 rows on a tiny pair."""

import math

import pytest
import torch
import transformers

from specdec.analysis import expected_tokens
from specdec.bench.engine_bench import batch1, cost_model
from specdec.engine import Engine, EngineConfig
from specdec.metrics import SpecStats


def test_cost_model_matches_the_formulas():
    plain = SpecStats(num_steps=100, verify_time_s=0.100)  # 1 ms per 1-token step
    # γ = 4 in every step: 50 steps, 200 drafter forwards of 0.1 ms, verify 1.2 ms per step, α = 0.8
    spec = SpecStats(num_steps=50, drafter_calls=200, draft_time_s=0.020, verify_time_s=0.060,
                     drafted_tokens=200, speculative_row_steps=50, beta_sum=80.0, beta_count=100)
    out = cost_model(plain, spec)
    assert out["c"] == pytest.approx(0.1)
    assert out["verify_ratio"] == pytest.approx(1.2)
    e = expected_tokens(0.8, 4)
    assert out["predicted_thm38"] == pytest.approx(e / 1.4)
    assert out["predicted_cost_aware"] == pytest.approx(e / 1.6)
    assert cost_model(plain, SpecStats()) == {"plain_step_ms": pytest.approx(1.0)}  # no drafts: no prediction


def test_batch1_rows_on_a_tiny_pair():
    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    draft = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, "num_hidden_layers": 1})).eval()
    config = EngineConfig(max_batch_size=1, max_seq_len=64, max_draft_tokens=4)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = batch1(Engine(target, None, config), {"model": Engine(target, draft, config)}, prompts, 6, gammas=(2, "auto"))
    assert set(out) == {"plain", "model_gamma2", "model_auto"}
    row = out["model_gamma2"]
    # γ 2, except where a row's budget (6 tokens) leaves it fewer to commit: it never drafts past what it can keep
    assert 1 < row["mean_gamma"] <= 2 and 1.0 <= row["tau"] <= 3.0
    for key in ("c", "verify_ratio", "predicted_thm38", "predicted_cost_aware", "measured_vs_cost_aware"):
        assert math.isfinite(row[key]) and row[key] > 0, key
    auto = out["model_auto"]["policy"]  # "auto"'s read-out: what it measured and chose, its depth profile
    assert "policy" not in row and auto["buckets"]["1"] and isinstance(auto["depth_shape"], list)
