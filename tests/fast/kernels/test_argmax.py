"""`kernels.argmax.greedy_tokens` against torch.argmax and `core.invalid_scores`: ties (the first index wins),
NaN (the first NaN wins), ±inf, rows of only -inf, chunk boundaries, strided rows; Triton's interpreter on CPU,
fp32 / bf16 on CUDA. Negative control: a kernel that keeps the LAST maximum fails the tie test."""

import pytest
import torch

from specdec.core import invalid_scores
from specdec.fast.kernels import argmax as argmax_module
from specdec.fast.kernels.argmax import argmax, greedy_tokens, greedy_tokens_reference

pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NAN, INF = float("nan"), float("inf")


def _cases(vocab: int) -> torch.Tensor:
    """Rows with known answers; vocab spans several stage-1 chunks when > argmax.BLOCK."""
    g = torch.Generator().manual_seed(vocab)
    rows = torch.randn(10, vocab, generator=g)
    rows[0, :] = 0.0  # all tied: index 0
    rows[1, [5, vocab - 1]] = 9.0  # a tie across chunks: the first
    rows[2, vocab // 2] = NAN
    rows[2, vocab - 1] = NAN  # two NaNs: the first
    rows[2, 3] = INF
    rows[3, :] = -INF  # a row of only -inf: index 0, invalid
    rows[4, vocab - 1] = INF  # +inf last
    rows[5, :] = -INF
    rows[5, vocab - 2] = -1e30  # one finite value among -inf
    rows[6, 7] = -0.0
    rows[6, :7] = -1.0
    rows[6, 8:] = -1.0
    rows[6, 9] = 0.0  # -0.0 and 0.0 tie: the first (7)
    rows[7, -1] = rows[7].max() + 1  # the maximum in the last, partial chunk
    return rows


def _check(rows: torch.Tensor, invalid: bool) -> None:
    tokens, bad = greedy_tokens(rows, kernel="triton")
    assert torch.equal(tokens.cpu(), rows.cpu().argmax(-1))
    assert bool(bad) == invalid == bool(invalid_scores(rows))
    ref_tokens, ref_bad = greedy_tokens_reference(rows)
    assert torch.equal(ref_tokens, tokens) and bool(ref_bad) == bool(bad)
    assert torch.equal(argmax(rows, kernel="triton"), tokens)  # the tokens alone (a greedy drafter's draw)
    assert greedy_tokens(rows, kernel="triton", check=False)[1] is None


@pytest.mark.parametrize("vocab", [1, 7, 4096, 4097, 3 * 4096 + 5])
def test_matches_torch_argmax_and_invalid_scores(vocab):
    rows = _cases(vocab).to(DEV) if vocab >= 10 else torch.randn(3, vocab).to(DEV)
    if vocab >= 10:
        _check(rows, invalid=True)  # rows 2, 3, 4 are invalid
        _check(rows[[0, 1, 5, 6, 7, 8]], invalid=False)
        for r in range(len(rows)):  # each row alone (batch 1, as decode runs it)
            one = rows[r : r + 1]
            _check(one, invalid=bool(invalid_scores(one)))
    else:
        _check(rows, invalid=False)


def test_shapes_strides_and_dtypes():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5000, generator=g).to(DEV)
    logits[1, 2, [10, 4999]] = 50.0
    tokens, bad = greedy_tokens(logits, kernel="triton")
    assert tokens.shape == (2, 3) and torch.equal(tokens, logits.argmax(-1)) and not bool(bad)
    last = logits[:, -1]  # a strided view: rows 3·V apart
    assert torch.equal(greedy_tokens(last, kernel="triton")[0], last.argmax(-1))
    if DEV == "cuda":
        half = logits.bfloat16()
        assert torch.equal(greedy_tokens(half, kernel="triton")[0], half.argmax(-1))
    assert torch.equal(greedy_tokens(logits.cpu(), kernel="reference")[0], logits.cpu().argmax(-1))
    with pytest.raises(ValueError, match="logits must be a tensor"):
        greedy_tokens(torch.zeros(2, 0))


def test_negative_control_last_maximum_fails(monkeypatch):
    """A kernel keeping the last maximum in each chunk fails the tie case: the tie test has power."""
    rows = _cases(4097).to(DEV)[:2]
    flipped = rows.flip(-1)

    def last_max(logits, kernel="auto"):  # first maximum of the flipped row = last maximum of the row
        tokens, bad = greedy_tokens(logits.flip(-1).contiguous(), kernel="triton")
        return logits.shape[-1] - 1 - tokens, bad

    monkeypatch.setattr(argmax_module, "greedy_tokens", last_max)
    tokens, _ = argmax_module.greedy_tokens(rows)
    assert not torch.equal(tokens.cpu(), rows.cpu().argmax(-1))
    assert torch.equal(flipped.argmax(-1).cpu(), (rows.shape[-1] - 1 - tokens).cpu())
