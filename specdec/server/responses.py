"""specdec results → OpenAI response bodies: usage, log-probabilities, the `specdec` and `speculative_decoding`
objects, ids and timestamps."""

from __future__ import annotations

import time
import uuid

from specdec.text.outputs import Completion, RequestStats, TextDelta

__all__ = ["new_id", "created", "usage", "specdec_extra", "speculative_decoding", "completion_logprobs",
           "chat_logprobs", "delta_extra"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompts: list[list[int]], completions: list[Completion]) -> dict:
    """Prompt tokens once per prompt (n choices share it), completion tokens over every choice; OpenAI's
    `prompt_tokens_details.cached_tokens`: per prompt, the tokens the prefix cache held for every one of its choices
    (`Completion.num_cached_tokens`; choices in prompt order, n each: the first of n copies prefills the prompt
    the others hit, so a fresh prompt counts 0 however large n is)."""
    prompt = sum(len(p) for p in prompts)
    generated = sum(len(c.token_ids) for c in completions)
    n = max(len(completions) // max(len(prompts), 1), 1)
    cached = sum(min(c.num_cached_tokens for c in completions[i : i + n]) for i in range(0, len(completions), n))
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": cached}}


def specdec_extra(stats: list[RequestStats], gamma) -> dict:
    """The `specdec` object of a response: one request's stats, or the sums over several choices."""
    if len(stats) == 1:
        return {**stats[0].to_dict(), "num_draft_tokens_per_step": gamma}
    return {"num_draft_tokens_per_step": gamma, "choices": [s.to_dict() for s in stats],
            **{k: sum(s.to_dict()[k] for s in stats) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}}


def speculative_decoding(stats: list[RequestStats]) -> dict:
    """vLLM's spec-decode counters (`SpecDecodingStats` names), summed over the response's choices."""
    per_pos: list[int] = []
    for s in stats:
        for i, n in enumerate(s.accepted_per_position):
            per_pos += [0] * (i + 1 - len(per_pos))
            per_pos[i] += n
    drafts = sum(s.num_drafts for s in stats)
    draft_tokens = sum(s.num_draft_tokens for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": per_pos,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None}


def completion_logprobs(tokenizer, token_ids, logprobs: list[float | None], offset: int = 0, tops=None) -> dict:
    """OpenAI's completions logprobs. `tops` (logprobs = N > 0): per token its N most likely (id, log p) of the
    target's raw law; each top_logprobs dict holds them and the chosen token (vLLM's shape: N or N + 1 entries).
    Without (logprobs 0): the chosen token alone."""
    tokens = [tokenizer.decode([t]) for t in token_ids]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = tops or [()] * len(tokens)
    top_dicts = []
    for text, lp, alternatives in zip(tokens, logprobs, tops):
        entry = {tokenizer.decode([t]): v for t, v in alternatives}
        entry.setdefault(text, lp)
        top_dicts.append(entry)
    return {"tokens": tokens, "token_logprobs": logprobs, "text_offset": offsets, "top_logprobs": top_dicts}


def chat_logprobs(tokenizer, token_ids, logprobs: list[float | None], top: int = 0, tops=None) -> dict:
    """OpenAI's chat logprobs; `tops`: per token its `top` most likely (id, log p) of the target's raw law."""
    def entry(token_id: int, lp) -> dict:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    tops = tops or [()] * len(token_ids)
    content = [{**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in alternatives[:top]] if top else []}
               for t, lp, alternatives in zip(token_ids, logprobs, tops)]
    return {"content": content}


def delta_extra(delta: TextDelta, details: bool) -> dict:
    extra = {"num_accepted": delta.num_accepted, "num_drafted": delta.num_drafted}
    if details:
        extra["tokens"] = [{"text": p.text, "kind": p.kind} for p in delta.pieces]
    return extra


def created() -> int:
    return int(time.time())

