"""The mixed step's feeds and slots (`engine/prefill.py`, `slots.prefill_ragged`): a budget's mixed step computes the
tokens it feeds (ragged chunks, padded to a bucket), a ragged feed (a cached drafter's, the rest of a prompt left
filling when nothing runs) writes what an aligned one does, filling rows sit outside the decode step's bucket, a freed
slot is refilled at once with a budget, and a prompt admitted in a plain run needs no catch-up — each with a negative
control."""

import torch

from prefill_helpers import drive as _drive
from prefill_helpers import head as _head
from prefill_helpers import mixed_params as _mixed_params
from prefill_helpers import prompt as _prompt
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


def test_a_budget_computes_the_tokens_it_feeds_not_every_filling_row(make_llama, monkeypatch):
    """A forward over a slice of rows computes every row of it over its columns: one slice over the fed rows at
    absolute columns [first start, last end) computed rows × columns, not tokens (30 filling rows, 2 fed at different
    offsets, was 15x the tokens). A mixed step's forward computes its chunks' tokens alone, each chunk a ragged row
    of its own, padded to a token bucket (`mixed_shapes`: the smallest bucket ≥ them, at most half again or the
    smallest bucket, 16); one absolute slice over the same steps' fed rows (the control) would compute more than
    twice that. Tokens: those of a whole prefill."""
    from specdec.engine import mixed_step as mixed_module

    target = make_llama(0)  # (no drafter: the target's chunks of consecutive requests share steps)
    calls = []
    real = mixed_module.host_meta

    def recording(layout, chunks, n):
        calls.append((layout.tokens, list(chunks.slots), list(chunks.starts), list(chunks.ends)))
        return real(layout, chunks, n)

    monkeypatch.setattr(mixed_module, "host_meta", recording)
    early = [_prompt(5, 1)]
    late = [_prompt(110, 3), _prompt(23, 4), _prompt(70, 5), _prompt(97, 6), _prompt(41, 7), _prompt(64, 8)]
    params = _mixed_params(len(early) + len(late), max_new=24)
    runs = []
    for budget in (None, 48):
        engine = Engine(target, None, EngineConfig(max_batch_size=8, max_seq_len=160, admit_min=1,
                                                   prefill_budget=budget, prefill_chunk=16,
                                                   mixed_step=bool(budget)))
        calls.clear()
        runs.append(_drive(engine, early, late, params, join_after=1))
    assert runs[1] == runs[0]
    computed = fed = one_slice = 0
    for tokens, slots, starts, ends in calls:
        step = sum(e - s for s, e in zip(starts, ends))
        assert tokens <= max(16, 3 * step // 2), (tokens, step)  # the step's bucket: its chunks, padded
        computed, fed = computed + tokens, fed + step
        one_slice += (max(slots) - min(slots) + 1) * (max(ends) - min(starts))
    assert fed >= sum(len(p) - 1 for p in late)
    assert one_slice > 2 * computed  # the control: the scenario has steps feeding rows far apart in columns


def test_a_ragged_prefill_writes_what_an_aligned_one_does(make_llama):
    """`prefill_ragged` (each row's columns from its own start) leaves the cache and the features a
    `prefill_rows` feed of the same positions leaves (fp32), rows at different offsets in one forward."""
    from specdec.engine.slots import prefill_ragged, prefill_rows

    target = make_llama(0)
    caches = []
    for ragged in (False, True):
        engine = Engine(target, _head(target), EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=2,
                                                            kv_layout="static"))  # (slots compared)
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
                                                    admit_min=1, prefill_budget=budget, mixed_step=bool(budget)))
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
        engine = Engine(target, None, EngineConfig(max_batch_size=32, max_seq_len=64, prefill_budget=budget,
                                                   mixed_step=bool(budget)))
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
                                                                      prefill_budget=budget, mixed_step=bool(budget)))
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
