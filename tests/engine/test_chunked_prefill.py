"""Chunked prefill interleaved with decode steps (`EngineConfig.prefill_budget`, `engine/prefill.py`): the same tokens
as prefilling whole at admission (greedy and seeded T = 1, the model drafter and the feature head, γ fixed and
"auto"), at most one budget of prompt tokens between two decode steps of a running request while a 2,000-token
prompt is admitted (negative control: without a budget one step prefills it whole), slot exchanges and aborts of
filling requests, and the option's validation."""

import pytest
import torch

from helpers import hf_greedy
from specdec.engine import Engine, EngineConfig
from prefill_helpers import drive as _drive
from prefill_helpers import head as _head
from prefill_helpers import mixed_params as _mixed_params
from prefill_helpers import prompt as _prompt
from specdec.engine.slots import SlotCache
from specdec.request import SamplingParams

BUDGET = 24


@pytest.mark.parametrize("drafter", ["model", "head"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_chunked_prefill_gives_the_tokens_of_a_whole_prefill(make_llama, drafter, gamma):
    target = make_llama(0)
    draft = make_llama(5, layers=1) if drafter == "model" else _head(target)
    early = [_prompt(5, 1), _prompt(9, 2)]
    late = [_prompt(70, 3), _prompt(4, 4), _prompt(41, 5), _prompt(12, 6)]  # longer than the budget, and shorter
    params = _mixed_params(len(early) + len(late))
    runs, filling = [], []
    for budget in (None, BUDGET):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=gamma,
                                                    admit_min=1, prefill_budget=budget))
        runs.append(_drive(engine, early, late, params, watch=lambda e, _: filling.append(e.num_prefilling)))
    assert max(filling) >= 1  # the budgeted run did fill requests across steps (not a vacuous comparison)
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
                                                    admit_min=1, prefill_budget=setting))
        between, stalled, seen = [], [], {"fed": 0}

        def watch(e, outs, between=between, stalled=stalled, seen=seen):
            between.append(e.prefill_tokens - seen["fed"])
            seen["fed"] = e.prefill_tokens
            if e.num_prefilling:  # the long prompt is filling: the running rows go on
                stalled.extend(o.request_id for o in outs if not o.new_token_ids and not o.finished)
                assert len(outs) == e.num_running + sum(o.finished for o in outs)

        results[setting] = (_drive(engine, early, [long], params, join_after=2, watch=watch), between, stalled)
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


def test_prefill_budget_is_off_by_default_and_zero_is_off(make_llama):
    assert EngineConfig().prefill_budget is None
    for budget in (0, None):
        assert Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64,
                                                        prefill_budget=budget)).prefill_budget is None
    assert Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64,
                                                    prefill_budget=32)).prefill_budget == 32


def test_bitwise_logprobs_do_not_depend_on_the_prefill_budget(make_llama):
    """Bitwise mode (batch-invariant kernels): a 40-token prompt admitted mid-flight and prefilled a budget of 16 per
    step (chunks starting anywhere, beside other rows) leaves the bits of a whole prefill: same log-probabilities."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    early = [_prompt(5, 1), _prompt(9, 2)]
    late = [_prompt(40, 3)]
    params = [SamplingParams(temperature=0.9 if i else 0, top_p=0.9, seed=i, max_new_tokens=10, logprobs=True)
              for i in range(3)]
    results = []
    for budget in (None, 16):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                    admit_min=1, prefill_budget=budget, bitwise=True))
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
    assert filling >= 1  # (the budgeted run did fill across steps)
    assert len(results[1][2]) == 10 and results[1] == results[0]


def test_the_policy_sees_what_each_budget_of_prefill_cost():
    """`AdmissionCost.prefilled`: per budget, the target's and the drafter's seconds per prompt token become samples
    (the drafter's bounded by the target's), the requests count when they join, and nothing is left unfed."""
    from specdec.engine.policy_admission import AdmissionCost

    cost = AdmissionCost()
    cost.prefilled(100, 0.010, 0, None, 0, 0)  # a budget of the target alone (a long prompt's first part)
    assert cost.feed_per_prompt_token() is None and cost.report()["target_prefill_us_per_prompt_token"] == 100.0
    cost.prefilled(50, 0.005, 50, 0.001, 1, 150)  # the rest, then the drafter's feed: the request joins
    assert cost.feed_per_prompt_token() == pytest.approx(20e-6)  # min(feed 20 µs, target 100, ratio 0.2 × 100)
    assert cost.backlog() == 0.0 and cost.report()["prompt_tokens_per_request"] == 150
    cost.stepped(2, 10.0, 1)  # the joined request counts as a row that came, none finished
    assert cost.report()["tokens_per_request"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("drafter", ["model", "head"])
def test_chunked_prefill_under_cuda_graphs_gives_the_tokens_of_a_whole_prefill(make_llama, drafter):
    """On CUDA (decode steps replayed as graphs, filling rows inside their batch bucket as padding): the tokens of a
    whole prefill, greedy and seeded T = 1 at a fixed γ."""
    target = make_llama(0).cuda()
    draft = make_llama(5, layers=1).cuda() if drafter == "model" else _head(target)
    early = [_prompt(5, 1), _prompt(9, 2), _prompt(3, 9)]
    late = [_prompt(150, 3), _prompt(4, 4), _prompt(61, 5), _prompt(12, 6), _prompt(99, 7)]
    params = _mixed_params(len(early) + len(late))
    runs = []
    for budget in (0, 256, 16, "auto"):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=200, num_draft_tokens=3,
                                                    admit_min=1, prefill_budget=budget))
        assert engine.prefill_budget == (budget or None)
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


def test_chunked_prefill_beside_beam_groups(make_llama):
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
    assert filling >= 1
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
    with pytest.raises(ValueError, match="prefill_steps=4 needs a prefill_budget"):
        EngineConfig(prefill_steps=4)
    with pytest.raises(ValueError, match="prefill_steps"):
        EngineConfig(prefill_budget=64, prefill_steps=0)


def test_a_budget_computes_the_rows_it_feeds_not_every_filling_row(make_llama, monkeypatch):
    """A forward over a slice of rows computes every row of it over its columns: one slice over the fed rows at
    absolute columns [first start, last end) (`prefill_rows`) computed rows × columns, not tokens (30 filling rows,
    2 fed at different offsets, was 15x the tokens). The target's feeds are ragged (`prefill_ragged`: each row's
    columns from its own start) and grouped: per step, the token slots its forwards compute stay within the
    tokens fed plus one `prefill_chunk` per forward; one absolute slice over the same steps' fed rows (the control)
    would compute more than twice that. Tokens: those of a whole prefill."""
    import specdec.engine.prefill as prefill_module

    target = make_llama(0)  # (no drafter: the target's feeds of consecutive requests share steps)
    calls = []
    real = prefill_module.prefill_ragged

    def recording(model, cache, state, rows, starts, ends, *args, **kwargs):
        calls.append((rows, list(starts), list(ends)))
        return real(model, cache, state, rows, starts, ends, *args, **kwargs)

    monkeypatch.setattr(prefill_module, "prefill_ragged", recording)
    early = [_prompt(5, 1)]
    late = [_prompt(110, 3), _prompt(23, 4), _prompt(70, 5), _prompt(97, 6), _prompt(41, 7), _prompt(64, 8)]
    params = _mixed_params(len(early) + len(late), max_new=24)
    runs, steps = [], []
    for budget in (None, 48):
        engine = Engine(target, None, EngineConfig(max_batch_size=8, max_seq_len=160, admit_min=1,
                                                   prefill_budget=budget, prefill_chunk=16))
        calls.clear()
        runs.append(_drive(engine, early, late, params, join_after=1,
                           watch=(lambda e, _: steps.append(list(calls)) or calls.clear()) if budget else None))
    assert runs[1] == runs[0]
    computed = fed = forwards = one_slice = 0
    for step in steps:
        for rows, starts, ends in step:
            computed += (rows.stop - rows.start) * max(e - s for s, e in zip(starts, ends))
            fed += sum(e - s for s, e in zip(starts, ends))
            forwards += 1
        if step:
            slots = [i for rows, _, _ in step for i in range(rows.start, rows.stop)]
            one_slice += (max(slots) - min(slots) + 1) * (max(max(e) for _, _, e in step) - min(min(s) for _, s, _ in step))
    assert fed >= sum(len(p) - 1 for p in late) and computed <= fed + forwards * 16
    assert one_slice > 2 * computed  # the control: the scenario has steps feeding rows far apart in columns


def test_a_ragged_prefill_writes_what_an_aligned_one_does(make_llama):
    """`prefill_ragged` (each row's columns from its own start) leaves the cache and the features a
    `prefill_rows` feed of the same positions leaves (fp32), rows at different offsets in one forward."""
    from specdec.engine.slots import prefill_ragged, prefill_rows

    target = make_llama(0)
    caches = []
    for ragged in (False, True):
        engine = Engine(target, _head(target), EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=2))
        prompts = [_prompt(90, 1), _prompt(40, 2), _prompt(70, 3)]
        rows, cache, state = slice(0, 3), engine.cache, engine.state
        feed = prefill_ragged if ragged else prefill_rows
        kwargs = {} if ragged else {"extent": 0}
        with torch.inference_mode():
            state.admit_rows(0, prompts, [SamplingParams()] * 3, [0] * 3)
            prefill_rows(engine.model, cache, state, rows, [0, 0, 0], [30, 10, 50], 16, features=state.features,
                         extent=0)
            feed(engine.model, cache, state, rows, [30, 10, 50], [89, 39, 69], 16, features=state.features, **kwargs)
        caches.append([(cache.keys[:, i, :, :n].clone(), state.features[i, :n].clone()) for i, n in
                       enumerate([89, 39, 69])])
    for (k0, f0), (k1, f1) in zip(*caches):
        assert torch.allclose(k0, k1, atol=1e-5) and torch.allclose(f0, f1, atol=1e-5)


def test_a_filling_prompt_does_not_widen_the_decode_steps_while_a_slot_past_their_bucket_is_free(make_llama):
    """A filling row inside the decode step's batch bucket is padding whose prompt the step's positions span must
    cover; filling requests take the highest free slots, so a 100-token prompt filling beside 3 short rows (bucket 4
    of 8 slots) adds no decode step shape (their span stays the short rows' 64 positions) until it joins. Control:
    with 4 slots the only free slot is inside the bucket and the steps widen while it fills. Tokens: a whole
    prefill's."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    early = [_prompt(5, 1), _prompt(6, 2), _prompt(7, 3)]
    late = [_prompt(100, 4)]
    params = [SamplingParams(temperature=0, max_new_tokens=20)] * 4
    widened, runs = {}, []
    for slots, budget in ((8, None), (8, 16), (4, 16)):
        engine = Engine(target, draft, EngineConfig(max_batch_size=slots, max_seq_len=160, num_draft_tokens=2,
                                                    admit_min=1, prefill_budget=budget))
        shapes = []  # step shapes built by the end of each step in which the long prompt was filling
        runs.append(_drive(engine, early, late, params, join_after=2,
                           watch=lambda e, _, shapes=shapes: shapes.append(e.num_step_shapes) if e.num_prefilling
                           else None))
        widened[(slots, budget)] = shapes
    assert runs[1] == runs[0] and runs[2] == runs[0]
    top, control = widened[(8, 16)], widened[(4, 16)]
    assert len(top) >= 3 and len(control) >= 3  # (filled over several steps)
    assert set(top) == {1}  # the short rows' one step shape, all the while it filled
    assert set(control) == {2}  # the control: a second, wider one from its first filling step


def test_with_a_budget_a_freed_slot_is_refilled_at_once(make_llama):
    """Grouped admission (`admit_min`: max_batch_size // 16 by default) saves the launches of whole prefills; with a
    budget the chunks batch the filling rows anyway, so admission does not wait for a group: a request waiting
    when one of 32 slots frees is admitted at the next step. Control: without a budget it waits for a second free
    slot or `admit_max_wait` steps."""
    target = make_llama(0)
    waited = {}
    for budget in (None, 64):
        engine = Engine(target, None, EngineConfig(max_batch_size=32, max_seq_len=64, prefill_budget=budget))
        for i in range(32):
            engine.add_request(_prompt(4, i), SamplingParams(temperature=0, max_new_tokens=3 if i == 0 else 40))
        engine.add_request(_prompt(5, 99), SamplingParams(temperature=0, max_new_tokens=4))
        waiting = []
        for _ in range(12):
            engine.step()
            waiting.append(engine.num_waiting)
        waited[budget] = sum(waiting)  # steps the 33rd request spent waiting
    assert waited[64] <= 3  # (the first request finishes at its 3rd step; the next step admits)
    assert waited[None] >= waited[64] + 4  # the control: a lone free slot waits (admit_max_wait = 8)


def test_with_a_budget_an_admitted_prompt_needs_no_catch_up(make_llama):
    """Folded: a request admitted during a run of plain steps (γ = 0) is fed target and drafter chunk by chunk
    within the budget and joins with its drafter fed, so the first speculative step's catch-up feeds only what the
    plain steps committed (≤ rows × plain steps), never its prompt. Control: without a budget the prompt admitted in
    the plain run is left to that catch-up (one pass of ≥ its length, beside the running rows' share)."""
    target = make_llama(0)
    early = [_prompt(6, 1), _prompt(7, 2)]
    late = _prompt(90, 3)
    params = SamplingParams(temperature=0, max_new_tokens=60)
    plain_steps = 10
    fed = {}
    for budget in (None, 32):
        engine = Engine(target, make_llama(5, layers=1), EngineConfig(max_batch_size=4, max_seq_len=160,
                                                                      num_draft_tokens="auto", admit_min=1,
                                                                      prefill_budget=budget))
        ids = [engine.add_request(p, params) for p in early]
        engine.policy.set_fixed(2)
        engine.step()
        engine.policy.set_fixed(0)
        for step in range(plain_steps):
            if step == 2:  # (inside the plain run: admission itself does not feed the drafter then)
                ids.append(engine.add_request(late, params))
            engine.step()
        assert engine.num_running == 3 and engine.num_prefilling == 0  # (joined during the plain run)
        engine.policy.set_fixed(2)
        before = engine.prefill_tokens
        engine.step()
        fed[budget] = engine.prefill_tokens - before  # the catch-up of the first speculative step
    assert fed[32] <= 3 * (plain_steps + 1)  # only what the plain steps committed
    assert fed[None] >= len(late) - 2  # the control: the prompt fed by the catch-up
