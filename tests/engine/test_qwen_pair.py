"""Exactness on real weights: the Qwen2.5-Coder pair (1.5B-Instruct target, 0.5B-Instruct draft), fp32 on the CPU —
greedy speculative decoding == plain decoding == transformers' generate, token for token (a difference only where the
target's top-2 logits tie), on code completions and chat-template prompts, and both engines over one copy of the
weights, on the pair's CPU GEMMs (`QWEN_CPU_LINEAR`).

Skipped unless the pair is installed: `python scripts/fetch_qwen_pair.py` (docs/QWEN_PAIR.md); the folders are read
from $SPECDEC_QWEN_PAIR (default ~/.cache/specdec/qwen2.5-coder, the script's default --dest). Slow (minutes on 2
cores, ≈ 10 GB of memory): five prompts, 32 new tokens.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same_greedy
from specdec.bench.demo_pair import QWEN_CPU_LINEAR, QWEN_DRAFT, QWEN_TARGET, qwen_pair_folder

PAIR = qwen_pair_folder()
TARGET, DRAFT = PAIR / QWEN_TARGET, PAIR / QWEN_DRAFT
CODE = ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if',
        "# Sort a list of numbers in Python\nnumbers = [5, 3, 8, 1]\n",
        "class Stack:\n    def __init__(self):\n"]
CHAT = ["Write a Python function that checks whether a string is a palindrome.",
        "What is the difference between a list and a tuple in Python? Answer briefly."]
NEW_TOKENS = 32

pytestmark = pytest.mark.skipif(not ((TARGET / "config.json").is_file() and (DRAFT / "config.json").is_file()),
                                reason=f"the Qwen2.5-Coder pair is not installed in {PAIR} "
                                       "(scripts/fetch_qwen_pair.py)")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def pair(monkeypatch_module):
    from specdec.fast.kernels import cpu_linear
    from specdec.loading import load_model, load_tokenizer

    monkeypatch_module.setattr(cpu_linear, "MODE", QWEN_CPU_LINEAR)  # the pair's: no packed copies (10 GB, not 18)
    target = load_model(TARGET, device="cpu", dtype="float32", what="target")
    draft = load_model(DRAFT, device="cpu", dtype="float32", what="draft")
    tokenizer = load_tokenizer(TARGET)
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                           tokenize=False) for c in CHAT]
    prompts = [tokenizer(p, add_special_tokens=False).input_ids for p in CODE + chats]
    return target, draft, prompts, target.generation_config.eos_token_id


def _engine_greedy(engine, prompts, eos) -> list[list[int]]:
    from specdec.request import SamplingParams

    ids = [engine.add_request(p, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, eos_token_ids=(eos,)))
           for p in prompts]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[i] for i in ids]


def test_greedy_speculative_equals_plain_equals_transformers(pair):
    from specdec.engine import Engine, EngineConfig
    from specdec.fast.held_once import held_bytes

    target, draft, prompts, eos = pair
    assert len(prompts) == 5 and all(len(p) > 8 for p in prompts)
    weights = held_bytes(target, draft)
    with torch.inference_mode():
        reference = [target.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                     eos_token_id=eos, pad_token_id=eos)[0, len(p):].tolist() for p in prompts]
    assert all(len(r) == NEW_TOKENS or r[-1] == eos for r in reference)
    config = dict(max_batch_size=len(prompts), max_seq_len=256)
    plain = Engine(target, None, config=EngineConfig(**config, num_draft_tokens=0))
    speculative = Engine(target, draft, config=EngineConfig(**config, num_draft_tokens=4))
    assert held_bytes(target, draft, plain.model, speculative.model, speculative.drafter.model) == weights
    for engine in (plain, speculative):
        for prompt, ours, ref in zip(prompts, _engine_greedy(engine, prompts, eos), reference):
            assert_same_greedy(target, prompt, ours, ref)
    stats = speculative.stats
    assert stats.accepted_tokens > stats.drafted_tokens / 2  # the draft really drafted, and mostly was accepted
