"""The engine's `Scheduler` on its own, with no model and no slot tensors: admission order and its waiting rule,
slot release (the last running request moves down), preemption order, the rows' draft caps, the drafter's catch-up
plan, and the paged pool's books through it — a leaked block detected, with a negative control."""

import dataclasses

import pytest
import torch

from specdec.engine.drafters import Flavor
from specdec.engine.engine_request import EngineRequest
from specdec.engine.kv_pool import KVPool, PoolAccountingError
from specdec.engine.scheduler import Scheduler
from specdec.engine.step_input import StepInput
from specdec.request import SamplingParams


def make(max_batch=4, admit_min=1, admit_max_wait=0, max_draft_tokens=4, drafter_cached=False, kv_pool=None,
         num_positions=256):
    return Scheduler(max_batch, num_positions, admit_min=admit_min, admit_max_wait=admit_max_wait,
                     max_draft_tokens=max_draft_tokens, drafter_cached=drafter_cached, has_drafter=True,
                     kv_pool=kv_pool)


def queue(scheduler, n, prompt_len=5, **params):
    ids = []
    for i in range(n):
        p = SamplingParams(**{"max_new_tokens": 8, **params})
        prompt = [1 + (i + j) % 50 for j in range(prompt_len)]
        ids.append(scheduler.add(None, lambda rid, p=p, prompt=prompt: EngineRequest(
            rid, prompt, p, 0, float(len(ids)), len(prompt), flavor=Flavor.of(p))))
    return ids


def admit(scheduler, limit=None):
    outputs = []
    admitted = scheduler.select(limit or scheduler.max_batch, outputs, 64)
    scheduler.start(admitted)
    return admitted, outputs


def test_admission_is_first_come_first_served_up_to_the_free_slots():
    s = make(max_batch=3)
    ids = queue(s, 5)
    admitted, outputs = admit(s)
    assert [r.request_id for r in admitted] == ids[:3] and outputs == []
    assert [r.request_id for r in s.running] == ids[:3] and [r.request_id for r in s.waiting] == ids[3:]
    assert admit(s)[0] == []  # no slot free
    assert s.num_admissions == 1


def test_a_request_for_no_tokens_finishes_at_admission_and_its_id_is_free_again():
    s = make()
    (rid,) = queue(s, 1, max_new_tokens=0)
    admitted, outputs = admit(s)
    assert admitted == [] and [(o.request_id, o.finished, o.finish_reason) for o in outputs] == [(rid, True, "length")]
    assert rid not in s.known


def test_a_request_of_another_tree_shape_waits_for_the_running_ones():
    s = make()
    queue(s, 1)
    (tree,) = queue(s, 1, draft_tree=(2, 1))
    admitted, _ = admit(s)
    assert len(admitted) == 1 and [r.request_id for r in s.waiting] == [tree]


def test_while_requests_run_admission_waits_for_admit_min_slots_or_admit_max_wait_steps():
    s = make(max_batch=8, admit_min=4, admit_max_wait=2)
    queue(s, 6)
    admit(s)  # (nothing ran: no wait)
    assert len(s.running) == 6
    queue(s, 1)
    assert s.admission_waits(8)  # 2 free < 4, waited 0 steps
    s.count_step(0, 0)
    assert s.admission_waits(8)
    s.count_step(0, 0)
    assert not s.admission_waits(8)  # free for 2 steps: admit
    assert s.free_since is None


def test_release_moves_the_last_running_request_into_the_freed_slot():
    s = make()
    ids = queue(s, 3)
    admit(s)
    assert s.release(0) == (2, 8)  # (from slot 2, the positions its length needs)
    assert [r.request_id for r in s.running] == [ids[2], ids[1]]
    assert s.release(1) is None  # the last one: nothing moves
    assert [r.request_id for r in s.running] == [ids[2]] and s.flavor is None


def test_preemption_takes_the_latest_arrival_and_requeues_it_first():
    pool = KVPool(16, 4, 4, 64, torch.device("cpu"))
    s = make(kv_pool=pool)
    ids = queue(s, 3)
    admit(s)
    for slot, r in enumerate(s.running):
        s.reserve_admitted(slot, r)
    queue(s, 1)
    victim = s.preemption_victim()
    assert victim.request_id == ids[2]  # the latest to arrive among the running and filling
    s.release(2)
    s.requeue(victim)
    assert s.waiting[0] is victim and (victim.slot, victim.prefilled, victim.draft_valid) == (-1, 0, 0)
    assert pool.num_preemptions == 1


def test_each_row_drafts_at_most_its_cap_auto_rows_at_the_largest_and_idle_slots_none():
    s = make(max_batch=4, max_draft_tokens=6)
    for cap in (None, 2, "auto"):
        queue(s, 1, num_draft_tokens=cap)
    admit(s)
    batch, longest, flavor = s.step_rows(default=3)
    assert (batch, longest) == (4, 5)
    assert s.caps == [3, 2, None] and s.device_caps == (3, 2, 6, 0)
    caps = s.device_caps
    s.step_rows(default=3)
    assert s.device_caps is caps  # unchanged rows: the same record (the runner copies it once)
    s.step_rows(default=1)  # the default γ moved: the rows that take it follow
    assert s.caps == [1, 2, None]
    plain = make()
    plain.has_drafter = False
    assert plain.row_cap(SamplingParams(num_draft_tokens=5), 3) == 0


def test_the_catch_up_plan_feeds_what_plain_steps_left_behind():
    s = make(drafter_cached=True)
    queue(s, 2, prompt_len=10)
    admit(s)
    for r in s.running:
        r.draft_valid = 8
    assert s.plan_catch_up(0, window=4) is None and not s.drafter_synced  # a plain step: the drafter falls behind
    s.running[0].length, s.running[1].length = 20, 11
    plan = s.plan_catch_up(2, window=4)
    assert (plan.rows, plan.starts, plan.ends, plan.tokens) == (slice(0, 1), [8], [16], 8)
    assert [r.draft_valid for r in s.running] == [16, 8] and s.drafter_synced
    assert s.plan_catch_up(2, window=4) is None  # synced: nothing lags


def test_a_block_the_scheduler_leaks_is_detected():
    pool = KVPool(16, 4, 4, 64, torch.device("cpu"))
    s = make(kv_pool=pool)
    queue(s, 2, prompt_len=9)
    admit(s)
    for slot, r in enumerate(s.running):
        s.reserve_admitted(slot, r)
    assert s.short_row() is None
    pool.check()
    s.release(1)  # the negative control: a release that returns its blocks balances the books
    pool.check()
    leaked = pool.blocks[0]
    pool.blocks[0] = []  # a bug that forgets a row's blocks: held by nobody, never freed
    with pytest.raises(PoolAccountingError, match="leaked"):
        pool.check()
    pool.blocks[0] = leaked


def test_the_step_input_is_a_frozen_record():
    step = StepInput(2, 2, 3, 64, Flavor(True), (3, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.gamma = 4
    assert step.tree is None and step.constraints is None
