"""The call shapes vLLM users type, mapped onto `LLM`'s keyword parameters (checked by `prompts.make_params`).

    llm.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=64, seed=0))   # one for every prompt
    llm.generate(prompts, [SamplingParams(...), SamplingParams(...)])                   # one per prompt
    llm.generate("def f(", max_tokens=32, n=3, seed=0)                                  # 3 completions, seeds 0, 1, 2
    llm.chat([{"role": "user", "content": "hi"}], max_tokens=32)

`max_tokens` is vLLM's and OpenAI's name for `max_new_tokens`; `n` asks for n independent completions of each
prompt (request i of a prompt gets `seed + i` when a seed is given, as the server does), returned as a list per
prompt. A `SamplingParams` carries every field it has, its defaults included (an object given is taken as meant,
as vLLM does); `stop`, `n` and `num_draft_tokens` — which it does not hold — may be passed beside it.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from specdec.request import SamplingParams

__all__ = ["request_params", "shape_outputs", "check_conversations", "MAX_N"]

#: completions per prompt at most (the server's bound on `n`)
MAX_N = 128
#: SamplingParams fields that `LLM` takes under the same name
_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "logprobs", "top_logprobs", "leniency",
           "draft_tree", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens",
           "constraint", "allowed_token_ids", "no_repeat_ngram_size", "bad_words_ids", "num_draft_tokens")
#: keywords that may come beside a SamplingParams (it has no such field)
_BESIDE = ("stop", "num_draft_tokens", "n")


def request_params(batch: list, sampling_params, params: dict, stream: bool = False) -> tuple[list, list[dict], int]:
    """(prompt of each request, keyword parameters of each request, n) for the prompts `batch`: each repeated n
    times, its parameters from `sampling_params` (None, a `SamplingParams`, or a list with one per prompt) and
    the keywords; every conflict refused by name. `stream`: one completion (n must be 1)."""
    params, num_prompts = dict(params), len(batch)
    if "max_tokens" in params:
        if "max_new_tokens" in params:
            raise TypeError("give max_tokens or max_new_tokens, not both")
        params["max_new_tokens"] = params.pop("max_tokens")
    n = params.pop("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ValueError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
    if stream and n != 1:
        raise ValueError(f"n={n}: a stream is one completion; use generate(..., n={n})")
    if sampling_params is None:
        per_prompt = [dict(params) for _ in range(num_prompts)]
    else:
        given = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * num_prompts
        if len(given) != num_prompts:
            raise ValueError(f"sampling_params: {len(given)} SamplingParams for {num_prompts} prompts (give one, or "
                             "one per prompt)")
        both = sorted(set(params) - set(_BESIDE))
        if both:
            raise TypeError(f"{both[0]}: give it in the SamplingParams or as a keyword, not both")
        if "num_draft_tokens" in params and any(sp.num_draft_tokens is not None for sp in given
                                                if isinstance(sp, SamplingParams)):
            raise TypeError("num_draft_tokens: give it in the SamplingParams or as a keyword, not both")
        per_prompt = [{**_as_keywords(sp, i), **params} for i, sp in enumerate(given)]
    return ([ids for ids in batch for _ in range(n)], [_nth(kw, i) for kw in per_prompt for i in range(n)], n)


def _as_keywords(sampling: SamplingParams, index: int) -> dict:
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling_params[{index}] must be a specdec.SamplingParams, got {type(sampling).__name__}")
    known = {f.name for f in fields(SamplingParams)}
    if sampling.eos_token_ids:
        raise ValueError(f"sampling_params[{index}].eos_token_ids: requests end at the model's EOS tokens "
                         "(its generation_config); set them when loading, or use specdec.generate")
    unmapped = [f.name for f in fields(SamplingParams) if f.name not in _FIELDS and f.name != "eos_token_ids"
                and getattr(sampling, f.name) != (f.default if f.default is not MISSING else f.default_factory())]
    if unmapped:  # a field this module does not map yet: refused, never dropped
        raise ValueError(f"sampling_params[{index}].{unmapped[0]}: not taken by LLM.generate; pass it as a keyword")
    out = {name: getattr(sampling, name) for name in _FIELDS if name in known}
    out["logit_bias"] = dict(sampling.logit_bias)
    for name in ("allowed_token_ids", "num_draft_tokens"):  # (None: the model's own default applies)
        if getattr(sampling, name) is None:
            out.pop(name)
    return out


def _nth(params: dict, i: int) -> dict:
    """Request i of a prompt's n: seed + i when a seed is given (fresh randomness for each otherwise)."""
    if i == 0 or params.get("seed") is None:
        return dict(params)
    seed = params["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        return dict(params)  # (make_params names the bad seed)
    return {**params, "seed": seed + i}


def shape_outputs(completions: list, single: bool, n: int):
    """One prompt: its Completion (n = 1) or list of n; several: a list of those, in order."""
    groups = [completions[i:i + n] for i in range(0, len(completions), n)]
    shaped = [g[0] if n == 1 else g for g in groups]
    return shaped[0] if single else shaped


def check_conversations(messages):
    """`messages` when it is one conversation (a list of {"role", "content"} dicts) or a list of them; anything
    else refused in one line."""
    def is_conversation(value) -> bool:
        return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) for m in value)

    if is_conversation(messages) or (isinstance(messages, (list, tuple)) and messages
                                     and all(is_conversation(c) for c in messages)):
        return messages
    raise TypeError("messages must be a conversation (a list of {'role': ..., 'content': ...} dicts) or a list of "
                    "conversations")
