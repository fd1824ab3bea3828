"""A GGUF kept quantized is held once (`fast.held_quantized`, issue 36): after `specdec.load` the transformers model's
linear layers and its token embedding read the engine's blocks (no dense float32 copy of them is alive; the engine's
embedding is quantized too, its rows dequantized on gather); the transformers model still computes what it did, bit
for bit; a rebuilt engine gets the same body back; a model the user passed is never released. The duplicate's return is what the byte counts would see
(the control: the same model before `release_dense_weights` holds every linear weight dense)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_helpers import write_tiny_gguf  # noqa: E402
from loading.test_gguf_tensors import write_quantized_gguf  # noqa: E402

import specdec  # noqa: E402
from specdec.engine.build import build_model  # noqa: E402
from specdec.fast.held_once import held_bytes  # noqa: E402
from specdec.fast.held_quantized import (QuantizedEmbedding, QuantizedLinear, is_released,  # noqa: E402
                                         quantized_over, release_dense_weights)
from specdec.fast.quant import attach  # noqa: E402
from specdec.fast.quant.weight import quantized  # noqa: E402
from specdec.loading import load_model  # noqa: E402

PROMPT = [0, 5, 9, 14, 3, 22, 7]


@pytest.fixture(autouse=True)
def quantized_default(monkeypatch):
    monkeypatch.delenv(attach.ENV, raising=False)
    monkeypatch.setattr(attach, "_default", ["quantized"])  # (what --gguf-weights quantized sets; "auto" too where
    # the CPU kernels build)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_quantized_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q.gguf")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    """A tokenizer of the same 64 ids (the quantized file's own metadata has no scores)."""
    return str(write_tiny_gguf(tmp_path_factory.mktemp("tok") / "tiny-tok.gguf"))


def _dense_linear_bytes(model) -> int:
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([PROMPT])).logits


def test_load_releases_the_dense_linear_weights_and_the_embedding(gguf_file, tokenizer):
    control = load_model(gguf_file, device="cpu", dtype="float32", what="target")
    reference = _logits(control)
    llm = specdec.load(gguf_file, tokenizer=tokenizer, device="cpu", dtype="float32", max_batch_size=2, max_seq_len=64)
    model, fast = llm.target, llm.runner().model
    assert _dense_linear_bytes(control) > 0 and held_bytes(control) > held_bytes(model)  # the control: dense linears
    assert _dense_linear_bytes(model) == 0 and is_released(model) and quantized_over(model) is fast
    replaced = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(replaced) == len([m for m in control.modules() if isinstance(m, torch.nn.Linear)])  # every one
    embed = model.get_input_embeddings()
    assert isinstance(embed, QuantizedEmbedding) and fast.embed.is_meta and embed.quant is quantized(fast.embed)
    assert torch.equal(embed.weight, control.get_input_embeddings().weight)  # the same table, bit for bit
    assert not any(isinstance(m, torch.nn.Embedding) for m in model.modules())  # no dense table left
    assert held_bytes(model, fast) == held_bytes(model)  # the engine holds no dense tensor the model does not
    assert torch.equal(_logits(model), reference)  # the transformers model computes what it did, bit for bit
    text = llm.generate(PROMPT, max_new_tokens=8, temperature=0.0).token_ids
    assert len(text) == 8
    llm.close()


def test_a_rebuilt_engine_gets_the_same_body_and_the_dense_path_is_refused(gguf_file, tokenizer):
    llm = specdec.load(gguf_file, tokenizer=tokenizer, device="cpu", dtype="float32", max_batch_size=2, max_seq_len=64)
    fast = llm.runner().model
    assert build_model(llm.target) is fast and release_dense_weights(llm.target) == 0  # (released once)
    with pytest.raises(ValueError, match="dense weights were released"):
        build_model(llm.target, gguf_weights="dequantized")
    llm.close()


def test_a_model_the_user_passes_is_not_released(gguf_file, tokenizer):
    model = load_model(gguf_file, device="cpu", dtype="float32", what="target")
    dense = _dense_linear_bytes(model)
    llm = specdec.load(model, tokenizer=tokenizer, device="cpu", dtype="float32", max_batch_size=2, max_seq_len=64)
    assert not is_released(model) and _dense_linear_bytes(model) == dense
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # its own table, kept
    assert llm.runner().model.embed.is_meta  # (the engine's: quantized, gathered)
    llm.close()
