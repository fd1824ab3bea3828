"""`text.prompts`: a model's generation_config processors are the defaults of its requests, as transformers applies
them; explicit arguments win."""

from types import SimpleNamespace

from specdec.text.prompts import GenerationDefaults, make_params


def _llm(**generation):
    model = SimpleNamespace(generation_config=SimpleNamespace(**generation))
    defaults = GenerationDefaults.from_model(model, [2])
    return SimpleNamespace(defaults=defaults, max_seq_len=128, num_draft_tokens=3)


def test_generation_config_repetition_penalty_and_min_new_tokens_are_defaults():
    llm = _llm(repetition_penalty=1.3, min_new_tokens=5, no_repeat_ngram_size=3)
    params, _, _ = make_params(llm, 4, {"max_new_tokens": 20})
    assert params.repetition_penalty == 1.3 and params.min_tokens == 5 and params.no_repeat_ngram_size == 3
    assert set(params.processors) == {"min_tokens", "repetition_penalty", "no_repeat_ngram_size"}
    params, _, _ = make_params(llm, 4, {"max_new_tokens": 3, "repetition_penalty": 1.0, "min_tokens": 0,
                                        "no_repeat_ngram_size": 0})
    assert params.processors == ()
    params, _, _ = make_params(llm, 4, {"max_new_tokens": 3})
    assert params.min_tokens == 3  # the config's min_new_tokens capped at the request's budget
    assert make_params(_llm(), 4, {})[0].processors == ()
