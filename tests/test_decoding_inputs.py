"""`specdec.generate`'s transformers-shaped inputs: the generation_config's sampling defaults, `**tokenizer(...)`
(input_ids + attention_mask), `streamer=` and `stop_strings=` — each against the call it stands for."""

from __future__ import annotations

import copy

import pytest
import torch

import specdec
from specdec.decoding import sampling_defaults

PROMPT = [1, 5, 9, 3]


class Recorder:
    """A transformers-style streamer: put(ids) / end()."""

    def __init__(self):
        self.puts: list[list] = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


class SpellIds:
    """A tokenizer stand-in: token i is spelled "<i>"."""

    def decode(self, ids):
        return "".join(f"<{int(i)}>" for i in ids)


def test_defaults_are_the_generation_config_greedy_unless_do_sample(llama, llama_draft):
    assert sampling_defaults(llama) == {"temperature": 0.0}
    default = specdec.generate(llama, [PROMPT], llama_draft, max_new_tokens=12, eos_token_id=[])
    greedy = specdec.generate(llama, [PROMPT], llama_draft, max_new_tokens=12, temperature=0, eos_token_id=[])
    assert default.sequences == greedy.sequences
    # unseeded runs of the default agree too (nothing is drawn): the default is not temperature 1
    assert specdec.generate(llama, [PROMPT] * 4, max_new_tokens=12, eos_token_id=[]).sequences == [
        greedy.sequences[0]] * 4


def test_do_sample_in_the_generation_config_samples_at_its_temperature(llama):
    model = copy.deepcopy(llama)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.7
    model.generation_config.top_k = 5
    assert sampling_defaults(model) == {"temperature": 0.7, "top_k": 5, "top_p": 1.0, "min_p": 0.0}
    rows = [PROMPT] * 8
    default = specdec.generate(model, rows, max_new_tokens=10, seed=4, eos_token_id=[]).sequences
    explicit = specdec.generate(model, rows, max_new_tokens=10, seed=4, eos_token_id=[], temperature=0.7,
                                top_k=5).sequences
    assert default == explicit
    # negative controls: the config's filter matters (top_k 1 is another law), and the default is not greedy
    assert specdec.generate(model, rows, max_new_tokens=10, seed=4, eos_token_id=[], temperature=0.7,
                            top_k=1).sequences != default
    assert len({tuple(s) for s in default}) > 1
    # an explicit argument wins over the config
    assert specdec.generate(model, rows, max_new_tokens=10, temperature=0, eos_token_id=[]).sequences == \
        specdec.generate(llama, rows, max_new_tokens=10, temperature=0, eos_token_id=[]).sequences


def test_tokenizer_output_unpacks_into_generate(llama, llama_draft):
    ref = specdec.generate(llama, [PROMPT, PROMPT[:2]], llama_draft, max_new_tokens=8, temperature=0, eos_token_id=[])
    # what tokenizer([...], padding=True, return_tensors="pt") returns (left padding, as for generation)
    encoding = {"input_ids": torch.tensor([PROMPT, [0, 0] + PROMPT[:2]]),
                "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])}
    out = specdec.generate(llama, **encoding, drafter=llama_draft, max_new_tokens=8, temperature=0, eos_token_id=[])
    assert out.sequences == ref.sequences
    lists = {"input_ids": [PROMPT], "attention_mask": [[1, 1, 1, 1]]}  # without return_tensors
    assert specdec.generate(llama, **lists, max_new_tokens=8, temperature=0, eos_token_id=[]).sequences == \
        specdec.generate(llama, [PROMPT], max_new_tokens=8, temperature=0, eos_token_id=[]).sequences
    stream = specdec.stream(llama, input_ids=[PROMPT], max_new_tokens=3, temperature=0, eos_token_id=[])
    assert sum(len(t) for e in stream for t in e.tokens) == 3


def test_prompts_given_twice_or_not_at_all(llama):
    with pytest.raises(TypeError, match="once"):
        specdec.generate(llama, [PROMPT], input_ids=[PROMPT])
    with pytest.raises(TypeError, match="needs the prompts"):
        specdec.generate(llama)
    with pytest.raises(ValueError, match="input_ids"):
        specdec.generate(llama, input_ids=[PROMPT, [1]], attention_mask=[[1, 1, 1, 1], [1]])


def test_streamer_gets_the_prompt_then_every_token(llama, llama_draft):
    streamer = Recorder()
    out = specdec.generate(llama, [PROMPT], llama_draft, max_new_tokens=10, temperature=0, eos_token_id=[],
                           streamer=streamer)
    assert streamer.puts[0] == [PROMPT] and streamer.ended == 1
    assert [t for put in streamer.puts[1:] for t in put] == out.sequences[0]
    padded = Recorder()
    specdec.generate(llama, input_ids=torch.tensor([[0] + PROMPT]), attention_mask=torch.tensor([[0, 1, 1, 1, 1]]),
                     max_new_tokens=2, temperature=0, streamer=padded)
    assert padded.puts[0] == [PROMPT]  # the padding is not the prompt


def test_streamer_refusals(llama):
    with pytest.raises(ValueError, match="one prompt"):
        specdec.generate(llama, [PROMPT, PROMPT], streamer=Recorder())
    with pytest.raises(TypeError, match="put"):
        specdec.generate(llama, [PROMPT], streamer=object())


def test_stop_strings_cut_after_the_first_stop(llama, llama_draft):
    full = specdec.generate(llama, [PROMPT, PROMPT[:3]], llama_draft, max_new_tokens=16, temperature=0,
                            eos_token_id=[]).sequences
    stop = f"<{full[0][4]}>"  # row 0's fifth token (it may also occur earlier: the cut is at its first)
    first = next(i for i, t in enumerate(full[0]) if f"<{t}>" == stop)
    streamer_rows = Recorder()
    out = specdec.generate(llama, [PROMPT, PROMPT[:3]], llama_draft, max_new_tokens=16, temperature=0,
                           eos_token_id=[], stop_strings=[stop], tokenizer=SpellIds())
    assert out.sequences[0] == full[0][:first + 1]
    second = next((i for i, t in enumerate(full[1]) if f"<{t}>" == stop), None)
    assert out.sequences[1] == (full[1] if second is None else full[1][:second + 1])
    # negative control: a stop string that never occurs cuts nothing
    assert specdec.generate(llama, [PROMPT], llama_draft, max_new_tokens=16, temperature=0, eos_token_id=[],
                            stop_strings="<no such token>", tokenizer=SpellIds()).sequences[0] == full[0]
    # the streamer shows nothing past the stop
    specdec.generate(llama, [PROMPT], llama_draft, max_new_tokens=16, temperature=0, eos_token_id=[],
                     stop_strings=stop, tokenizer=SpellIds(), streamer=streamer_rows)
    assert [t for put in streamer_rows.puts[1:] for t in put] == full[0][:first + 1]


def test_stop_strings_refusals(llama):
    with pytest.raises(ValueError, match="tokenizer="):
        specdec.generate(llama, [PROMPT], stop_strings=["x"])
    with pytest.raises(TypeError, match="stop_strings"):
        specdec.generate(llama, [PROMPT], stop_strings=[""], tokenizer=SpellIds())


def test_a_model_stays_copyable_after_generate_cached_engines_on_it(make_llama):
    """`specdec.generate` keeps its engines on the model; a deepcopy or pickle of the model afterwards must not try to
    copy them (they hold locks): the copy gets an empty cache and generates the same tokens."""
    import pickle

    model = make_llama(7)
    want = specdec.generate(model, [PROMPT], max_new_tokens=6, temperature=0, eos_token_id=[], engine="fast")
    assert "_specdec_engines" in vars(model)  # (what the check is about: a cached engine)
    clone = copy.deepcopy(model)
    assert len(vars(clone)["_specdec_engines"]) == 0
    pickle.dumps(model)
    again = specdec.generate(clone, [PROMPT], max_new_tokens=6, temperature=0, eos_token_id=[], engine="fast")
    assert again.sequences == want.sequences
