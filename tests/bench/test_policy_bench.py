"""Smoke tests for the draft-length policy benchmark (specdec.bench.policy_bench, `specdec policies`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import save_tiny_checkpoint
from specdec.cli import main
from specdec.bench.policy_bench import BenchSettings, PolicyBenchResult, run_policy_bench
from specdec.bench.workloads import Workload, repetitive_workload
from specdec.metrics import SpecStats

transformers = pytest.importorskip("transformers")


def _peaked_llama(seed: int, layers: int):
    # Peaked logits: greedy argmaxes far from float ties, so batched and single-token scoring agree exactly.
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return model


@pytest.fixture(scope="module")
def pair():
    return _peaked_llama(0, 2), _peaked_llama(1, 1)


def test_bench_structure_and_greedy_outputs_match_plain(pair) -> None:
    target, draft = pair
    workload = Workload("short", "two short prompts", ((5, 6, 7, 8, 9), (3, 4, 3, 4, 3, 4)))
    settings = BenchSettings(policies=(3, "heuristic"), max_new_tokens=12, repeats=2, warmup_tokens=2)
    messages: list[str] = []
    result = run_policy_bench(target, {"model": draft}, [workload], settings, on_progress=messages.append)

    assert isinstance(result, PolicyBenchResult)
    assert [(r.drafter, r.policy) for r in result.rows] == [(None, "plain"), ("model", "fixed-3"), ("model", "heuristic")]
    assert messages and messages[0].startswith("warm-up")
    for row in result.rows:
        assert row.workload == "short" and row.temperature == 0.0
        assert len(row.tokens_per_second_runs) == 2 and row.tokens_per_second > 0
        assert row.generated_tokens == 2 * 12  # EOS ignored: every configuration does the same work
        # the greedy promise: every policy reproduces plain decoding, for every prompt and repeat
        assert row.compared_outputs == 4 and row.identical_outputs == 4
    plain, fixed, heuristic = result.rows
    assert plain.speedup == 1.0 and plain.mean_accepted_length == 1.0 and plain.alpha is None
    assert 2.0 < fixed.mean_num_draft_tokens <= 3.0  # 3, but the last steps draft only what they can commit
    for row in (fixed, heuristic):
        assert 1.0 <= row.mean_accepted_length <= row.mean_num_draft_tokens + 1
        assert 0.0 <= row.alpha <= 1.0 and row.cost_ratio > 0
    winners = result.winners()
    assert len(winners) == 1 and winners[0]["best_fixed"] == "model:fixed-3"
    assert winners[0]["best_adaptive"] == "model:heuristic" and winners[0]["adaptive_over_fixed"] > 0
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["rows"]) == 3 and data["settings"]["policies"] == ["fixed-3", "heuristic"]
    table = result.to_markdown()
    assert "| short | fixed-3 |" in table and "4/4" in table


def test_bench_sampling_runs_and_rejects_bad_settings(pair) -> None:
    target, draft = pair
    workload = Workload("w", "one prompt", ((1, 2, 3),))
    result = run_policy_bench(target, {"model": draft}, [workload],
                              BenchSettings(policies=(2,), max_new_tokens=6, repeats=1, temperatures=(1.0,),
                                            warmup_tokens=0))
    assert all(r.compared_outputs is None for r in result.rows)  # no identity check when sampling
    assert result.rows[1].alpha is not None and math.isfinite(result.rows[1].speedup)
    with pytest.raises(ValueError, match="repeats"):
        BenchSettings(repeats=0)
    with pytest.raises(ValueError, match="policies"):
        BenchSettings(policies=(0,))
    with pytest.raises(ValueError, match="empty prompt"):
        Workload("w", "", ((),))
    with pytest.raises(ValueError, match="workloads"):
        run_policy_bench(target, {"model": draft}, [], BenchSettings())


def test_pooled_stats_add_counts_and_positions(pair) -> None:
    import specdec

    target, draft = pair
    runs = [specdec.generate(target, [[1, 2, 3]], drafter=draft, max_new_tokens=8, temperature=0, num_draft_tokens=g,
                             eos_token_id=[]).stats for g in (2, 3)]
    merged = SpecStats.pooled(runs)
    assert merged.num_generated_tokens == 16 and merged.max_num_draft_tokens == 3
    assert len(merged.reached_by_position) == 3
    assert merged.reached_by_position[0] == runs[0].reached_by_position[0] + runs[1].reached_by_position[0]


def test_repetitive_workload_is_repetitive(tmp_path) -> None:
    save_tiny_checkpoint(tmp_path, seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    workload = repetitive_workload(tokenizer, num_prompts=2, prompt_tokens=16)
    assert len(workload.prompts) == 2 and all(len(p) >= 16 for p in workload.prompts)


def test_cli_policies_json_and_files(tmp_path, capsys) -> None:
    save_tiny_checkpoint(tmp_path / "target", seed=0)
    save_tiny_checkpoint(tmp_path / "draft", seed=1, layers=1)
    code = main(["policies", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                 "--workloads", "repetitive", "--policies", "2,heuristic", "--drafters", "model,lookup",
                 "--prompts", "1", "--prompt-tokens", "16", "--max-new-tokens", "6", "--repeats", "1",
                 "--out", str(tmp_path / "out"), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["command"].startswith("specdec policies --target")
    labels = [row["label"] for row in summary["rows"]]
    assert labels == ["plain", "model:fixed-2", "model:heuristic", "lookup:fixed-2", "lookup:heuristic"]
    assert all(row["identical_outputs"] == row["compared_outputs"] == 1 for row in summary["rows"])
    assert (tmp_path / "out" / "policies.json").is_file()
    assert "Command: `specdec policies" in (tmp_path / "out" / "policies.md").read_text()


def test_cli_policies_errors(tmp_path, capsys) -> None:
    assert main(["policies", "--target", str(tmp_path / "missing"), "--draft", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["policies", "--target", str(tmp_path), "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_code_and_text_workloads_from_local_files(tmp_path) -> None:
    from specdec.bench.workloads import build_workloads

    save_tiny_checkpoint(tmp_path, seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    code, text = build_workloads(tokenizer, ["code", "text"], num_prompts=2, prompt_tokens=16)
    assert code.name == "code" and len(code.prompts) == 2 and len(code.sources) == 2
    assert all(len(p) == 17 and p[0] == tokenizer.eos_token_id for p in code.prompts)  # document start + 16
    assert text.name == "text" and 1 <= len(text.prompts) <= 2
    with pytest.raises(ValueError, match="unknown workload"):
        build_workloads(tokenizer, ["poetry"])


def test_result_round_trips_through_json(pair) -> None:
    target, draft = pair
    result = run_policy_bench(target, {"model": draft}, [Workload("w", "", ((1, 2, 3),))],
                              BenchSettings(policies=(1, "optimal"), max_new_tokens=4, repeats=2, warmup_tokens=0))
    again = PolicyBenchResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.to_markdown() == result.to_markdown() and again.winners() == result.winners()
    winner = again.winners()[0]
    assert winner["repeats"] == 2 and 0 <= winner["adaptive_wins_repeats"] <= 2
