"""The traffic benchmark: its knobs refused in one line before anything is built, its traffic, its driver (on a
fake engine with a known clock-free behaviour), and `specdec bench --quick` end to end (structure, not speed)."""

import json

import pytest

from specdec.bench.traffic import (
    Arrival, TrafficSpec, _schedule, drive, make_requests, markdown_table, parse_arrival, parse_policy,
)
from specdec.cli import main
from specdec.request import SamplingParams
from specdec.step import RequestOutput


# ------------------------------------------------------------------------------------------------ knobs
def test_arrivals_and_policies_parse():
    assert parse_arrival("closed") == Arrival("closed")
    assert parse_arrival("closed:12") == Arrival("closed", clients=12)
    assert parse_arrival("poisson:2.5") == Arrival("poisson", rate=2.5)
    assert parse_arrival("poisson:0.8x") == Arrival("poisson", relative=0.8)
    assert parse_arrival("poisson:0.8x").label == "poisson:0.8x" and Arrival("closed").label == "closed:2xslots"
    assert parse_policy("auto") == "auto" and parse_policy("4") == 4


@pytest.mark.parametrize("text", ["poisson", "poisson:-1", "poisson:0", "poisson:nan", "poisson:inf", "poisson:abc",
                                  "poisson:200x", "closed:0", "closed:1.5", "closed:99999", "uniform:3", ""])
def test_bad_arrivals_are_refused_in_one_line(text):
    with pytest.raises(ValueError) as err:
        parse_arrival(text)
    assert "\n" not in str(err.value) and "arrival" in str(err.value)


@pytest.mark.parametrize("value", ["0", "-2", "99", "fast", 1.5])
def test_bad_policies_are_refused(value):
    with pytest.raises(ValueError, match="policy"):
        parse_policy(value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(slots=(0,)), "slots"), (dict(slots=(257,)), "slots"), (dict(slots=(True,)), "slots"), (dict(slots=()), "slots"),
    (dict(policies=("sometimes",)), "policy"), (dict(requests_per_slot=0), "requests_per_slot"),
    (dict(requests_per_slot=float("nan")), "requests_per_slot"), (dict(prompt_tokens=(50, 10)), "prompt_tokens"),
    (dict(new_tokens=(0, 5)), "new_tokens"), (dict(sampled_share=1.5), "sampled_share"),
    (dict(min_requests=0), "min_requests"),
])
def test_traffic_spec_validates_every_number(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrafficSpec(**kwargs)


# ---------------------------------------------------------------------------------------------- traffic
def test_requests_follow_the_spec_and_the_seed():
    pool = [list(range(1, 40)), list(range(50, 60))]
    spec = TrafficSpec(prompt_tokens=(30, 200), new_tokens=(4, 20), sampled_share=0.5)
    reqs = make_requests(pool, 200, spec, (7,), seed=3, max_total=150)
    assert reqs == make_requests(pool, 200, spec, (7,), seed=3, max_total=150)
    assert all(30 <= len(r.prompt) <= 130 and len(r.prompt) + r.params.max_new_tokens <= 150 for r in reqs)
    assert all(4 <= r.params.max_new_tokens <= 20 and r.params.eos_token_ids == (7,) for r in reqs)
    sampled = sum(r.params.temperature > 0 for r in reqs)
    assert 60 < sampled < 140 and len({r.params.seed for r in reqs}) == 200
    assert not make_requests(pool, 5, TrafficSpec(eos=False), (7,), seed=0)[0].params.eos_token_ids
    with pytest.raises(ValueError, match="exceed"):
        make_requests(pool, 1, TrafficSpec(prompt_tokens=(100, 200), new_tokens=(4, 64)), (), 0, max_total=120)


def test_poisson_offsets_have_the_asked_rate():
    offsets, clients = _schedule(Arrival("poisson", rate=50.0), 4000, 8, 50.0, seed=1)
    assert clients == 0 and offsets == sorted(offsets)
    assert offsets[-1] / len(offsets) == pytest.approx(1 / 50.0, rel=0.06)
    assert _schedule(Arrival("closed"), 10, 8, None, 0) == ([], 16)


class _FakeEngine:
    """One token per running request per step (finished at max_new_tokens); records the peak in flight."""

    class device:
        type = "cpu"

    class policy:
        @staticmethod
        def set_fixed(gamma):
            _FakeEngine.gamma = gamma

    class runner:
        num_mixed_steps = 0

    overlap = None  # (no async scheduling)

    def __init__(self):
        self.running, self.peak, self.stats_value = {}, 0, None

    @property
    def stats(self):
        from specdec.metrics import SpecStats

        return SpecStats()

    @stats.setter
    def stats(self, value):
        self.stats_value = value

    def add_request(self, prompt, params: SamplingParams, request_id=None):
        self.running[request_id] = params.max_new_tokens
        self.peak = max(self.peak, len(self.running))
        return request_id

    def has_unfinished(self):
        return bool(self.running)

    @property
    def num_running(self):
        return len(self.running)

    def step(self):
        outs = []
        for rid in list(self.running):
            self.running[rid] -= 1
            done = self.running[rid] == 0
            outs.append(RequestOutput(rid, [5], None, 0, 0, done, "length" if done else None))
            if done:
                del self.running[rid]
        return outs


@pytest.mark.parametrize("arrival, slots, peak", [(Arrival("closed", clients=3), 8, 3), (Arrival("closed"), 4, 4),
                                                   (Arrival("poisson", rate=1e5), 2, 2)])
def test_the_driver_caps_slots_and_clients_and_counts_every_token(arrival, slots, peak):
    spec = TrafficSpec(prompt_tokens=(5, 9), new_tokens=(2, 6))
    reqs = make_requests([[1, 2, 3, 4, 5, 6]], 20, spec, (), seed=0)
    engine = _FakeEngine()
    out = drive(engine, reqs, slots, arrival, 4, rate=arrival.rate)
    assert engine.peak == peak and _FakeEngine.gamma == 4
    assert out["tokens"] == sum(r.params.max_new_tokens for r in reqs) and out["requests"] == 20
    assert 0 <= out["ttft_p50_s"] <= out["ttft_p99_s"] <= out["seconds"]
    assert out["itl_p50_s"] <= out["itl_p99_s"] and out["captures"] == 0


# ------------------------------------------------------------------------------------------------ the CLI
QUICK = ["bench", "--quick", "--slots", "1", "2", "--arrival", "closed", "poisson:0.8x", "--new-tokens", "2", "6",
         "--prompt-tokens", "20", "60", "--requests-per-slot", "1.5", "--json"]


def test_bench_quick_writes_the_whole_table(tmp_path, capsys):
    from specdec.bench.traffic_setup import DRAFTERS, MAX_DRAFT_TOKENS
    from specdec.cli.bench import MAX_BENCH_GAMMA, TRAFFIC_DRAFTERS

    assert DRAFTERS == TRAFFIC_DRAFTERS and MAX_DRAFT_TOKENS == MAX_BENCH_GAMMA  # (the CLI checks against these)
    assert main(QUICK + ["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(printed[-1])
    result = json.loads((tmp_path / "traffic.json").read_text())
    rows = result["rows"]
    assert summary["rows"] == len(rows) == 2 * 2 * (1 + len(DRAFTERS))  # slots × arrivals × (plain + drafters)
    cells = {(r["slots"], r["arrival"]) for r in rows}
    assert cells == {(s, a) for s in (1, 2) for a in ("closed:2xslots", "poisson:0.8x")}
    for cell in cells:
        arms = [r for r in rows if (r["slots"], r["arrival"]) == cell]
        assert [r["drafter"] for r in arms] == ["plain", *DRAFTERS]
        plain = arms[0]
        assert plain["policy"] == "0" and plain["mean_gamma"] == 0
        for r in arms[1:]:
            assert r["policy"] == "auto" and r["vs_plain"] == pytest.approx(r["tok_s"] / plain["tok_s"])
        for r in arms:
            assert r["tokens"] > 0 and r["requests"] == max(3, round(1.5 * cell[0])) and r["captures"] == 0
            for kind in ("greedy", "sampled"):  # per temperature: TPOT p50, and plain's over it
                tpot, speedup = r["extra"][f"tpot_p50_{kind}_s"], r["extra"][f"speedup_{kind}"]
                if speedup is not None:
                    assert speedup == pytest.approx(plain["extra"][f"tpot_p50_{kind}_s"] / tpot)
                    assert r is not plain or speedup == 1.0
            assert r["ttft_p50_s"] <= r["ttft_p99_s"]
            policy = r["extra"]["policy"]  # what the policy measured and chose; its steps' share of the run
            assert 0 < policy["step_share"] <= 1 and policy["clock_s"] > 0
            chosen = sum(v.get("chosen", 0) for arms_ in policy["buckets"].values() for v in arms_.values())
            assert (chosen > 0) == (r["policy"] == "auto")
        if cell[1].startswith("poisson"):
            assert plain["extra"]["rate_per_s"] > 0
    assert set(summary["summary"]) == {f"{d}/auto" for d in DRAFTERS}
    warm = result["warmup"]  # every engine warmed before its first run: plain γ = 0, the drafters "auto"'s menu
    assert set(warm) == {"plain", *DRAFTERS} and warm["plain"]["gammas"] == [0] and warm["plain"]["complete"]
    assert all(warm[d]["gammas"] == [0, 1, 2, 4, 8] and warm[d]["shapes"] > warm["plain"]["shapes"] for d in DRAFTERS)
    table = (tmp_path / "traffic.md").read_text().strip().splitlines()
    assert len(table) == 2 + len(rows) and table[0].startswith("| slots | arrival |")
    assert not (tmp_path / "traffic.partial.jsonl").exists()  # (rows went there as they came; all are in the JSON)
    assert (tmp_path / "traffic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "captures" not in table[0]  # nothing is captured on a CPU: no column of zeros
    for r, line in zip(rows, table[2:]):  # a row that never drafted says so instead of a ratio
        assert ("never drafted" in line) == (r["drafter"] != "plain" and r["mean_gamma"] == 0)


@pytest.mark.parametrize("extra, message", [
    (["--slots", "0"], "--slots"), (["--slots", "300"], "--slots"), (["--arrival", "poisson:-3"], "--arrival"),
    (["--arrival", "bursty"], "--arrival"), (["--policy", "99"], "--policy"), (["--policy", "auto", "12"], "--policy"), (["--sampled-share", "2"], "--sampled-share"),
    (["--prompt-tokens", "90", "10"], "--prompt-tokens"), (["--requests-per-slot", "0"], "--requests-per-slot"),
    (["--max-seconds", "-1"], "--max-seconds"), (["--num-draft-tokens", "3"], "--num-draft-tokens"), (["--pair", "x"], "--pair"),
    (["--repeats", "0"], "--repeats"), (["--repeats", "21"], "--repeats"),
    (["--dtype", "float16"], "--dtype"), (["--device", "cuda"], "--device"),
])
def test_bench_quick_refuses_bad_knobs_before_building_anything(extra, message, capsys, monkeypatch, tmp_path):
    import specdec.bench.traffic_setup as setup

    monkeypatch.setattr(setup, "quick_setup", lambda *a, **k: pytest.fail("built models before checking"))
    assert main(QUICK + ["--out", str(tmp_path)] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_serve_refuses_repeats(capsys):
    assert main(["bench", "--quick", "--serve", "--repeats", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeats: --serve runs levels" in err[0]


def test_traffic_options_are_refused_by_the_presets(capsys):
    assert main(["bench", "--preset", "smoke", "--slots", "4"]) == 2
    assert "--slots" in capsys.readouterr().err


def test_the_gpu_table_without_cuda_says_so(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench"]) == 2
    assert "--quick" in capsys.readouterr().err


def test_markdown_table_has_a_row_per_arm():
    from specdec.bench.traffic import ArmResult

    row = ArmResult(8, "closed:16", "model", "auto", 10, 100, 1.0, 100.0, 0.01, 0.02, 0.003, 0.004, 0.003, 0.7, 3.1, 0,
                    vs_plain=1.25)
    text = markdown_table([row])
    assert "| 8 | closed:16 | model | auto | 100 | 1.25x |" in text and "captures" not in text
    captured = ArmResult(8, "closed:16", "model", "4", 10, 100, 1.0, 100.0, 0.01, 0.02, 0.003, 0.004, 0.003, 0.7, 4.0,
                         3, vs_plain=1.1)
    assert "captures" in markdown_table([row, captured]).splitlines()[0]  # shown once some row captured


def test_a_row_that_never_drafted_says_so():
    from specdec.bench.traffic import ArmResult
    from specdec.bench.traffic_table import summary

    idle = ArmResult(1, "closed:2", "model", "auto", 3, 30, 1.0, 30.0, 0.01, 0.02, 0.003, 0.004, 0.003, None, 0.0, 0,
                     vs_plain=1.13)
    drafted = ArmResult(1, "closed:2", "lookup", "auto", 3, 30, 1.0, 30.0, 0.01, 0.02, 0.003, 0.004, 0.003, 0.5, 1.5,
                        0, vs_plain=1.35)
    text = markdown_table([idle, drafted])
    assert "never drafted (plain)" in text and "1.13x" not in text and "1.35x" in text
    out = summary([idle, drafted])
    assert out["model/auto"] == {"min_vs_plain": None, "median_vs_plain": None, "cells": 0, "never_drafted": 1}
    assert out["lookup/auto"]["cells"] == 1 and "never_drafted" not in out["lookup/auto"]


def test_bench_quick_serve_runs_plain_and_speculative_levels(tmp_path, capsys):
    """`specdec serve` on the demo pair (CPU) under its own streaming clients: a closed level per --clients and a
    Poisson level, plain and speculative requests on the same server."""
    argv = ["bench", "--quick", "--serve", "--clients", "1", "2", "--new-tokens", "2", "5", "--prompt-tokens", "8", "30",
            "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = json.loads((tmp_path / "serve.json").read_text())
    levels = result["levels"]
    assert [(r["arrival"], r["mode"]) for r in levels] == [
        (a, m) for a in ("closed:1", "closed:2", levels[-1]["arrival"]) for m in ("plain", "speculative")]
    assert levels[-1]["arrival"].startswith("poisson:")
    assert [r["requests"] for r in levels] == [2, 2, 4, 4, 4, 4]
    for r in levels:
        assert r["output_tokens"] > 0 and r["throughput_tok_s"] > 0 and r["vs_plain"] > 0
        tau = r["accepted_per_step"]  # (speculative: None when "auto" ran the whole level plain)
        assert tau is None if r["mode"] == "plain" else (tau is None or tau >= 1.0)
    assert any("engine runner, γ=auto" in line for line in result["server_log"])
    assert len(summary["levels"]) == len(levels)
    assert "| closed:2 |" in (tmp_path / "serve.md").read_text()


def test_a_warmed_engine_under_traffic_builds_no_step_shape_with_auto():
    """No capture inside a run: after `warm_engines`, "auto" only runs step shapes the warm-up built (CPU: the
    would-be captures are the graph cache's key misses, `step_shapes`). The negative control: the same traffic
    on an engine that was not warmed builds shapes as it goes (on CUDA, each a ~0.1 s stall)."""
    from specdec.bench.traffic import warm_engines
    from specdec.bench.traffic_setup import quick_setup
    from specdec.text.warmup import step_shapes

    spec = TrafficSpec(slots=(8,), arrivals=(Arrival("closed"),), policies=("auto",), prompt_tokens=(20, 200),
                       new_tokens=(2, 40), min_requests=3)
    cold, warm = quick_setup(("model",), max_batch=8).arms["model"], quick_setup(("model",), max_batch=8)
    requests = make_requests(warm.pool, 24, spec, (2,), seed=8, max_total=256)
    assert drive(cold, requests, 8, Arrival("closed"), "auto")["captures"] == step_shapes(cold) > 0
    reports = warm_engines(spec, warm.plain, warm.arms)
    engine = warm.arms["model"]
    assert reports["model"]["gammas"] == [0, 1, 2, 4, 8] and reports["plain"]["gammas"] == [0]
    decode = 4 * 5 * 3 * 2  # batch × γ × length buckets × flavor; the warm-up also builds the mixed step's shapes
    assert step_shapes(engine) == decode < reports["model"]["shapes"] and engine.config.mixed_step is True
    for _ in range(2):
        assert drive(engine, requests, 8, Arrival("closed"), "auto")["captures"] == 0
    assert engine.policy.only_ready and {g for _, g, _ in engine.policy.samples} > {0}  # (speculative arms ran)


def _fake_drive(log: list, speeds):
    """A `drive` stand-in: each call logged as (engine, policy); its tokens/s `speeds(engine, policy, k)`, k the
    call's index among that (engine, policy)'s calls (priming and untimed calls included)."""
    counts: dict = {}

    def drive_(engine, requests, slots, arrival, gamma, rate=None, seed=0):
        key = (engine, gamma)
        k = counts[key] = counts.get(key, -1) + 1
        log.append(key)
        tok_s = speeds(engine, gamma, k)
        return {"requests": len(requests), "tokens": 100, "seconds": 100 / tok_s, "tok_s": tok_s, "ttft_p50_s": 0.1,
                "ttft_p99_s": 0.2, "itl_p50_s": 0.01, "itl_p99_s": 0.01 * k + 0.02, "tpot_p50_s": 0.01, "alpha": None,
                "mean_gamma": 0.0 if gamma == 0 else 2.0, "captures": 0, "completed_per_s": 1.0, "tpot_p50_greedy_s": 0.01,
                "tpot_p50_sampled_s": None, "policy": {}, "stalls": {}, "mixed_steps": 0, "ahead_steps": 0}
    return drive_


def test_repeats_time_every_arm_per_round_in_rotated_orders_and_report_the_median_ratio(monkeypatch):
    """Three rounds over plain, a γ = 4 arm and an "auto" arm: round k starts at arm k; each round's ratio is taken
    against plain's run of that round; the row is the arm's median run, `vs_plain` the median ratio."""
    import specdec.bench.traffic as traffic

    log: list = []
    plain_speed = {0: 100.0, 1: 100.0, 2: 100.0, 3: 80.0, 4: 120.0}  # plain's calls: prime, untimed, 3 timed

    def speeds(engine, gamma, k):
        if engine == "plain":
            return plain_speed[k]
        return {4: 150.0, "auto": 160.0}[gamma] + k  # (grows with the call: the median run is the middle one)
    monkeypatch.setattr(traffic, "drive", _fake_drive(log, speeds))
    spec = TrafficSpec(slots=(2,), arrivals=(Arrival("closed"),), policies=(4, "auto"), repeats=3, min_requests=3)
    rows = traffic.run_traffic(spec, "plain", {"m": "m"}, [[1, 2, 3, 4, 5, 6]])
    assert [(r.drafter, r.policy) for r in rows] == [("plain", "0"), ("m", "4"), ("m", "auto")]
    # round 0: plain (prime, untimed, timed), m (prime 4 and auto, untimed 4, timed 4), m auto (untimed, timed);
    # round 1 rotated by one: m 4, m auto, plain; round 2: m auto, plain, m 4
    assert log == [("plain", 0)] * 3 + [("m", 4), ("m", "auto"), ("m", 4), ("m", 4), ("m", "auto"), ("m", "auto"),
                                        ("m", 4), ("m", "auto"), ("plain", 0), ("m", "auto"), ("plain", 0), ("m", 4)]
    plain, four, auto = rows
    # plain's timed runs: 100 (round 0), 80 (round 1), 120 (round 2); γ = 4's: its calls 2, 3, 4 → 152, 153, 154
    assert plain.tok_s == 100.0 and plain.vs_plain == 1.0
    ratios = [152 / 100, 153 / 80, 154 / 120]
    assert [x["vs_plain"] for x in four.extra["repeats"]] == pytest.approx(ratios)
    assert four.vs_plain == pytest.approx(sorted(ratios)[1]) and four.tok_s == 153.0  # median ratio; median run
    assert [x["tok_s"] for x in auto.extra["repeats"]] == [162.0, 163.0, 164.0]
    assert "completed_per_s" not in four.extra
    text = markdown_table(rows)
    assert f"| {four.vs_plain:.2f}x ({min(ratios):.2f}–{max(ratios):.2f}) |" in text


def test_one_repeat_is_the_table_as_before_and_a_deadline_keeps_whole_rounds(monkeypatch):
    import specdec.bench.traffic as traffic

    log: list = []
    monkeypatch.setattr(traffic, "drive", _fake_drive(log, lambda engine, gamma, k: 100.0 if engine == "plain" else 150.0))
    spec = TrafficSpec(slots=(2,), arrivals=(Arrival("closed"),), policies=("auto",), min_requests=3)
    rows = traffic.run_traffic(spec, "plain", {"m": "m"}, [[1, 2, 3]])
    assert [r.vs_plain for r in rows] == [1.0, 1.5] and all("repeats" not in r.extra for r in rows)
    # a deadline inside round 1 of 3: the rows come from round 0 alone (its ratios were taken within it)
    clock = iter([0.0, 0.0, 0.0, 10.0])  # the deadline's reads: round 0 (plain, m), round 1 (m, then late for plain)
    monkeypatch.setattr(traffic.time, "perf_counter", lambda: next(clock, 10.0))
    spec = TrafficSpec(slots=(2, 4), arrivals=(Arrival("closed"),), policies=("auto",), repeats=3, min_requests=3)
    rows = traffic.run_traffic(spec, "plain", {"m": "m"}, [[1, 2, 3]], deadline=5.0)
    assert [(r.slots, r.drafter, r.vs_plain) for r in rows] == [(2, "plain", 1.0), (2, "m", 1.5)]
    assert all("repeats" not in r.extra for r in rows)


@pytest.mark.parametrize("bad", [0, 21, 1.5, True])
def test_repeats_are_checked(bad):
    with pytest.raises(ValueError, match="repeats must be an integer in"):
        TrafficSpec(repeats=bad)


def test_bench_quick_repeats_each_arm_and_reports_the_spread(tmp_path, capsys):
    # (a fixed γ: "auto" on the CPU may never draft — its choice reads the clock — and the row then shows no ratio)
    argv = ["bench", "--quick", "--slots", "2", "--arrival", "closed", "--drafters", "model", "--policy", "2",
            "--new-tokens", "2", "6", "--prompt-tokens", "20", "60", "--requests-per-slot", "1.5", "--repeats", "2",
            "--json", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "traffic.json").read_text())["rows"]
    assert [r["drafter"] for r in rows] == ["plain", "model"]
    assert all(len(r["extra"]["repeats"]) == 2 for r in rows)
    model = rows[1]
    ratios = [x["vs_plain"] for x in model["extra"]["repeats"]]
    assert model["vs_plain"] == pytest.approx(sum(ratios) / 2)  # (the median of two)
    assert f"({min(ratios):.2f}–{max(ratios):.2f})" in (tmp_path / "traffic.md").read_text()
