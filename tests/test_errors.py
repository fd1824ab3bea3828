"""Every bad input named in DESIGN.md raises a clear error naming the problem."""

import pytest
import torch

import specdec


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompts": [[1, 2], []]}, "prompt 1 is empty"),
        ({"prompts": []}, "prompts is empty"),
        ({"prompts": [1, 2, 3]}, "list of token-id lists"),
        ({"prompts": [[1, 200]]}, "outside the vocabulary"),
        ({"prompts": [[1, -1]]}, "outside the vocabulary"),
        ({"prompts": [[1, 2.5]]}, "non-integer"),
        ({"num_draft_tokens": 0}, "num_draft_tokens"),
        ({"num_draft_tokens": -2}, "num_draft_tokens"),
        ({"num_draft_tokens": "nonsense"}, "num_draft_tokens|policy"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -3}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"eos_token_id": "x"}, "eos_token_id"),
    ],
)
def test_bad_arguments(llama, llama_draft, kwargs, match):
    args = {"prompts": [[1, 2, 3]], "drafter": llama_draft, "max_new_tokens": 4}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        specdec.generate(llama, **args)


def test_vocabulary_mismatch(make_llama, llama):
    other = make_llama(4, vocab=80)
    with pytest.raises(ValueError, match="vocabularies differ"):
        specdec.generate(llama, [[1, 2]], drafter=other)
    table = specdec.NGramDrafter(2).fit([[1, 2, 3]], 80)
    with pytest.raises(ValueError, match="vocabularies differ"):
        specdec.generate(llama, [[1, 2]], drafter=table)


def test_prompt_longer_than_context(make_gpt2):
    model = make_gpt2(0, n_positions=16)
    with pytest.raises(ValueError, match="context of 16"):
        specdec.generate(model, [list(range(20))], max_new_tokens=2)
    with pytest.raises(ValueError, match="context of 16"):
        specdec.generate(model, [list(range(10))], max_new_tokens=10)


def test_nan_logits(make_llama):
    model = make_llama(6)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match="NaN"):
            specdec.generate(model, [[1, 2, 3]], temperature=temperature, max_new_tokens=3)


def test_bad_target_and_drafter_types(llama):
    with pytest.raises(TypeError, match="target"):
        specdec.generate("not a model", [[1]])
    with pytest.raises(TypeError, match="drafter"):
        specdec.generate(llama, [[1]], drafter=42)


def test_attention_mask_shape(llama):
    with pytest.raises(ValueError, match="attention_mask"):
        specdec.generate(llama, torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4))


def test_zero_new_tokens_returns_empty(llama):
    assert specdec.generate(llama, [[1, 2], [3]], max_new_tokens=0).sequences == [[], []]


def test_drafts_past_a_learned_position_table_are_not_an_error(make_gpt2):
    # prompt + max_new_tokens fills the context exactly; the last steps draft past it
    model = make_gpt2(0, n_positions=32)
    plain = specdec.generate(model, [list(range(3, 13))], temperature=0, max_new_tokens=22, eos_token_id=[])
    spec = specdec.generate(model, [list(range(3, 13))], drafter=model, temperature=0, max_new_tokens=22,
                            num_draft_tokens=4, eos_token_id=[])
    assert spec.sequences == plain.sequences and len(spec.sequences[0]) == 22
