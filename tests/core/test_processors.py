"""`core.processors`: the processors as transformers / OpenAI define them, and the draft-vectorized form.

The vectorized block (positions 1..γ+1 in one pass) equals the processors applied one position at a time with
the history advanced along the draft; each processor equals transformers' own where one exists
(`RepetitionPenaltyLogitsProcessor`, `SequenceBiasLogitsProcessor`, `MinNewTokensLengthLogitsProcessor`) and
OpenAI's formula for frequency / presence penalties.
"""

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from specdec.core.processors import ProcessorRows, advance, constraint_masks, history_of, process_draft
from specdec.request import SamplingParams

V = 11


def _case(seed=0, batch=4, gamma=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, gamma + 1, V, generator=g) * 3
    draft = torch.randint(0, 4, (batch, gamma), generator=g)  # few distinct ids: repeated drafts
    rows = ProcessorRows(torch.tensor([1.3, 1.0, 0.7, 2.0]), torch.tensor([0.5, 0.0, -0.3, 1.0]),
                         torch.tensor([0.2, 1.0, 0.0, -0.5]), torch.tensor([0, 3, 7, 2]),
                         torch.tensor([[1, -1], [2, 3], [-1, -1], [0, 9]]), torch.randn(batch, V, generator=g))
    history = history_of([[1, 2], [3], [0, 0, 6], [5, 10]], V, "cpu")
    history = advance(history, torch.randint(0, V, (batch, 3), generator=g), torch.tensor([0, 2, 3, 1]))
    return logits, draft, rows, history


def test_the_draft_block_equals_one_position_at_a_time():
    logits, draft, rows, history = _case()
    block = process_draft(logits, draft, rows, history)
    for i in range(draft.shape[1] + 1):
        one = process_draft(logits[:, i:i + 1], draft[:, :0], rows, advance(history, draft[:, :i]))
        assert torch.equal(one[:, 0], block[:, i]), i


def test_a_frozen_history_is_wrong():
    """The negative control of the test above: not advancing along the draft changes drafted columns."""
    logits, draft, rows, history = _case()
    frozen = process_draft(logits[:, -1:], draft[:, :0], rows, history)[:, 0]
    assert not torch.equal(frozen, process_draft(logits, draft, rows, history)[:, -1])


def _reference(logits, ids, prompt_len, rep, freq, pres, bias, min_new, stops):
    """transformers' processors (bias, repetition, min new tokens) then OpenAI's penalties, one position."""
    ids = torch.tensor([ids])
    out = logits[None].clone()
    if bias:
        out = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})(ids, out)
    if rep != 1.0:
        out = RepetitionPenaltyLogitsProcessor(rep)(ids, out)
    if min_new and stops:
        out = MinNewTokensLengthLogitsProcessor(prompt_len, min_new, stops)(ids, out)
    counts = torch.bincount(ids[0, prompt_len:], minlength=V).float()
    return (out[0] - freq * counts - pres * (counts > 0).float())


@pytest.mark.parametrize("seed", range(4))
def test_each_processor_is_transformers_and_openai_formula(seed):
    g = torch.Generator().manual_seed(seed + 10)
    prompt = torch.randint(0, V, (4,), generator=g).tolist()
    output = torch.randint(0, V, (3,), generator=g).tolist()
    draft = torch.randint(0, V, (4,), generator=g)
    logits = torch.randn(5, V, generator=g) * 4
    logits[0, 3] = 0.0
    params = dict(rep=1.4, freq=0.6, pres=-0.4, bias={2: 3.0, 7: -5.0}, min_new=6, stops=[4, 9])
    rows = ProcessorRows.uniform(1, V, "cpu", repetition=1.4, frequency=0.6, presence=-0.4, min_tokens=6,
                                 stop_ids=[4, 9], logit_bias=[(2, 3.0), (7, -5.0)])
    history = advance(history_of([prompt], V, "cpu"), torch.tensor([output]))
    block = process_draft(logits[None], draft[None], rows, history)[0]
    for i in range(5):
        ids = prompt + output + draft[:i].tolist()
        ref = _reference(logits[i], ids, len(prompt), **params)
        torch.testing.assert_close(block[i], ref, rtol=0, atol=1e-6)


def test_constraint_masks_read_the_draft_and_fill_the_rest():
    class EvenOnly:
        def allowed(self, draft):
            mask = torch.zeros(len(draft) + 1, V - 2, dtype=torch.bool)
            mask[:, ::2] = True
            return mask

        def commit(self, tokens):
            pass

    masks = constraint_masks([EvenOnly(), None], torch.tensor([[2, 4], [1, 1]]), V, "cpu")
    assert masks.shape == (2, 3, V)
    assert masks[0, :, ::2][:, :-1].all() and not masks[0, :, 1::2].any() and not masks[0, :, V - 1].any()
    assert masks[1].all()
    class TooShort(EvenOnly):
        def allowed(self, draft):
            return super().allowed(draft)[:-1]

    with pytest.raises(ValueError, match="allowed returned"):
        constraint_masks([TooShort()], torch.tensor([[2, 4]]), V, "cpu")


@pytest.mark.parametrize("field, bad", [("repetition_penalty", 0.0), ("repetition_penalty", float("inf")),
                                        ("frequency_penalty", 2.5), ("presence_penalty", float("nan")),
                                        ("logit_bias", {1: 101.0}), ("logit_bias", {-1: 1.0}),
                                        ("logit_bias", {"x": 1.0}), ("min_tokens", -1), ("min_tokens", 1 << 21),
                                        ("top_logprobs", 21), ("constraint", object())])
def test_fields_are_checked_naming_them(field, bad):
    with pytest.raises((ValueError, TypeError), match=field.split("_")[0] if field != "logit_bias" else "logit_bias"):
        SamplingParams(**{field: bad})


def test_fields_normalize():
    params = SamplingParams(logit_bias={"5": 1, 2: -3.5}, repetition_penalty=2, min_tokens=3, eos_token_ids=[1])
    assert params.logit_bias == ((2, -3.5), (5, 1.0))
    assert params.processors == ("logit_bias", "min_tokens", "repetition_penalty")
    assert SamplingParams().processors == ()
    assert SamplingParams(min_tokens=3).processors == ()  # no EOS ids: nothing to mask
    with pytest.raises(ValueError, match="logit_bias token id 99"):
        SamplingParams(logit_bias={99: 1.0}).check_vocabulary(64)


def test_allowed_token_ids_leave_only_those_tokens():
    logits = torch.randn(2, 3, V)
    rows = ProcessorRows.uniform(2, V, "cpu", repetition=1.3, frequency=-0.5, allowed=[1, 4, 9])
    out = process_draft(logits, torch.tensor([[4, 2], [0, 0]]), rows, history_of([[1], [2]], V, "cpu"))
    assert torch.isfinite(out[..., [1, 4, 9]]).all() and (out[..., [0, 2, 3, 5, 6, 7, 8, 10]] == float("-inf")).all()
    with pytest.raises(ValueError, match="only EOS ids"):
        SamplingParams(allowed_token_ids=[2], eos_token_ids=[2], min_tokens=1)
    with pytest.raises(ValueError, match="allowed_token_ids: 64"):
        SamplingParams(allowed_token_ids=[1, 64]).check_vocabulary(64)
