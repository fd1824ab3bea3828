"""Exactness on real weights: the Qwen2.5-Coder pair (1.5B-Instruct target, 0.5B-Instruct draft), fp32 on the CPU —
greedy speculative decoding == plain decoding == transformers' generate, token for token (a difference only where the
target's top-2 logits tie), and both engines over one copy of the weights.

Skipped unless the pair is installed: `python scripts/fetch_qwen_pair.py` (docs/QWEN_PAIR.md); the folders are read
from $SPECDEC_QWEN_PAIR (default ~/.cache/specdec/qwen2.5-coder, the script's default --dest). Slow (minutes on 2
cores, ≈ 10 GB of memory): a few prompts, short outputs.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same_greedy
from specdec.bench.demo_pair import QWEN_DRAFT, QWEN_TARGET, qwen_pair_folder

PAIR = qwen_pair_folder()
TARGET, DRAFT = PAIR / QWEN_TARGET, PAIR / QWEN_DRAFT
PROMPTS = ["def fibonacci(n):\n", "# Sort a list of numbers in Python\nnumbers = [5, 3, 8, 1]\n",
           "class Stack:\n    def __init__(self):\n"]
NEW_TOKENS = 12

pytestmark = pytest.mark.skipif(not ((TARGET / "config.json").is_file() and (DRAFT / "config.json").is_file()),
                                reason=f"the Qwen2.5-Coder pair is not installed in {PAIR} "
                                       "(scripts/fetch_qwen_pair.py)")


@pytest.fixture(scope="module")
def pair(monkeypatch_module):
    from specdec.fast.kernels import cpu_linear
    from specdec.loading import load_model, load_tokenizer

    monkeypatch_module.setattr(cpu_linear, "MODE", "linear")  # no packed copies: 10 GB of weights, not 20
    target = load_model(TARGET, device="cpu", dtype="float32", what="target")
    draft = load_model(DRAFT, device="cpu", dtype="float32", what="draft")
    tokenizer = load_tokenizer(TARGET)
    return target, draft, [tokenizer(p).input_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _engine_greedy(engine, prompts) -> list[list[int]]:
    from specdec.request import SamplingParams

    ids = [engine.add_request(p, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, eos_token_ids=()))
           for p in prompts]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[i] for i in ids]


def test_greedy_speculative_equals_plain_equals_transformers(pair):
    from specdec.engine import Engine, EngineConfig
    from specdec.fast.held_once import held_bytes

    target, draft, prompts = pair
    weights = held_bytes(target, draft)
    with torch.inference_mode():
        reference = [target.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                     do_sample=False)[0, len(p):].tolist() for p in prompts]
    config = dict(max_batch_size=len(prompts), max_seq_len=128)
    plain = Engine(target, None, config=EngineConfig(**config, num_draft_tokens=0))
    speculative = Engine(target, draft, config=EngineConfig(**config, num_draft_tokens=4))
    assert held_bytes(target, draft, plain.model, speculative.model, speculative.drafter.model) == weights
    for engine in (plain, speculative):
        for prompt, ours, ref in zip(prompts, _engine_greedy(engine, prompts), reference):
            assert_same_greedy(target, prompt, ours, ref)
    assert speculative.stats.accepted_tokens > 0  # the draft really drafted (and was accepted)
