"""A GGUF's quantized tensors on the engine: a tiny Llama GGUF holding every block type (written here with gguf's
writer; the K-quants as random raw blocks) loads through `load_model`, and the engine's `FastLlama` keeps its linear
weights quantized (`fast.quant.attach`): logits near the dense float32 copy's (the kernel rounds activations to 8
bits), greedy plain == speculative with a quantized draft model, one log line naming the types and the kernel, the
option's precedence; and on the real SmolLM2-135M-Instruct Q4_1 file (skipped when it is not installed).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fast.quant.test_blocks import raw_tensor  # noqa: E402
from gguf_helpers import CHARS, smollm2_gguf, smollm2_marks  # noqa: E402

from specdec.fast.model import FastLlama  # noqa: E402
from specdec.fast.quant import attach  # noqa: E402
from specdec.fast.quant.attach import ENV, quantized_from_hf, resolve_weights, set_default  # noqa: E402
from specdec.fast.quant.weight import quantized  # noqa: E402
from specdec.loading import load_model  # noqa: E402
from specdec.loading.gguf_tensors import gguf_origin, read_quantized, tensor_types  # noqa: E402

DIM, FF, VOCAB, HEADS, KV_HEADS = 256, 512, 64, 4, 2
# one layer's tensors → block type: every type of `SUPPORTED` somewhere in the file
LAYER_TYPES = ({"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_K", "ffn_gate": "Q4_0",
                "ffn_up": "Q4_0", "ffn_down": "Q8_0"},
               {"attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q4_1", "attn_output": "Q8_0", "ffn_gate": "Q6_K",
                "ffn_up": "Q6_K", "ffn_down": "Q4_K"})


def _quantized(writer, name: str, kind: str, n: int, k: int, seed: int) -> None:
    raw = raw_tensor(kind, n, k, seed)
    if kind in ("Q4_K", "Q5_K", "Q6_K"):  # random raw blocks: shrink the fp16 scales so activations stay small
        per, size = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}[kind]
        blocks = raw.reshape(-1, size)
        for lo in ((208,) if kind == "Q6_K" else (0, 2)):
            blocks[:, lo:lo + 2] = (blocks[:, lo:lo + 2].view(np.float16) * np.float16(0.05)).view(np.uint8)
    writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])


def write_quantized_gguf(path: Path, *, tied: bool = False) -> Path:
    """The tiny Llama GGUF of every block type (its token embedding Q8_0); `tied`: no output.weight (the LM head is
    the embedding, as SmolLM2's)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, len(LAYER_TYPES)), (writer.add_context_length, 256),
                       (writer.add_embedding_length, DIM), (writer.add_feed_forward_length, FF),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_freq_base, 10000.0), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_vocab_size, VOCAB), (writer.add_rope_dimension_count, DIM // HEADS)):
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(["<s>", "</s>"] + CHARS[: VOCAB - 2])
    writer.add_token_types([3, 3] + [1] * (VOCAB - 2))
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    kv = KV_HEADS * DIM // HEADS
    rows = {"attn_q": (DIM, DIM), "attn_k": (kv, DIM), "attn_v": (kv, DIM), "attn_output": (DIM, DIM),
            "ffn_gate": (FF, DIM), "ffn_up": (FF, DIM), "ffn_down": (DIM, FF)}
    _quantized(writer, "token_embd.weight", "Q8_0", VOCAB, DIM, 100)
    for i, types in enumerate(LAYER_TYPES):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(DIM, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(DIM, np.float32))
        for j, (name, kind) in enumerate(types.items()):
            _quantized(writer, f"blk.{i}.{name}.weight", kind, *rows[name], seed=10 * i + j)
    writer.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    if not tied:
        _quantized(writer, "output.weight", "Q4_1", VOCAB, DIM, 101)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def no_process_default(monkeypatch):
    """No --gguf-weights / SPECDEC_GGUF_WEIGHTS from outside: these tests set what they test."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(attach, "_default", [])


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory) -> Path:
    return write_quantized_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q.gguf")


@pytest.fixture(scope="module")
def hf_model(quantized_gguf):
    return load_model(quantized_gguf, device="cpu", dtype="float32", what="target")


def test_the_file_holds_every_block_type_and_the_loader_remembers_it(quantized_gguf, hf_model):
    types = tensor_types(quantized_gguf)
    assert set(types) == {"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "F32"}
    assert gguf_origin(hf_model) == quantized_gguf
    names = [(name, layer) for name, layer, _ in read_quantized(quantized_gguf, HEADS, KV_HEADS)]
    assert names == [(n, i) for i in range(2) for n in ("wqkv", "wo", "w_gate_up", "w_down")] + \
        [("embed", None), ("lm_head", None)]


def test_the_engine_model_keeps_them_quantized_with_the_dense_logits(hf_model, caplog):
    with caplog.at_level(logging.INFO, logger="specdec.fast.quant.attach"):
        fast = quantized_from_hf(hf_model, weights="quantized")
    lines = [r.getMessage() for r in caplog.records if "kept quantized" in r.getMessage()]
    assert len(lines) == 1 and "Q4_K+Q6_K" in lines[0] and ("q8_mm" in lines[0] or "chunks" in lines[0])
    assert ("attn_decode" in lines[0]) == fast.cpu_attention
    for name in ("wqkv", "wo", "w_gate_up", "w_down"):
        assert all(p.is_meta and quantized(p) is not None for p in getattr(fast, name))
    assert fast.lm_head.is_meta and fast.embed.is_meta and quantized(fast.embed).source == "Q8_0"  # untied: both
    assert quantized(fast.lm_head) is not quantized(fast.embed)  # quantized, the embedding's rows gathered from its own
    dense = FastLlama.from_hf(hf_model)
    tokens = torch.tensor([[0, 5, 9, 14, 3, 22, 7, 30]])
    with torch.inference_mode():
        cq, cd = fast.new_cache(1, 32), dense.new_cache(1, 32)
        for chunk in (tokens, tokens[:, :1], tokens[:, :5]):  # a prefill, a decode step, a verify pass
            lq, ld = fast(chunk, cq), dense(chunk, cd)
            assert (lq - ld).norm() <= 0.04 * ld.norm()  # (8-bit activations, random weights: measured 1.2–2%)
        wrong = dense.w_down[1].detach().clone()
        dense.w_down[1].mul_(2.0)  # the negative control: one matrix scaled twice over is outside that bound
        cq, cd = fast.new_cache(1, 32), dense.new_cache(1, 32)
        lq, ld = fast(tokens, cq), dense(tokens, cd)
        assert (lq - ld).norm() > 0.04 * ld.norm()
        dense.w_down[1].copy_(wrong)


def test_greedy_plain_equals_speculative_on_the_quantized_engine(quantized_gguf, hf_model):
    import specdec

    set_default("quantized")  # (what --gguf-weights quantized sets)
    draft = load_model(quantized_gguf, device="cpu", dtype="float32", what="draft")  # quantized too
    prompt = [0, 5, 9, 14, 3, 22]
    plain = specdec.generate(hf_model, [prompt], drafter=None, max_new_tokens=24, temperature=0, engine="fast")
    spec = specdec.generate(hf_model, [prompt], drafter=draft, max_new_tokens=24, temperature=0, num_draft_tokens=3,
                            engine="fast")
    assert len(plain.sequences[0]) == 24 and plain.sequences == spec.sequences
    assert spec.stats.alpha == 1.0  # (the drafter is the target: every draft accepted)


def test_the_option_and_its_precedence(hf_model, monkeypatch):
    """EngineConfig's gguf_weights, else the process default (--gguf-weights), else the environment's alias, else
    `DEFAULT` (dequantized under bitwise); a bad value is refused by name."""
    assert resolve_weights() == attach.DEFAULT and resolve_weights(bitwise=True) == "dequantized"
    assert quantized_from_hf(hf_model, weights="dequantized") is None
    monkeypatch.setenv(ENV, "dequantized")
    assert resolve_weights() == "dequantized" and quantized_from_hf(hf_model) is None
    assert resolve_weights("quantized") == "quantized"
    set_default("quantized")
    assert resolve_weights() == "quantized"
    set_default("auto")
    monkeypatch.setenv(ENV, "fp4")
    with pytest.raises(ValueError, match=ENV):
        quantized_from_hf(hf_model)
    with pytest.raises(ValueError, match="gguf_weights"):
        resolve_weights("int4")
    from specdec.engine import EngineConfig

    with pytest.raises(ValueError, match="gguf_weights"):
        EngineConfig(gguf_weights="int4")
    monkeypatch.delenv(ENV)
    set_default("quantized")
    fast = quantized_from_hf(hf_model)
    fast.bitwise = True  # (the kernel is row-count invariant: bitwise covers it; without it, refused)
    monkeypatch.setattr("specdec.fast.layers.kernel_available", lambda: False)
    with pytest.raises(ValueError, match="bitwise=True does not cover GGUF weights"):
        fast(torch.tensor([[0, 5]]), fast.new_cache(1, 8))
    assert quantized_from_hf(FastLlama.from_hf(hf_model)) is None  # not from a GGUF: nothing to keep
    set_default("auto")
    monkeypatch.setattr("specdec.fast.quant.kernel.kernel_available", lambda: False)
    assert resolve_weights() == "dequantized"  # "auto" without the CPU kernels: the dense path
    assert resolve_weights("quantized") == "quantized"  # (asked for: the chunked fallback)


def test_the_cli_flag_sets_the_process_default(capsys):
    import argparse

    from specdec.cli.common import add_model_options, apply_model_options

    parser = argparse.ArgumentParser()
    add_model_options(parser, device="cpu")
    apply_model_options(parser.parse_args(["--gguf-weights", "quantized", "--threads", "0"]))
    assert resolve_weights() == "quantized"
    apply_model_options(parser.parse_args(["--gguf-weights", "dequantized", "--threads", "0"]))
    assert resolve_weights() == "dequantized"
    with pytest.raises(SystemExit):
        parser.parse_args(["--gguf-weights", "int4"])
    assert "--gguf-weights" in capsys.readouterr().err


def test_the_engine_takes_the_option(hf_model):
    from specdec.engine import Engine, EngineConfig

    def kept(config):
        return quantized(Engine(hf_model, None, config).model.wo[0]) is not None

    assert kept(EngineConfig(max_batch_size=1, max_seq_len=32, gguf_weights="quantized"))
    assert not kept(EngineConfig(max_batch_size=1, max_seq_len=32, gguf_weights="dequantized"))
    assert kept(EngineConfig(max_batch_size=1, max_seq_len=32)) == (attach.DEFAULT == "quantized")
    assert not kept(EngineConfig(max_batch_size=1, max_seq_len=32, bitwise=True))


SMOL = smollm2_gguf()


def test_smollm2s_tensors_on_the_kernel():
    assert tensor_types(SMOL) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    model = load_model(SMOL, device="cpu", dtype="float32", what="target")
    fast, dense = quantized_from_hf(model, weights="quantized"), FastLlama.from_hf(model)
    assert quantized(fast.embed).source == "Q8_0" and fast.lm_head is fast.embed  # tied: the head's quantized copy
    ids = torch.tensor([[1, 504, 3458, 314, 260, 1345, 28, 339, 2000, 17, 5]])
    with torch.inference_mode():
        lq, ld = fast(ids, fast.new_cache(1, 32)), dense(ids, dense.new_cache(1, 32))
    # 8-bit activations in every product: measured max |Δ| 1.33 on logits of magnitude 31 (4.3%), mean 0.25; the
    # argmax equal at 9 of 11 positions; KL(dense || quantized) 0.0066 nats mean (docs/benchmarks/quantized_cpu.md)
    assert (lq - ld).abs().max() <= 0.08 * ld.abs().max()
    assert (lq - ld).abs().mean() <= 0.02 * ld.abs().max()
    assert (lq.argmax(-1) == ld.argmax(-1)).float().mean() >= 0.7


for _mark in smollm2_marks(SMOL):
    test_smollm2s_tensors_on_the_kernel = _mark(test_smollm2s_tensors_on_the_kernel)


@pytest.mark.parametrize("bitwise", [False, True])
def test_smollm2_greedy_plain_equals_speculative_quantized(bitwise):
    """The demo's target kept quantized with its shipped head: the same greedy tokens with and without speculation,
    in the default mode and in bitwise mode. Both hold because every product and the decode attention are row-count
    invariant (`fast.quant.kernel`, `fast.quant.attention`): a verify pass gives each position the bits a one-token
    step gives it. (With SDPA's attention instead, the texts parted at the 23rd token of the first prompt: its
    last-bit differences between 1 and γ + 1 queries, turned into another token by the 8-bit activations.)"""
    from specdec.cli.demo_chat import SHIPPED_HEAD, load_gguf
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams
    from specdec.zoo.instructions import DEMO_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids

    target, tokenizer = load_gguf(SMOL)
    prompts = chat_prompt_ids(tokenizer, list(DEMO_PROMPTS)[:2])
    texts = []
    for drafter in (None, str(SHIPPED_HEAD)):
        engine = Engine(target, drafter, EngineConfig(max_batch_size=1, max_seq_len=256, num_draft_tokens=4,
                                                      bitwise=bitwise, gguf_weights="quantized"))
        assert quantized(engine.model.wo[0]) is not None and engine.model.cpu_attention
        for ids in prompts:
            engine.add_request(ids, SamplingParams(max_new_tokens=40, temperature=0))
            tokens = []
            while engine.has_unfinished():
                for out in engine.step():
                    tokens += out.new_token_ids
            texts.append(tokens)
    assert [len(t) for t in texts] == [40] * 4 and texts[:2] == texts[2:]


for _mark in smollm2_marks(SMOL):
    test_smollm2_greedy_plain_equals_speculative_quantized = _mark(test_smollm2_greedy_plain_equals_speculative_quantized)
