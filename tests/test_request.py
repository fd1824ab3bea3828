"""`specdec.request`: one `SamplingParams` from the edge to every runner, and the one home of the model checks
(vocabulary size, context length)."""

import pytest
import torch

import specdec
from specdec.decoding import stream_request
from specdec.request import SamplingParams, context_length, vocab_size


def test_sampling_params_validate_and_normalize_every_field():
    params = SamplingParams(temperature=1, top_k=torch.tensor(3).item(), top_p=0.5, leniency=0.5, eos_token_ids=7)
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.eos_token_ids == (7,) and params.leniency == 0.5
    assert params.sampling.top_k == 3 and not params.greedy
    for kwargs, name in (({"leniency": 0.0}, "leniency"), ({"leniency": 1.5}, "leniency"), ({"top_p": 0}, "top_p"),
                         ({"temperature": -1}, "temperature"), ({"max_new_tokens": -1}, "max_new_tokens")):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)


def test_a_request_is_described_once_and_runs_as_described(llama, llama_draft):
    """`stream` is `stream_request` over the SamplingParams it builds: the same tokens."""
    kwargs = dict(max_new_tokens=6, temperature=0.8, top_k=5, eos_token_id=[], seed=3, engine="hf")
    by_keywords = specdec.generate(llama, [[1, 2, 3], [4, 5]], llama_draft, **kwargs).sequences
    params = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=5, seed=3)
    run = stream_request(llama, [[1, 2, 3], [4, 5]], llama_draft, params, 4, engine="hf")
    list(run)
    assert run.result.sequences == by_keywords


def test_what_a_runner_cannot_honour_is_refused(llama, llama_draft):
    with pytest.raises(ValueError, match="logprobs"):
        stream_request(llama, [[1, 2]], llama_draft, SamplingParams(logprobs=True))
    with pytest.raises(ValueError, match="leniency is not supported with draft_tree"):
        specdec.generate(llama, [[1, 2]], llama_draft, leniency=0.5, draft_tree=[2, 1])
    with pytest.raises(ValueError, match="draft_tree"):  # the engine drafts trees with a draft model only
        specdec.generate(llama, [[1, 2]], specdec.PromptLookupDrafter(), draft_tree=[2, 1], engine="fast")


def test_vocab_size_and_context_length_read_every_kind_of_model(llama):
    from specdec.models.hf import HFCausalLM

    v = llama.get_output_embeddings().weight.shape[0]
    assert vocab_size(llama) == v == vocab_size(HFCausalLM(llama))
    assert context_length(llama) == llama.config.max_position_embeddings
    assert context_length(HFCausalLM(llama)) == llama.config.max_position_embeddings
    assert context_length(object()) is None
    with pytest.raises(TypeError, match="vocabulary size"):
        vocab_size(object())


def test_one_check_of_num_draft_tokens():
    from specdec.request import MAX_NUM_DRAFT_TOKENS, check_num_draft_tokens
    from specdec.text.api import check_num_draft_tokens as text_check

    assert check_num_draft_tokens(np_int(3)) == 3 and check_num_draft_tokens(" 5 ") == 5
    from specdec.text.prompts import check_default_gamma

    assert text_check("Auto") == "auto" and text_check(0) == 0
    with pytest.raises(ValueError, match="for one request"):  # (a policy is a model's default γ, not a request's)
        text_check("heuristic")
    assert check_default_gamma("heuristic") == "heuristic"  # (the control: as the default it is taken)
    for bad, kind in ((0, ValueError), (MAX_NUM_DRAFT_TOKENS + 1, ValueError), ("auto", ValueError), (2.5, TypeError)):
        with pytest.raises(kind, match="num_draft_tokens"):
            check_num_draft_tokens(bad)
    with pytest.raises(ValueError, match=r"num_draft_tokens must be an integer in \[0, 64\], or one of auto"):
        text_check("sometimes")


def np_int(value):
    import numpy as np

    return np.int64(value)
