"""The target's own answers to chat prompts, made with specdec's engine, as training text for its drafter.

    ids = chat_prompt_ids(tokenizer, prompts)                       # the chat template, generation prompt added
    rows = generate_responses(target, ids, max_new_tokens=320, eos_token_ids=[2], batch_size=128)
    data = response_data(rows, val_fraction=0.02)                  # a TokenData: prompt + answer per row
    vocab = draft_vocabulary(rows, 8192)                           # the answers' most frequent tokens

`generate_responses` keeps the engine full (continuous batching: a finished row's slot takes the next prompt)
and decodes plain (no drafter), greedily by default, so a drafter trained on the rows learns exactly the text
the target produces when `specdec demo` asks it something of the same kind.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.zoo.data import TokenData

__all__ = ["Response", "DraftVocabulary", "chat_prompt_ids", "stop_token_ids", "generate_responses", "response_data",
           "draft_vocabulary"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    prompt_ids: tuple[int, ...]  # the templated prompt
    response_ids: tuple[int, ...]  # the target's answer, its EOS included when it stopped
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass(frozen=True)
class DraftVocabulary:
    token_ids: torch.Tensor  # [N] int64, sorted: the tokens a reduced-vocabulary draft head may propose
    coverage: float  # share of the answers' tokens that are in it


def chat_prompt_ids(tokenizer, messages: list[str]) -> list[list[int]]:
    """Each user message through the tokenizer's chat template, generation prompt added → token ids."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template")
    out = []
    for text in messages:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end an answer: the model's generation_config EOS ids and the tokenizer's EOS (transformers
    versions differ on which of SmolLM2's <|im_start|> / <|im_end|> the GGUF tokenizer calls EOS)."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


@torch.inference_mode()
def generate_responses(target, prompt_ids: list[list[int]], *, max_new_tokens: int, eos_token_ids,
                       batch_size: int = 128, temperature: float = 0.0, seed: int = 0,
                       max_seconds: float | None = None) -> list[Response]:
    """The target's answers to every prompt (in order), decoded on the engine with `batch_size` requests in
    flight. With `max_seconds`, no new prompt is admitted after that time (the rows in flight finish); the
    result then covers a prefix of the prompts."""
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    longest = max(len(p) for p in prompt_ids) + max_new_tokens
    engine = Engine(target, None, EngineConfig(max_batch_size=batch_size, max_seq_len=longest, num_draft_tokens=0))
    eos = tuple(eos_token_ids)
    pending = iter(enumerate(prompt_ids))
    index_of, answers, finish = {}, {}, {}
    t0 = time.perf_counter()

    def admit() -> bool:
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            return False
        item = next(pending, None)
        if item is None:
            return False
        i, ids = item
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed * 1_000_003 + i,
                                eos_token_ids=eos)
        index_of[engine.add_request(ids, params)] = i
        answers[i] = []
        return True

    while engine.num_running + engine.num_waiting < batch_size and admit():
        pass
    done = 0
    while engine.has_unfinished():
        for out in engine.step():
            i = index_of[out.request_id]
            answers[i].extend(out.new_token_ids)
            if out.finished:
                finish[i] = out.finish_reason
                done += 1
                admit()
        if done and done % 1000 == 0:
            logger.info("responses: %d done in %.0f s", done, time.perf_counter() - t0)
    return [Response(tuple(prompt_ids[i]), tuple(answers[i]), finish[i]) for i in sorted(finish)]


def response_data(rows: list[Response], val_fraction: float = 0.02, tokenizer_dir: str | Path = "",
                  seed: int = 0) -> TokenData:
    """A decoder-only corpus of the rows (prompt + answer, one after the other), the last `val_fraction` of a
    seeded shuffle held out for validation; uint16 streams, so the vocabulary must be below 65,536."""
    if not rows:
        raise ValueError("no responses")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(len(rows))
    n_val = max(1, int(round(val_fraction * len(rows))))

    def stream(index) -> np.ndarray:
        parts = [np.asarray(rows[i].prompt_ids + rows[i].response_ids, dtype=np.int64) for i in index]
        joined = np.concatenate(parts)
        if joined.max() >= 1 << 16:
            raise ValueError(f"token id {int(joined.max())} does not fit the uint16 streams")
        return joined.astype(np.uint16)

    meta = {"corpus": "code", "source": "target responses", "rows": len(rows), "val_rows": n_val}
    return TokenData(stream(order[n_val:]), stream(order[:n_val]), Path(tokenizer_dir), meta)


def draft_vocabulary(rows: list[Response], size: int, always: tuple[int, ...] = ()) -> DraftVocabulary:
    """The `size` tokens most frequent in the answers (ties: the lower id), plus `always` (e.g. EOS)."""
    counts = Counter(t for r in rows for t in r.response_ids)
    if size < 1:
        raise ValueError(f"size must be ≥ 1, got {size}")
    picked = set(always)
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(picked) >= size:
            break
        picked.add(token)
    total = sum(counts.values())
    covered = sum(counts[t] for t in picked)
    return DraftVocabulary(torch.tensor(sorted(picked), dtype=torch.long), covered / total if total else 0.0)
