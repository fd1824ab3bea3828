"""Weights held once (`fast.held_once.adopt_hf`): the FastLlama the engine builds reads the transformers model's own
storage — no two live tensors for one weight — and both models still compute what they did; the copying
`FastLlama.from_hf` is the negative control (it holds every weight twice, and the byte count sees it)."""

import copy

import pytest
import torch

from helpers import right_padded
from specdec.engine import Engine, EngineConfig
from specdec.fast import FastLlama
from specdec.fast.held_once import adopt_hf, duplicate_bytes, held_bytes
from specdec.fast.weights import stack_rows
from specdec.request import SamplingParams

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5]]


def _fresh(make, *args, **kw):
    """A private model (adoption re-points its parameters: the session fixtures stay untouched)."""
    torch.manual_seed(0)
    model = make(*args, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # (transformers starts norms at exact 1 and biases at 0)
    return model.eval()


def _logits(fast: FastLlama) -> torch.Tensor:
    tokens, valid = right_padded(PROMPTS)
    with torch.inference_mode():
        return fast(tokens, fast.new_cache(len(PROMPTS), 32), valid)


def _hf_logits(model) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(torch.tensor([p])).logits[0] for p in PROMPTS]


def _weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("kind", ["llama-tied", "llama", "qwen2", "gpt2"])
def test_adopted_weights_lie_in_the_models_storage(kind, make_llama, make_gpt2):
    from conftest import _qwen2

    model = {"llama-tied": lambda: _fresh(make_llama, 3, tie_word_embeddings=True),
             "llama": lambda: _fresh(make_llama, 3), "qwen2": lambda: _fresh(lambda: _qwen2(3)),
             "gpt2": lambda: _fresh(make_gpt2, 3)}[kind]()
    before_hf = _hf_logits(model)
    copied = FastLlama.from_hf(model)
    weights = held_bytes(model)
    assert duplicate_bytes(model, copied) >= _weight_bytes(model)  # negative control: the copy holds them twice
    fast = adopt_hf(model)
    # every FastLlama tensor lies in the model's storage; GPT-2's Conv1D matrices ([in, out]) are held transposed
    conv1d = sum(m.weight.numel() * 4 for m in model.modules() if type(m).__name__ == "Conv1D")
    assert duplicate_bytes(model, fast) == (conv1d if kind == "gpt2" else 0)
    assert held_bytes(model) == weights  # and the model holds no more than before (the stacks replaced its tensors)
    torch.testing.assert_close(_logits(fast), _logits(copied), atol=0, rtol=0)  # the same weights, bit for bit
    for ours, ref in zip(_hf_logits(model), before_hf):  # the model still computes what it did
        torch.testing.assert_close(ours, ref, atol=0, rtol=0)


def test_adopting_again_reuses_the_same_parameters(make_llama):
    """A second FastLlama of one model (the text API builds an engine per γ) holds the same Parameter objects, so
    what is keyed by the weight (the CPU GEMMs' packed copies) is made once."""
    model = _fresh(make_llama, 3)
    first, second = adopt_hf(model), adopt_hf(model)
    assert first is not second
    assert all(a is b for a, b in zip(first.parameters(), second.parameters()))
    assert held_bytes(model, first, second) == held_bytes(model)


def test_engines_built_from_one_model_hold_its_weights_once(make_llama):
    model = _fresh(make_llama, 3)
    draft = _fresh(make_llama, 4, layers=1)
    weights = held_bytes(model, draft)
    plain = Engine(model, None, config=EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0))
    spec = Engine(model, draft, config=EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2))
    assert held_bytes(model, draft, plain.model, spec.model, spec.drafter.model) == weights
    assert _greedy(plain, [5, 6, 7]) == _greedy(spec, [5, 6, 7]) == _greedy_hf(model, [5, 6, 7])


def test_the_model_still_trains_after_an_engine_adopts_it(make_llama):
    """The engine builds under inference mode; the parameters it re-points stay ordinary tensors (an inference
    tensor can never be saved for a backward pass: a later fine-tune or gradient check of the model would fail)."""
    model = _fresh(make_llama, 5)
    Engine(model, None, config=EngineConfig(max_batch_size=1, max_seq_len=32, num_draft_tokens=0))
    assert not any(p.is_inference() for p in model.parameters())
    loss = model(torch.tensor([[5, 6, 7]])).logits.square().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def _greedy(engine: Engine, prompt: list[int], new: int = 8) -> list[int]:
    engine.add_request(prompt, SamplingParams(max_new_tokens=new, temperature=0.0, eos_token_ids=()))
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def _greedy_hf(model, prompt: list[int], new: int = 8) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, min_new_tokens=new)
    return out[0, len(prompt):].tolist()


def test_stack_rows_is_a_view_only_for_parts_end_to_end():
    base = torch.arange(24.0).view(6, 4)
    assert stack_rows([base[:2], base[2:6]]).data_ptr() == base.data_ptr()  # end to end: a view
    gapped = stack_rows([base[:2], base[3:6]])  # a gap: a new tensor with those rows
    assert gapped.data_ptr() != base.data_ptr() and gapped.tolist() == base[[0, 1, 3, 4, 5]].tolist()
    a, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.zeros(1, 3))
    keep = copy.copy((a, b))
    stacked = stack_rows([a, b], share=True)  # the parameters now read the stack's rows, identity kept
    assert keep[0] is a and a.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    assert stack_rows([a, b]).data_ptr() == stacked.data_ptr()  # and stacking them again copies nothing


def test_an_engine_still_builds_from_a_folder(ckpt):
    """A folder (no model object to share with) is read and copied by FastLlama.from_hf, as before."""
    engine = Engine(str(ckpt / "target"), None, config=EngineConfig(max_batch_size=1, max_seq_len=32,
                                                                     num_draft_tokens=0))
    assert len(_greedy(engine, [1, 2, 3], new=4)) == 4
