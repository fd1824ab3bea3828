"""Fixtures shared by the engine's tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def peaked_pair(make_llama):
    """A tiny target and a 1-layer draft with peaked laws (LM heads × 8), so drafts are accepted and steps commit
    several tokens."""
    target, draft = make_llama(0), make_llama(1, layers=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    return target, draft
