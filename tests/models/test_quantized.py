"""Models the fast bodies cannot copy (quantized with torch.ao, custom layers) run on the engine's transformers backend
or the eager loop, never crash."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import specdec
from helpers import hf_greedy
from specdec.engine import UnsupportedModel
from specdec.engine.build import covers, uncovered_reason
from specdec.request import vocab_size


@pytest.fixture(scope="module")
def quantized(make_llama):
    model = make_llama(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8).eval()


def test_vocab_of_a_quantized_head(quantized, llama):
    assert vocab_size(quantized) == vocab_size(llama) == 64
    assert callable(quantized.lm_head.weight)  # the shape the old code read does not exist


@pytest.mark.parametrize("engine", ["auto", "hf"])
@pytest.mark.parametrize("drafter", [None, "lookup"])
def test_quantized_model_runs_on_the_eager_loop(quantized, engine, drafter):
    prompt = [5, 6, 7, 5, 6, 7, 5]
    ref = hf_greedy(quantized, prompt, 12, [])
    out = specdec.generate(quantized, [prompt], max_new_tokens=12, temperature=0, engine=engine,
                           drafter=specdec.PromptLookupDrafter() if drafter else None, num_draft_tokens=3)
    assert out.sequences[0] == ref


def test_engine_refuses_uncopyable_models_in_one_line(quantized, llama, gpt2):
    reason = uncovered_reason(quantized)
    assert reason is not None and "q_proj" in reason and "torch.ao" in reason and "\n" not in reason
    assert not covers(quantized) and covers(llama)
    assert uncovered_reason(gpt2) is None  # its Conv1D (transformers.pytorch_utils) holds plain weights
    with pytest.raises(UnsupportedModel, match="quantized"):
        specdec.generate(quantized, [[1, 2, 3]], max_new_tokens=2, temperature=0, engine="fast")


class _Scaled(torch.nn.Module):  # a layer type the engine does not know
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) * 1.0


def test_custom_layer_runs_on_the_transformers_backend_with_a_notice(ckpt, caplog, monkeypatch):
    """A layer type the fast bodies do not know: the engine runs the model's own modules (its transformers backend),
    said in one log line; the loop stays what runner="fallback" asks for."""
    from specdec.loading import load_model, load_tokenizer
    from specdec.text import LLM
    from specdec.text.runner import FallbackRunner

    monkeypatch.setattr("specdec.engine.build._noticed", set())  # (the line is said once per process and model type)
    model = load_model(ckpt / "target", device="cpu")
    model.model.layers[0].mlp.down_proj = _Scaled(model.model.layers[0].mlp.down_proj)
    assert "_Scaled" in uncovered_reason(model)
    with caplog.at_level(logging.INFO, logger="specdec.engine.build"):
        with LLM(model, load_tokenizer(ckpt / "target"), runner="auto") as llm:
            assert type(llm.runner(0).model).__name__ == "HFBackendModel" and llm.runner_kind == "engine"
            out = llm.generate([3, 4, 5], max_new_tokens=6, temperature=0)
    notices = [r.getMessage() for r in caplog.records if "transformers backend" in r.getMessage()]
    assert len(notices) == 1 and "_Scaled" in notices[0]
    assert out.token_ids == hf_greedy(model, [3, 4, 5], 6, [model.config.eos_token_id])
    with LLM(model, load_tokenizer(ckpt / "target"), runner="fallback") as loop:
        assert isinstance(loop.runner(0), FallbackRunner)
        assert loop.generate([3, 4, 5], max_new_tokens=6, temperature=0).token_ids == out.token_ids
