"""Admission during a run of plain steps: a cached drafter is not fed then; the next speculative step's catch-up
feeds the admitted prompts with what plain steps committed, exactly (the drafter's cache = a fresh prefill), and
only the plain steps' share of that catch-up is charged to them."""

import pytest
import torch

from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.engine import Engine, EngineConfig
from specdec.engine.slots import SlotCache, prefill_rows
from specdec.request import SamplingParams

LONG = [[(7 * i + 3) % 50 + 1 for i in range(30)], [(5 * i + 1) % 40 + 2 for i in range(24)]]


def _engine(make_llama, rows=4, **config):
    target = make_llama(0)
    twin = make_llama(0)  # the drafter is the target itself: with an exact cache, every greedy draft is accepted
    return target, Engine(target, twin, EngineConfig(max_batch_size=rows, max_seq_len=128, num_draft_tokens="auto",
                                                     **config))


def _run(engine, pattern, outputs):
    for gamma in pattern:
        engine.policy.set_fixed(gamma)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)


def test_a_request_admitted_in_a_plain_run_is_fed_to_the_drafter_by_the_catch_up(make_llama):
    target, engine = _engine(make_llama, kv_layout="static")  # (its cache compared slot by slot)
    params = SamplingParams(temperature=0, max_new_tokens=24)
    first = [engine.add_request(p, params) for p in RAGGED_PROMPTS[:2]]
    outputs: dict = {}
    _run(engine, [3, 0, 0], outputs)
    fed = []
    prefill, ragged = engine.drafter.prefill, engine.drafter.prefill_ragged  # (the catch-up feeds ragged)
    engine.drafter.prefill = lambda *a, **k: fed.append(a[1]) or prefill(*a, **k)
    engine.drafter.prefill_ragged = lambda *a, **k: fed.append(a[1]) or ragged(*a, **k)
    late = [engine.add_request(p, params) for p in LONG]
    _run(engine, [0], outputs)  # admitted in the plain run: the target prefills them, the drafter does not
    assert fed == [] and engine.num_running == 4
    with torch.inference_mode():
        assert engine._catch_up_drafter(3)  # what the next speculative step does first: one prefill for all
        share = engine._catch_up_share
        n = engine.num_running
        lengths = engine.state.lengths[:n].tolist()
        fresh = SlotCache(engine.drafter.model, engine.max_batch, engine.num_positions)
        prefill_rows(engine.drafter.model, fresh, engine.state, slice(0, n), [0] * n, [L - 4 for L in lengths], 64)
    assert len(fed) == 1 and 0 < share < 0.5  # mostly the late prompts: not a cost of the plain steps
    for slot, length in enumerate(lengths):  # below the proposal's re-fed window: what a fresh prefill writes
        below = length - 4
        torch.testing.assert_close(engine.drafter.cache.keys[:, slot, :, :below], fresh.keys[:, slot, :, :below])
    accepted = engine.stats.accepted_tokens
    _run(engine, [3], outputs)
    assert engine.stats.accepted_tokens - accepted == 3 * n  # the twin drafter: every draft of every row accepted
    while engine.has_unfinished():
        _run(engine, [2], outputs)
    for rid, prompt in zip(first + late, RAGGED_PROMPTS[:2] + LONG):
        assert outputs[rid] == hf_greedy(target, prompt, 24, [])


def test_admission_feeds_the_drafter_when_the_engine_speculates(make_llama):
    """The negative control: outside a plain run the drafter prefills admitted prompts at once (its batch-1 and
    fixed-γ behaviour is unchanged), and the policy is told what that prefill took; the target's prefill is timed
    at every admission, plain run or not (the bound on the drafter's feed cost). Whole prefills: the mixed step
    feeds prompts in chunks inside the step (`test_mixed_step.py`)."""
    _, engine = _engine(make_llama, mixed_step=False)
    fed, timed = [], []
    prefill, ragged = engine.drafter.prefill, engine.drafter.prefill_ragged  # (the catch-up feeds ragged)
    engine.drafter.prefill = lambda *a, **k: fed.append(a[1]) or prefill(*a, **k)
    engine.drafter.prefill_ragged = lambda *a, **k: fed.append(a[1]) or ragged(*a, **k)
    targets = []
    engine.policy.record_admission = lambda tokens, seconds, requests, target_seconds=None: (
        timed.append((tokens, seconds, requests)), targets.append(target_seconds))
    engine.add_request(LONG[0], SamplingParams(temperature=0, max_new_tokens=8))
    _run(engine, [3], {})
    engine.add_request(LONG[1], SamplingParams(temperature=0, max_new_tokens=8))
    _run(engine, [3, 0, 0], {})
    engine.add_request(LONG[1], SamplingParams(temperature=0, max_new_tokens=8))
    _run(engine, [0], {})  # admitted in a plain run: not fed, its prompt reported without seconds
    assert len(fed) == 2 and [(t, r) for t, _, r in timed] == [(len(LONG[0]), 1), (len(LONG[1]), 1), (len(LONG[1]), 1)]
    assert all(s > 0 for _, s, _ in timed[:2]) and timed[2][1] is None
    assert len(targets) == 3 and all(t is not None and t > 0 for t in targets)


@pytest.mark.parametrize("share, charged", [(1.0, 0.8), (0.25, 0.2), (0.0, None)])
def test_only_the_plain_steps_share_of_a_catch_up_is_charged_to_them(share, charged):
    from specdec.engine.policy import GammaPolicy

    policy = GammaPolicy("auto", 8, plain_catches_up=True)
    for _ in range(3):
        policy.record_step(8, 4, 1.0, 2.0)
    policy.record_step(8, 4, 1.8, 2.0, catch_up_of=4, catch_up_share=share)  # 0.8 s over the usual 1 s
    events = policy.catch_up_events.get(8, [])
    assert (events[-1] if events else None) == (pytest.approx(charged) if charged is not None else None)


def test_a_feature_head_admitted_in_a_plain_run_catches_up_to_a_fresh_prefill(make_llama):
    """The head drafts from the target's features: prompts admitted in a plain run are fed from the features the
    target's prefill wrote, exactly what feeding them at admission would have written."""
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    target = make_llama(0)
    trainable = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    trainable.init_from(target)
    engine = Engine(target, trainable.to_feature_head(),  # (static: its cache compared slot by slot)
                    EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens="auto", kv_layout="static"))
    params = SamplingParams(temperature=0, max_new_tokens=30)
    first = [engine.add_request(p, params) for p in RAGGED_PROMPTS[:2]]
    outputs: dict = {}
    _run(engine, [3, 0, 0], outputs)
    late = [engine.add_request(p, params) for p in LONG]
    _run(engine, [0, 0], outputs)
    drafter = engine.drafter
    with torch.inference_mode():
        assert engine._catch_up_drafter(3)
        n = engine.num_running
        lengths = engine.state.lengths[:n].tolist()
        fresh = SlotCache(drafter.head.layer, engine.max_batch, engine.num_positions)
        prefill_rows(drafter.head.layer, fresh, engine.state, slice(0, n), [0] * n, [L - 1 for L in lengths], 64,
                     embeds=drafter._entries)
    assert n == 4
    for slot, length in enumerate(lengths):
        below = length - 1 - drafter.window  # the next proposal re-feeds the window itself
        if slot >= 2:  # the rows admitted in the plain run, fed only by the catch-up
            assert below > 4
        if below > 0:
            torch.testing.assert_close(drafter.cache.keys[:, slot, :, :below], fresh.keys[:, slot, :, :below])
    while engine.has_unfinished():
        _run(engine, [3], outputs)
    for rid, prompt in zip(first + late, RAGGED_PROMPTS[:2] + LONG):
        assert outputs[rid] == hf_greedy(target, prompt, 30, [])


def test_a_catch_up_of_rows_at_different_lengths_is_fed_ragged(make_llama):
    """Rows of very different lengths lag at very different offsets after a plain run: the catch-up feeds them in
    one ragged forward (each row from its own start), computing rows × the longest lag instead of rows × the span
    of their offsets (more than 3x that here); the twin drafter then has every draft accepted (the caches exact)."""
    _, engine = _engine(make_llama)
    params = SamplingParams(temperature=0, max_new_tokens=30)
    for prompt in (LONG[0] * 2 + LONG[1], RAGGED_PROMPTS[0], LONG[1] * 2, RAGGED_PROMPTS[1]):
        engine.add_request(prompt, params)
    calls = []
    ragged = engine.drafter.prefill_ragged
    engine.drafter.prefill_ragged = lambda state, rows, starts, ends, *a, **k: (
        calls.append((rows, list(starts), list(ends))), ragged(state, rows, starts, ends, *a, **k))
    _run(engine, [3] + [0] * 6, {})
    accepted = engine.stats.accepted_tokens
    _run(engine, [3], {})  # the catch-up, then a step every draft of which the twin accepts
    assert engine.stats.accepted_tokens - accepted == 3 * engine.num_running
    (rows, starts, ends), = calls
    fed = [(s, e) for s, e in zip(starts, ends) if e > s]
    computed = (rows.stop - rows.start) * max(e - s for s, e in fed)
    aligned = (rows.stop - rows.start) * (max(e for _, e in fed) - min(s for s, _ in fed))
    assert len(fed) == 4 and 3 * computed < aligned
