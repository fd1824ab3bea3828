"""vLLM's call shapes on `LLM`: generate(prompts, SamplingParams | list), max_tokens, n, chat(messages)."""

import pytest

import specdec
from specdec import SamplingParams
from specdec.text.shapes import request_params, shape_outputs

TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"


@pytest.fixture(scope="module")
def llm(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=3, chat_template=TEMPLATE) as model:
        yield model


def test_sampling_params_for_every_prompt_is_the_keywords(llm):
    sp = SamplingParams(temperature=0.9, top_k=20, max_new_tokens=6, seed=11)
    by_object = llm.generate(["w1 w2", "w3"], sp)
    by_keywords = llm.generate(["w1 w2", "w3"], temperature=0.9, top_k=20, max_new_tokens=6, seed=11)
    assert [c.token_ids for c in by_object] == [c.token_ids for c in by_keywords]
    # negative control: another seed in the object draws another text
    other = llm.generate(["w1 w2", "w3"], SamplingParams(temperature=0.9, top_k=20, max_new_tokens=6, seed=12))
    assert [c.token_ids for c in other] != [c.token_ids for c in by_object]


def test_one_sampling_params_per_prompt(llm):
    greedy, sampled = SamplingParams(temperature=0, max_new_tokens=5), SamplingParams(temperature=1.0, max_new_tokens=3,
                                                                                      seed=2)
    outs = llm.generate(["w1 w2", "w3"], [greedy, sampled])
    assert outs[0].token_ids == llm.generate("w1 w2", temperature=0, max_new_tokens=5).token_ids
    assert outs[1].token_ids == llm.generate("w3", temperature=1.0, max_new_tokens=3, seed=2).token_ids
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [greedy, sampled])


def test_max_tokens_is_max_new_tokens(llm):
    assert llm.generate("w1", max_tokens=4, temperature=0).token_ids == llm.generate(
        "w1", max_new_tokens=4, temperature=0).token_ids
    assert len(llm.generate("w1", max_tokens=4, temperature=0).token_ids) <= 4
    with pytest.raises(TypeError, match="not both"):
        llm.generate("w1", max_tokens=4, max_new_tokens=4)


def test_n_independent_completions_seeded_seed_plus_i(llm):
    outs = llm.generate("w1 w2", n=3, temperature=1.0, max_tokens=6, seed=5)
    assert len(outs) == 3
    for i, out in enumerate(outs):
        assert out.token_ids == llm.generate("w1 w2", temperature=1.0, max_tokens=6, seed=5 + i).token_ids
    several = llm.generate(["w1", "w2"], n=2, temperature=0, max_tokens=3)
    assert [len(group) for group in several] == [2, 2]
    assert several[0][0].token_ids == several[0][1].token_ids  # greedy: the same text twice
    for bad in (0, 1.5, True, 10_000):
        with pytest.raises(ValueError, match="n must be"):
            llm.generate("w1", n=bad)
    with pytest.raises(ValueError, match="a stream is one completion"):
        llm.stream("w1", n=2)


def test_stream_takes_sampling_params(llm):
    sp = SamplingParams(temperature=0, max_new_tokens=5)
    stream = llm.stream("w1 w2", sp)
    text = "".join(stream)
    assert text == llm.generate("w1 w2", sp).text == stream.completion.text


def test_keywords_beside_sampling_params(llm):
    sp = SamplingParams(temperature=0, max_new_tokens=8)
    assert llm.generate("w1", sp, num_draft_tokens=0).token_ids == llm.generate("w1", sp).token_ids
    with pytest.raises(TypeError, match="temperature: give it in the SamplingParams or as a keyword"):
        llm.generate("w1", sp, temperature=0.5)
    with pytest.raises(TypeError, match="must be a specdec.SamplingParams"):
        llm.generate("w1", {"temperature": 0})
    with pytest.raises(ValueError, match="eos_token_ids"):
        llm.generate("w1", SamplingParams(eos_token_ids=(3,)))


def test_chat(llm):
    messages = [{"role": "user", "content": "w1 w2"}]
    assert llm.chat(messages, max_tokens=5, temperature=0).token_ids == llm.generate(
        messages, max_new_tokens=5, temperature=0).token_ids
    both = llm.chat([messages, [{"role": "user", "content": "w3"}]], SamplingParams(temperature=0, max_new_tokens=3))
    assert len(both) == 2
    for bad in ("w1", [], [["w1"]], [{"role": "user"}, "x"]):
        with pytest.raises(TypeError, match="conversation"):
            llm.chat(bad)


def test_request_params_and_shape_outputs_alone():
    batch, keywords, n = request_params([[1], [2]], None, {"n": 2, "seed": 7, "max_tokens": 3})
    assert batch == [[1], [1], [2], [2]] and n == 2
    assert [k["seed"] for k in keywords] == [7, 8, 7, 8] and all(k["max_new_tokens"] == 3 for k in keywords)
    assert [k.get("seed") for k in request_params([[1]], None, {"n": 2})[1]] == [None, None]
    assert shape_outputs(["a", "b", "c", "d"], False, 2) == [["a", "b"], ["c", "d"]]
    assert shape_outputs(["a"], True, 1) == "a"


def test_every_sampling_params_field_is_mapped():
    """A field added to SamplingParams must be mapped here (or refused when set), never silently dropped."""
    from dataclasses import fields

    from specdec.text.shapes import _FIELDS

    assert {f.name for f in fields(SamplingParams)} - set(_FIELDS) <= {"eos_token_ids"}
