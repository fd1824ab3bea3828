"""Chunked prefill as the mixed step (`EngineConfig.prefill_budget`, `engine/prefill.py`): a budget's chunks ride in
the running rows' steps (`mixed_step` resolved True) and give the same tokens as prefilling whole at admission
(greedy and seeded T = 1, the model drafter and the feature head, γ fixed and "auto"), at most one budget of prompt
tokens between two decode steps of a running request while a 2,000-token prompt is admitted (negative control:
without a budget one step prefills it whole), slot exchanges and aborts of filling requests, deadlines
(`prefill_steps`), where the mixed step cannot run (the static layout, bitwise: whole prefills; control: the paged
layout fills), and the option's validation. The mixed step's own forward: tests/engine/test_mixed_step.py."""

import pytest
import torch

from helpers import hf_greedy
from specdec.engine import Engine, EngineConfig
from prefill_helpers import drive as _drive
from prefill_helpers import head as _head
from prefill_helpers import mixed_params as _mixed_params
from prefill_helpers import prompt as _prompt
from specdec.engine.kv_pool import PagedSlotCache
from specdec.engine.slots import SlotCache
from specdec.request import SamplingParams

BUDGET = 24


@pytest.mark.parametrize("drafter", ["model", "head"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_a_budget_gives_the_tokens_of_a_whole_prefill(make_llama, drafter, gamma):
    target = make_llama(0)
    draft = make_llama(5, layers=1) if drafter == "model" else _head(target)
    early = [_prompt(5, 1), _prompt(9, 2)]
    late = [_prompt(70, 3), _prompt(4, 4), _prompt(41, 5), _prompt(12, 6)]  # longer than the budget, and shorter
    params = _mixed_params(len(early) + len(late))
    runs, filling, mixed = [], [], []
    for budget in (None, BUDGET):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=gamma,
                                                    admit_min=1, prefill_budget=budget, mixed_step=False))
        runs.append(_drive(engine, early, late, params, watch=lambda e, _: filling.append(e.num_prefilling)))
        mixed.append((engine.config.mixed_step, engine.runner.num_mixed_steps))
    assert max(filling) >= 1  # the budgeted run did fill requests across steps (not a vacuous comparison)
    assert mixed[0] == (False, 0) and mixed[1][0] is True and mixed[1][1] > 0  # its chunks rode in mixed steps
    compared = range(len(params)) if gamma != "auto" else range(0, len(params), 2)  # auto: γ follows the clock
    for i in compared:
        assert runs[1][i] == runs[0][i], (i, params[i].temperature)
    assert runs[1][2] == hf_greedy(target, late[0], 20, [])  # the longest, greedy: the target's own tokens


def test_a_long_prompt_admitted_mid_flight_does_not_stall_the_running_rows(make_llama):
    """Between two decode steps of a running request at most one budget of prompt tokens is prefilled (target and
    drafter together, counted by `engine.prefill_tokens`), and every running row produces a token every step while
    a 2,000-token prompt fills; without a budget one step prefills all of it (the negative control)."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    for model in (target, draft):
        model.config.max_position_embeddings = 2304  # (the engine's own RoPE tables cover any context)
    long = _prompt(2000, 7)
    early = [_prompt(6 + i, 10 + i) for i in range(4)]
    params = [SamplingParams(temperature=0, max_new_tokens=120)] * 4 + [SamplingParams(temperature=0, max_new_tokens=8)]
    budget = 256
    results = {}
    for setting in (budget, None):
        engine = Engine(target, draft, EngineConfig(max_batch_size=5, max_seq_len=2048, num_draft_tokens=2,
                                                    admit_min=1, prefill_budget=setting, mixed_step=False))
        between, stalled, seen = [], [], {"fed": 0}

        def watch(e, outs, between=between, stalled=stalled, seen=seen):
            between.append(e.prefill_tokens - seen["fed"])
            seen["fed"] = e.prefill_tokens
            if e.num_prefilling:  # the long prompt is filling: the running rows go on
                stalled.extend(o.request_id for o in outs if not o.new_token_ids and not o.finished)
                assert len(outs) == e.num_running + sum(o.finished for o in outs)

        results[setting] = (_drive(engine, early, [long], params, join_after=2, watch=watch), between, stalled)
        assert (engine.runner.num_mixed_steps > 0) == (setting is not None)  # (the chunks: in the verify forwards)
    tokens, between, stalled = results[budget]
    assert max(between[1:]) <= budget and sum(between) >= 2 * (len(long) - 2)  # target and drafter, a budget a step
    assert sum(1 for b in between if b) >= (2 * len(long) - 3) // budget  # spread over that many steps
    assert stalled == []
    plain_tokens, plain_between, _ = results[None]
    assert max(plain_between[1:]) > budget  # negative control: the whole prompt in the step that admits it
    assert tokens == plain_tokens


def test_a_filling_request_exchanges_slots_with_a_younger_one_and_aborts_leave(make_llama, monkeypatch):
    """An older filling request becoming ready while a younger one fills slot n: the two exchange slots
    (`SlotCache.swap`), and the tokens stay those of a whole prefill; an aborted filling request leaves at once."""
    target = make_llama(0)
    draft = make_llama(5, layers=1)
    swaps = []
    swap = SlotCache.swap
    monkeypatch.setattr(SlotCache, "swap", lambda self, *a: swaps.append(a) or swap(self, *a))
    paged_swap = PagedSlotCache.swap  # (the default layout: the rows' block tables exchanged)
    monkeypatch.setattr(PagedSlotCache, "swap", lambda self, *a: swaps.append(a) or paged_swap(self, *a))
    prompts = [_prompt(5, 1), _prompt(6, 2), _prompt(7, 3), _prompt(90, 4), _prompt(8, 5), _prompt(30, 6)]
    # slots 0-2 run; the long one fills slot 3; slot 1's request finishes first, so the next one fills slot 2
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=m) for i, m in enumerate([40, 8, 40, 10, 10, 6])]
    runs = []
    for budget in (None, 16):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=160, num_draft_tokens=2,
                                                    admit_min=1, prefill_budget=budget))
        runs.append(_drive(engine, prompts[:3], prompts[3:], params, join_after=1))
    assert swaps, "no exchange of slots happened: the scenario no longer covers it"
    assert runs[1] == runs[0]

    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=160, num_draft_tokens=2, admit_min=1,
                                                prefill_budget=16))
    engine.add_request(prompts[0], params[0])
    engine.step()
    doomed = engine.add_request(prompts[3], params[3])
    engine.step()
    assert engine.num_prefilling == 1
    engine.abort(doomed)
    outs = engine.step()
    assert [o.finish_reason for o in outs if o.request_id == doomed] == ["abort"] and engine.num_prefilling == 0
    kept = engine.add_request(prompts[5], params[5])  # its slot is reused: the tokens of a fresh engine's run
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    fresh = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=160, num_draft_tokens=2))
    alone = fresh.add_request(prompts[5], params[5])
    again = {}
    while fresh.has_unfinished():
        for out in fresh.step():
            again.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert outputs[kept] == again[alone]


@pytest.mark.parametrize("budget, error", [(8, ValueError), (1 << 21, ValueError), ("lots", ValueError),
                                           ("Auto", ValueError), (True, TypeError), (1.5, TypeError),
                                           (0.0, TypeError)])
def test_prefill_budget_is_checked_before_anything_allocates(budget, error):
    with pytest.raises(error, match="prefill_budget"):
        EngineConfig(prefill_budget=budget)


def test_the_mixed_step_is_on_by_default_where_it_runs_and_false_without_a_budget_is_off(make_llama):
    """The default (`DEFAULT_MIXED_STEP`, "auto"): the mixed step on the paged pool under its "auto" budget, whole
    prefills on the static layout; mixed_step False with no budget (None or 0): whole prefills, the mixed step
    resolved off; a budget turns it on."""
    assert EngineConfig().prefill_budget is None and EngineConfig().mixed_step == "auto"
    engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64))
    assert engine.prefill_budget == "auto" and engine.config.mixed_step is True
    engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, kv_layout="static"))
    assert engine.prefill_budget is None and engine.config.mixed_step is False
    for budget in (0, None):
        engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_budget=budget,
                                                          mixed_step=False))
        assert engine.prefill_budget is None and engine.config.mixed_step is False
    engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_budget=32,
                                                      mixed_step=False))
    assert engine.prefill_budget == 32 and engine.config.mixed_step is True


@pytest.mark.parametrize("layout", [dict(kv_layout="static"), dict(bitwise=True)])
def test_where_the_mixed_step_cannot_run_a_budget_leaves_whole_prefills(make_llama, layout):
    """The static layout (bitwise mode's too) has no mixed step (`config.resolve_mixed_step`): a budget there leaves
    prompts prefilling whole at admission — nothing fills, the engine reports no budget — with the same tokens and
    log-probabilities as no budget; mixed_step="auto" resolves False there and mixed_step=True is refused. Control:
    the same budget on the paged layout fills a 40-token prompt across steps in mixed steps."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    early = [_prompt(5, 1), _prompt(9, 2)]
    late = [_prompt(40, 3)]
    params = [SamplingParams(temperature=0.9 if i else 0, top_p=0.9, seed=i, max_new_tokens=10, logprobs=True)
              for i in range(3)]
    results, filled = [], []
    for options in ({**layout, "prefill_budget": None}, {**layout, "prefill_budget": 16}, {"prefill_budget": 16},
                    {**layout, "mixed_step": "auto"}):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                    admit_min=1, **options))
        ids = [engine.add_request(p, q) for p, q in zip(early, params)]
        logprobs: dict = {}
        filling = 0
        for step in range(200):
            if step == 2:
                ids.append(engine.add_request(late[0], params[2]))
            if step > 2 and not engine.has_unfinished():
                break
            for out in engine.step():
                logprobs.setdefault(out.request_id, []).extend(out.logprobs or [])
            filling = max(filling, engine.num_prefilling)
        results.append([logprobs[i] for i in ids])
        filled.append((filling, engine.config.mixed_step, engine.prefill_budget, engine.runner.num_mixed_steps))
    assert filled[0] == filled[1] == filled[3] == (0, False, None, 0)  # whole prefills: no budget, no mixed step
    assert filled[2][0] >= 1 and filled[2][1:3] == (True, 16) and filled[2][3] > 0  # the control: paged fills
    assert len(results[1][2]) == 10 and results[1] == results[0] == results[3]
    with pytest.raises(ValueError, match="mixed_step=True"):
        EngineConfig(mixed_step=True, **layout)


def test_the_policy_sees_what_each_budget_of_prefill_cost():
    """`AdmissionCost.prefilled`: per budget, the target's and the drafter's seconds per prompt token become samples
    (the drafter's bounded by the target's), the requests count when they join, and nothing is left unfed."""
    from specdec.engine.policy_admission import AdmissionCost

    cost = AdmissionCost()
    cost.prefilled(100, 0.010, 0, None, 0, 0)  # a budget of the target alone (a long prompt's first chunks)
    assert cost.feed_per_prompt_token() is None and cost.report()["target_prefill_us_per_prompt_token"] == 100.0
    cost.prefilled(50, 0.005, 50, 0.001, 1, 150)  # the rest, then the drafter's feed: the request joins
    assert cost.feed_per_prompt_token() == pytest.approx(20e-6)  # min(feed 20 µs, target 100, ratio 0.2 × 100)
    assert cost.backlog() == 0.0 and cost.report()["prompt_tokens_per_request"] == 150
    cost.stepped(2, 10.0, 1)  # the joined request counts as a row that came, none finished
    assert cost.report()["tokens_per_request"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("drafter", ["model", "head"])
def test_a_budget_under_cuda_graphs_gives_the_tokens_of_a_whole_prefill(make_llama, drafter):
    """On CUDA (decode and mixed steps replayed as graphs, filling rows inside their batch bucket dead or padding): the
    tokens of a whole prefill, greedy and seeded T = 1 at a fixed γ."""
    target = make_llama(0).cuda()
    draft = make_llama(5, layers=1).cuda() if drafter == "model" else _head(target)
    early = [_prompt(5, 1), _prompt(9, 2), _prompt(3, 9)]
    late = [_prompt(150, 3), _prompt(4, 4), _prompt(61, 5), _prompt(12, 6), _prompt(99, 7)]
    params = _mixed_params(len(early) + len(late))
    runs = []
    for budget in (0, 256, 16, "auto"):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=200, num_draft_tokens=3,
                                                    admit_min=1, prefill_budget=budget))
        assert engine.prefill_budget == (budget or None) and engine.config.mixed_step is bool(budget)
        runs.append(_drive(engine, early, late, params))
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[3] == runs[0]


def test_the_drafters_catch_up_is_whole_with_a_budget(make_llama):
    """After a plain run the drafter's catch-up is not cut by the prefill budget (starved by the prompts, a catch-up
    spread over steps left rows drafting from stale caches and cost "auto" 0.55x at 64 slots on an H200): one feed
    in the first speculative step, one catch-up event for the policy, the twin drafter (the target itself) has every
    draft accepted from that step on; the tokens are those of the run without a budget."""
    target = make_llama(0)
    prompts = [_prompt(6 + 3 * i, 20 + i) for i in range(4)]
    params = [SamplingParams(temperature=0, max_new_tokens=60)] * 2 + \
        [SamplingParams(temperature=1.0, seed=7 + i, max_new_tokens=60) for i in range(2)]
    pattern = [3, 3] + [0] * 12 + [3] * 10
    runs, parts = [], {}
    for budget in (None, 16):
        engine = Engine(target, make_llama(0), EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens="auto",
                                                            prefill_budget=budget))
        ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
        outputs: dict = {}
        fed, accepted = [], []
        for gamma in pattern:
            engine.policy.set_fixed(gamma)
            before, drafts = engine.prefill_tokens, engine.stats.accepted_tokens
            for out in engine.step():
                outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            fed.append(engine.prefill_tokens - before)
            accepted.append(engine.stats.accepted_tokens - drafts)
        runs.append([outputs[i] for i in ids])
        parts[budget] = (fed, accepted, sum(len(v) for v in engine.policy.catch_up_events.values()))
    assert runs[1] == runs[0]
    for budget in (None, 16):
        fed, accepted, events = parts[budget]
        assert fed[14] > 16 and not any(fed[15:]) and events == 1  # 4 rows x ~12 plain tokens, in one feed
        assert all(a == 3 * 4 for a in accepted[14:])  # q = p: every draft accepted, sampled rows too


def test_a_budget_beside_beam_groups(make_llama):
    """Filling requests stay below the slots beam groups hold (and a group waits above them): a long chain prompt
    filling a budget per step while chains run and a beam group is admitted gives transformers' tokens and beams."""
    from helpers import hf_beams
    from specdec.engine.beam import BeamParams

    target, draft = make_llama(0), make_llama(5, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=128, num_draft_tokens=3, admit_min=1,
                                                prefill_budget=16))
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    prompts = [_prompt(6, 1), _prompt(7, 2), _prompt(60, 3), _prompt(9, 4)]
    ids = [engine.add_request(p, greedy) for p in prompts[:2]]
    outputs: dict = {}
    filling = 0
    for step in range(500):
        if step == 2:
            ids.append(engine.add_request(prompts[2], greedy))
            beam = engine.add_request(prompts[3], greedy, beams=BeamParams(2, num_return_sequences=2))
        if step > 2 and not engine.has_unfinished():
            break
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        filling = max(filling, engine.num_prefilling)
    assert filling >= 1 and engine.runner.num_mixed_steps > 0
    for rid, prompt in zip(ids, prompts):
        assert [t for o in outputs[rid] for t in o.new_token_ids] == hf_greedy(target, prompt, 12, [])
    final = outputs[beam][-1]
    assert [list(b) for b in final.beams] == hf_beams(target, tuple(prompts[3]), 2, (), 12, 1.0, False)[0]


def test_prefill_steps_feeds_every_request_within_k_steps_of_its_admission(make_llama):
    """`prefill_steps` K: the budget adapts to the backlog (a burst of long prompts admitted at once is fed within K
    steps, each step at most max(budget, ⌈what the oldest requests still need / steps to their deadline⌉)), so
    admitted requests cannot hold their slots filling while the queue grows — the starvation a fixed budget showed
    at 64 clients on an H200; the tokens stay those of a whole prefill. Negative control: the fixed budget takes
    longer than K steps for the same burst."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    early = [_prompt(5, 1), _prompt(7, 2)]
    late = [_prompt(90, 3), _prompt(70, 4), _prompt(50, 5), _prompt(30, 6)]
    params = _mixed_params(len(early) + len(late), max_new=30)
    runs, waits = [], {}
    for budget, steps in ((None, None), (16, 3), (16, None)):
        engine = Engine(target, draft, EngineConfig(max_batch_size=6, max_seq_len=160, num_draft_tokens=3,
                                                    admit_min=1, prefill_budget=budget, prefill_steps=steps))
        filling, fed = [], []

        def watch(e, _, filling=filling, fed=fed, seen={"fed": 0}):
            filling.append(e.num_prefilling)
            fed.append(e.prefill_tokens - seen["fed"])
            seen["fed"] = e.prefill_tokens

        runs.append(_drive(engine, early, late, params, join_after=2, watch=watch))
        waits[(budget, steps)] = (sum(1 for f in filling if f), fed)
    assert runs[1] == runs[0] and runs[2] == runs[0]
    adaptive, fixed = waits[(16, 3)], waits[(16, None)]
    assert 1 <= adaptive[0] <= 2  # the burst filled for at most K - 1 steps past its admission step
    assert fixed[0] > 3  # negative control: 16 a step takes many steps for ~480 tokens
    assert max(adaptive[1][2:]) <= -(-sum(2 * len(p) - 3 for p in late) // 3)  # ≤ ⌈backlog / K⌉ a step


def test_prefill_steps_needs_a_budget():
    with pytest.raises(ValueError, match="prefill_steps=4 needs a prefill_budget or mixed_step"):
        EngineConfig(prefill_steps=4, mixed_step=False)
    EngineConfig(prefill_steps=4)  # (the default mixed_step "auto": its "auto" budget, where the mixed step runs)  # (its "auto" budget, where the mixed step runs)
    with pytest.raises(ValueError, match="prefill_steps"):
        EngineConfig(prefill_budget=64, prefill_steps=0)


def test_a_request_left_filling_when_nothing_runs_prefills_its_rest_whole(make_llama):
    """No step carries chunks once every running request finished: a 90-token prompt filling 16 tokens a step
    beside one short request has the rest of its prompt (target and drafter) prefilled at once in the step after
    that request finishes (`prefill.prefill_rest`, the profile's "prefill" phase), joins, and gives a whole
    prefill's tokens. Control: beside a request that outlives its fill, no such prefill runs."""
    from specdec.engine.profile import phase_timer

    target, draft = make_llama(0), make_llama(5, layers=1)
    long = _prompt(90, 3)
    runs, rests = {}, {}
    for budget, first in ((None, 3), (16, 3), (16, 60)):
        params = [SamplingParams(temperature=0, max_new_tokens=first), SamplingParams(temperature=1.0, seed=4,
                                                                                      max_new_tokens=12)]
        engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=2,
                                                    admit_min=1, prefill_budget=budget))
        with phase_timer(engine, phases=("prefill",)) as timer:
            runs[(budget, first)] = _drive(engine, [_prompt(5, 1)], [long], params, join_after=1)
        rests[(budget, first)] = timer.truthy.get("prefill", 0)
    assert rests[(16, 3)] == 1 and runs[(16, 3)] == runs[(None, 3)]
    assert rests[(16, 60)] == 0  # the control: its chunks rode in the running row's steps
