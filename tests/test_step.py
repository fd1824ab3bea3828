"""`specdec.step.StepCounts`: one layout of the acceptance counters, widened and narrowed across γ."""

import pytest
import torch

from specdec.step import StepCounts, step_counters


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
