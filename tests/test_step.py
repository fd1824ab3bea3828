"""`specdec.step`: one layout of the acceptance counters (widened and narrowed across γ), one step record
(pack on the device, unpack on the host) and the statistics fold that consumes it."""

import pytest
import torch

from specdec.metrics import SpecStats
from specdec.step import StepCounts, StepLayout, StepRecord, pack_step, step_counters


def test_widened_counters_sum_across_gammas():
    a = step_counters(torch.tensor([2, 0]), torch.tensor([[0.9, 0.8], [0.1, 0.2]]).double(), None,
                      torch.tensor([True, True]), 2)
    b = step_counters(torch.tensor([1]), torch.tensor([[0.7, 0.3, 0.5]]).double(), torch.tensor([2]),
                      torch.tensor([True]), 3)
    total = StepCounts.widen(a, 2, 4).sum(0) + StepCounts.widen(b, 3, 4).sum(0)
    counts = StepCounts.from_row(total.tolist(), 4).narrow(3)
    assert counts.reached == (3, 2, 0) and counts.accepted == (2, 1, 0)
    assert counts.num_accepted == 3 and counts.num_drafted == 6 and counts.active_rows == 3
    assert counts.beta_sum == pytest.approx(0.9 + 0.8 + 0.1 + 0.7 + 0.3)
    assert total[StepCounts.column("num_drafted", 4)] == 6 and total[StepCounts.positions("accepted", 4)].sum() == 3
    with pytest.raises(ValueError, match="gamma"):
        counts.narrow(1)


def _packed(layout, invalid=False, logprobs=False):
    """Two active rows and one inactive: row 0 accepted 2 of 2 drafts (3 tokens, EOS on the 3rd), row 1
    accepted 0 (1 token, then finished by its budget)."""
    tokens = torch.tensor([[5, 6, 7], [8, 9, 1], [0, 0, 0]])
    n = torch.tensor([2, 0, 1])
    active = torch.tensor([True, True, False])
    committed = torch.tensor([3, 1, 0])
    beta = torch.tensor([[0.9, 0.8], [0.25, 0.5], [0.0, 0.0]]).double()
    counters = step_counters(n, beta, torch.tensor([2, 1, 2]), active, 2) if layout.counters else None
    lp = torch.log(torch.full((3, 3), 0.5)) if logprobs else None
    return pack_step(layout, tokens, committed, n, torch.tensor([2, 1, 2]), torch.tensor([True, True, False]),
                     torch.tensor([True, False, False]), active, torch.tensor(invalid), counters=counters, logprobs=lp)


def test_step_record_reads_back_what_the_step_packed():
    layout = StepLayout(2, counters=True, logprobs=True)
    packed = _packed(layout, logprobs=True)
    assert packed.shape == (4, layout.width) and packed.dtype == torch.long
    record = StepRecord.unpack(packed, layout, drafter_calls=2, draft_time_s=0.5, verify_time_s=0.25)
    assert record.tokens == [[5, 6, 7], [8], []]
    assert record.num_accepted == [2, 0, 0] and record.num_drafted == [2, 1, 0]  # inactive rows count nothing
    assert record.finished == [1, 1, 0] and record.hit_eos == [1, 0, 0]
    assert record.num_committed == 4 and record.num_produced == 4 and record.num_finished == 2
    assert record.logprobs == [[pytest.approx(-0.6931471805599453)] * 3, [pytest.approx(-0.6931471805599453)], []]
    assert record.row_counts[0].reached == (1, 1) and record.row_counts[1].reached == (1, 0)
    assert record.counts.reached == (2, 1) and record.counts.accepted == (1, 1)
    assert record.counts.beta_sum == pytest.approx(0.9 + 0.8 + 0.25) and record.counts.active_rows == 2


def test_step_record_refuses_a_table_of_another_layout_and_invalid_logits():
    layout = StepLayout(2)
    with pytest.raises(ValueError, match=r"int64 \[B \+ 1, 8\]"):
        StepRecord.unpack(_packed(StepLayout(2, counters=True)), layout)
    with pytest.raises(ValueError, match="do not match"):
        _packed(layout, logprobs=True)
    with pytest.raises(ValueError, match="target logits contain NaN"):
        StepRecord.unpack(_packed(layout, invalid=True), layout)


def test_the_fold_adds_records_and_merges_runs():
    layout = StepLayout(2, counters=True)
    record = StepRecord.unpack(_packed(layout), layout, drafter_calls=2, draft_time_s=0.5, verify_time_s=0.25)
    stats = SpecStats()
    stats.add_step(record)
    stats.add_prefill(0.125, 1)
    assert stats.num_steps == 1 and stats.target_calls == 2 and stats.drafter_calls == 2
    assert stats.num_generated_tokens == 4 and stats.max_num_draft_tokens == 2
    assert stats.row_steps == 2 and stats.algorithm_tokens == 4 and stats.accepted_tokens == 2
    assert stats.alpha == pytest.approx((0.9 + 0.8 + 0.25) / 3)
    trees = SpecStats()
    trees.add_counts(StepCounts.total(list(record.row_counts), 2, has_beta=False))
    assert trees.alpha is None and trees.reached_by_position == [2, 1]
    other = SpecStats(op_cost_ratio=0.5)
    other.add_steps(3, num_generated_tokens=5, max_gamma=4, draft_time_s=1.0)
    pooled = SpecStats.pooled([stats, other])
    assert pooled.num_steps == 4 and pooled.num_generated_tokens == 9 and pooled.max_num_draft_tokens == 4
    assert pooled.op_cost_ratio is None  # the runs disagree on ĉ
    assert pooled.reached_by_position == [2, 1] and pooled.draft_time_s == 1.5
    assert stats.num_steps == 1  # pooling copies
    assert SpecStats.pooled([]) == SpecStats()


def test_a_step_without_finished_rows_reads_no_finish_columns():
    layout = StepLayout(1)
    tokens, n = torch.tensor([[4, 5], [6, 7]]), torch.tensor([1, 0])
    no = torch.zeros(2, dtype=torch.bool)
    packed = pack_step(layout, tokens, n + 1, n, None, no, no, ~no, torch.tensor(False))
    record = StepRecord.unpack(packed, layout)
    assert record.tokens == [[4, 5], [6]] and record.finished == [0, 0] and record.num_finished == 0
    assert layout.width == 7 and StepLayout(1, counters=True, logprobs=True).width == 7 + 7 + 2
