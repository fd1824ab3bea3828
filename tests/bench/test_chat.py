"""`specdec bench --preset chat --quick` (tiny random models on CPU): the chat benchmark's four arms — prefix caching
on/off × speculation on/off — on the same conversations, its JSON fields, hit rates (> 0 with caching; 0 without:
the negative control) and the tokens of caching off; its options checked by name."""

from __future__ import annotations

import json

import pytest

from specdec.bench.chat import ChatSpec, chat_workload
from specdec.cli import main

FIELDS = ("arm", "caching", "speculation", "requests", "prompt_tokens", "generated_tokens", "prefill_tokens",
          "prefix_cache_queries", "prefix_cache_hits", "hit_rate", "ttft_p50_s", "ttft_p99_s", "itl_p99_s",
          "throughput_tok_s", "wall_s", "tokens_equal_caching_off")


@pytest.mark.parametrize("drafter", ["model", "head"])
def test_quick_chat_run(tmp_path, capsys, drafter):
    assert main(["bench", "--preset", "chat", "--quick", "--chat-drafter", drafter, "--json", "--quiet",
                 "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = json.loads((tmp_path / "chat.json").read_text())
    rows = {(r["caching"], r["speculation"]): r for r in result["rows"]}
    assert set(rows) == {(False, False), (True, False), (False, True), (True, True)}
    for row in rows.values():
        assert all(field in row for field in FIELDS)
        assert row["tokens_equal_caching_off"] is True and row["requests"] == 9
        assert row["ttft_p50_s"] > 0 and row["throughput_tok_s"] > 0
    for spec_on in (False, True):
        assert rows[(True, spec_on)]["hit_rate"] > 0.5 and rows[(False, spec_on)]["hit_rate"] == 0
        assert rows[(True, spec_on)]["prefill_tokens"] < rows[(False, spec_on)]["prefill_tokens"]
        assert rows[(True, spec_on)]["prompt_tokens"] == rows[(False, spec_on)]["prompt_tokens"]  # same workload
    assert "hit_rate_points_speculative_minus_plain" in summary["summary"] and summary["json"].endswith("chat.json")


def test_the_workload_shares_the_system_prompt_and_resends_history():
    spec = ChatSpec(conversations=5, clients=2, turns=(3, 8), system_tokens=100)
    work = chat_workload(spec, None, 256)
    assert len(work["system"]) == 100 and len(work["users"]) == 5
    assert all(3 <= len(turns) <= 8 for turns in work["users"])
    assert chat_workload(spec, None, 256) == work  # (seeded)
    with pytest.raises(ValueError, match="turns must be"):
        ChatSpec(turns=(4, 2))


def test_random_prompts_share_nothing(tmp_path, capsys):
    """--random-prompts (the cost of prefix caching when nothing hits): the same four arms, every prompt fresh
    random ids and no history, so caching on finds no hit (the default workload's hit rate > 0.5 above is the
    negative control); the summary carries caching on's throughput over off's."""
    assert main(["bench", "--preset", "chat", "--quick", "--random-prompts", "--json", "--quiet",
                 "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]
    result = json.loads((tmp_path / "chat.json").read_text())
    assert result["spec"]["random_prompts"] is True
    for row in result["rows"]:
        assert row["hit_rate"] == 0 and row["prefix_cache_hits"] == 0 and row["tokens_equal_caching_off"] is True
        assert row["prefill_tokens"] >= row["prompt_tokens"] - row["requests"]  # every prompt prefilled whole
    assert {"throughput_caching_on_over_off_plain", "throughput_caching_on_over_off_speculative",
            "tokens_per_cpu_s_caching_on_over_off_plain", "prefix_cache_share_of_wall_speculative"} <= set(summary)
    rows = {(r["caching"], r["speculation"]): r for r in result["rows"]}
    for spec_on in (False, True):  # the cache's own time: measured with caching on, none without
        assert 0 < rows[(True, spec_on)]["prefix_cache_s"] < rows[(True, spec_on)]["wall_s"]
        assert rows[(False, spec_on)]["prefix_cache_s"] == 0 and rows[(True, spec_on)]["cpu_s"] > 0
    spec = ChatSpec(**{**result["spec"], "turns": tuple(result["spec"]["turns"]),
                       "user_tokens": tuple(result["spec"]["user_tokens"]),
                       "answer_tokens": tuple(result["spec"]["answer_tokens"])})
    work = chat_workload(spec, [[5, 6, 7] * 40], 256)  # (texts are ignored: random ids)
    assert work["system"] == [] and work["resend"] is False
    firsts = [turns[0] for turns in work["users"]]
    assert all(len(t) >= spec.system_tokens + spec.user_tokens[0] for t in firsts)
    assert len({tuple(t[:16]) for turns in work["users"] for t in turns}) == sum(map(len, work["users"]))


@pytest.mark.parametrize("argv, message", [
    (["--preset", "chat"], "needs --quick"),
    (["--preset", "chat", "--quick", "--slots", "4"], "--slots does not apply to --preset chat"),
    (["--preset", "chat", "--quick", "--turns", "5", "2"], "--turns must be LO HI"),
    (["--preset", "chat", "--quick", "--clients", "2", "4"], "one level"),
    (["--quick", "--conversations", "3"], "--conversations belongs to --preset chat"),
    (["--quick", "--random-prompts"], "--random-prompts belongs to --preset chat"),
])
def test_options_are_checked(capsys, argv, message):
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
