"""`base.LoopDraws`, the loop's side of the one proposal call `draft_chain`: a row stops after its first unsure draft
the same way whether the chain ends on the host (the eager loop) or runs all γ (inside a captured graph)."""

import torch

from specdec.core import SamplingConfig
from specdec.drafters.base import LoopDraws

SURE, UNSURE = torch.tensor([9.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])  # greedy q(x): ≈1 / ≈0.42


def _chain(draws, rows_by_step, gamma=4, passes=4):
    """Greedy drafts whose logits at step i are `rows_by_step[i]` (one of SURE / UNSURE per row)."""
    return draws.draft_chain(gamma, lambda i, prev: torch.stack(rows_by_step[min(i, len(rows_by_step) - 1)]), passes)


def test_rows_stop_after_their_first_unsure_draft_on_the_host_and_in_a_graph():
    greedy = SamplingConfig(temperature=0)
    steps = [[SURE, SURE, UNSURE], [SURE, UNSURE, SURE], [SURE, SURE, SURE]]  # row 0 sure throughout
    host = _chain(LoopDraws(greedy, None, confidence_threshold=0.9), steps)
    graph = _chain(LoopDraws(greedy, None, confidence_threshold=0.9, host_stop=False), steps)
    assert host.lengths.tolist() == graph.lengths.tolist() == [4, 2, 1]
    assert torch.equal(host.tokens, graph.tokens) and host.forward_passes == graph.forward_passes == 4
    # every row unsure at step 1: the host ends the chain there (two model calls), the graph drafts on
    steps = [[SURE, SURE, UNSURE], [UNSURE, UNSURE, UNSURE]]
    host = _chain(LoopDraws(greedy, None, confidence_threshold=0.9), steps)
    graph = _chain(LoopDraws(greedy, None, confidence_threshold=0.9, host_stop=False), steps)
    assert host.tokens.shape == (3, 2) and host.forward_passes == 2 and graph.tokens.shape == (3, 4)
    assert host.lengths.tolist() == graph.lengths.tolist() == [2, 2, 1]
    # negative control: without a threshold nothing stops (no lengths), so the check above can fail
    assert _chain(LoopDraws(greedy, None), steps).lengths is None


def test_sampled_draws_are_the_generators_and_the_noise_decides_in_a_graph():
    sampling = SamplingConfig(temperature=1.0)
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    a = LoopDraws(sampling, torch.Generator().manual_seed(1)).draft_chain(3, lambda i, prev: logits, 3)
    b = LoopDraws(sampling, torch.Generator().manual_seed(1)).draft_chain(3, lambda i, prev: logits, 3)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.probs.sum(-1), torch.ones(3, 3))
    noise = torch.empty(3, 3, 6).exponential_(generator=torch.Generator().manual_seed(2))
    c = LoopDraws(sampling, None, noise=noise, host_stop=False).draft_chain(3, lambda i, prev: logits, 3)
    assert torch.equal(c.tokens, (c.probs / noise).argmax(-1))  # the exponential race on the given noise
