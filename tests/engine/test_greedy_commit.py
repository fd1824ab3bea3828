"""`engine.greedy_commit`: the all-greedy verify tail in one Triton program (the interpreter on CPU) against its
torch sequence, bit for bit — the packed table, committed tokens, lengths, budgets, per-row counters and the
engine-wide sums — over random steps with EOS cuts, exhausted budgets, inactive rows, short and absent draft lengths,
γ 0..5. Negative control: an off-by-one acceptance is caught by the same comparison."""

import pytest
import torch

from specdec.engine import greedy_commit as module
from specdec.engine.greedy_commit import greedy_commit, greedy_commit_reference
from specdec.engine.slots import SlotState
from specdec.step import StepCounts

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 7  # a small vocabulary: drafts often equal the target, EOS often appears


def _state(g, rows: int, max_gamma: int) -> SlotState:
    """A random slot state on DEV (drawn on the CPU: one generator, the same state on every device)."""
    cpu = SlotState(rows + 2, 48, torch.device("cpu"), counter_width=StepCounts.width(max_gamma))
    b = slice(0, rows)
    cpu.tokens.copy_(torch.randint(0, VOCAB, cpu.tokens.shape, generator=g))
    cpu.lengths[b] = torch.randint(1, 30, (rows,), generator=g)
    cpu.generated[b] = torch.randint(0, 6, (rows,), generator=g)
    cpu.max_new[b] = cpu.generated[b] + torch.randint(0, 7, (rows,), generator=g)  # some budgets are spent
    cpu.active[b] = torch.rand(rows, generator=g) < 0.8
    cpu.eos[b, 0] = torch.randint(0, VOCAB, (rows,), generator=g)
    cpu.eos[b, 1] = torch.where(torch.rand(rows, generator=g) < 0.3, torch.randint(0, VOCAB, (rows,), generator=g),
                                torch.full((rows,), -1))
    cpu.counters.copy_(torch.randint(0, 9, cpu.counters.shape, generator=g).double())
    state = SlotState(rows + 2, 48, torch.device(DEV), counter_width=StepCounts.width(max_gamma))
    for name in ("tokens", "lengths", "generated", "max_new", "active", "eos", "counters"):
        getattr(state, name).copy_(getattr(cpu, name))
    return state


def _step(seed: int, rows: int, gamma: int, max_gamma: int, with_lengths: bool, commit):
    g = torch.Generator().manual_seed(seed)
    state = _state(g, rows, max_gamma)
    target = torch.randint(0, VOCAB, (rows, gamma + 1), generator=g)
    drafts = torch.where(torch.rand(rows, gamma, generator=g) < 0.7, target[:, :gamma],
                         torch.randint(0, VOCAB, (rows, gamma), generator=g)).to(DEV)
    target = target.to(DEV)
    lengths_d = torch.randint(0, gamma + 1, (rows,), generator=g).to(DEV) if with_lengths else None
    sums = torch.randint(0, 50, (StepCounts.width(max_gamma),), generator=g).double().to(DEV)
    invalid = torch.tensor(seed % 5 == 0, device=DEV)
    b = slice(0, rows)
    table = commit(target, drafts, lengths_d, state, b, state.lengths[b], sums, max_gamma, invalid)
    return table, state, sums


@pytest.mark.parametrize("gamma, max_gamma", [(0, 0), (0, 4), (1, 4), (4, 4), (3, 5)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_kernel_equals_the_torch_sequence(gamma, max_gamma, rows):
    for seed in range(4):
        for with_lengths in ((False, True) if gamma else (False,)):
            want = _step(seed, rows, gamma, max_gamma, with_lengths, greedy_commit_reference)
            got = _step(seed, rows, gamma, max_gamma, with_lengths,
                        lambda *a: greedy_commit(*a, kernel="triton"))
            assert torch.equal(got[0], want[0]), (seed, with_lengths, got[0], want[0])
            for name in ("tokens", "lengths", "generated", "counters", "active", "max_new"):
                assert torch.equal(getattr(got[1], name), getattr(want[1], name)), name
            assert torch.equal(got[2], want[2])


def test_the_comparison_catches_an_off_by_one_acceptance(monkeypatch):
    """Negative control: a reference that accepts one draft too many differs from the kernel."""
    real = module.verify_greedy

    def generous(*args, **kwargs):
        result = real(*args, **kwargs)
        return type(result)(result.num_accepted.clamp(max=args[0].shape[1] - 1) + 1, result.next_token, result.beta)

    monkeypatch.setattr(module, "verify_greedy", generous)
    want = _step(1, 8, 4, 4, True, greedy_commit_reference)
    got = _step(1, 8, 4, 4, True, lambda *a: greedy_commit(*a, kernel="triton"))
    assert not torch.equal(got[0], want[0])


def test_auto_falls_back_to_the_torch_sequence_once_when_the_kernel_cannot_build(monkeypatch, caplog):
    """A build failure under "auto" (checked where no GPU is: the device test is faked) is logged once and the torch
    sequence gives the same table; "triton" (forced) raises instead."""
    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(module, "_kernel", broken)
    monkeypatch.setattr(module, "_FAILED", [])
    monkeypatch.setattr(module, "use_triton", lambda kernel, device, supported, what: supported)
    want = _step(2, 3, 2, 4, True, greedy_commit_reference)
    with caplog.at_level("WARNING", logger=module.__name__):
        got = _step(2, 3, 2, 4, True, lambda *a: greedy_commit(*a, kernel="auto"))
        again = _step(2, 3, 2, 4, True, lambda *a: greedy_commit(*a, kernel="auto"))
    assert torch.equal(got[0], want[0]) and torch.equal(again[0], want[0])
    assert module._FAILED == ["RuntimeError: no compiler"] and caplog.text.count("failed") == 1
    with pytest.raises(RuntimeError, match="no compiler"):
        _step(2, 3, 2, 4, True, lambda *a: greedy_commit(*a, kernel="triton"))
