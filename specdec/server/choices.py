"""A checked request → its runner requests: the OpenAI / vLLM fields mapped onto `specdec.text` parameters (bounds
against the model: the context, the vocabulary, the engine's largest γ), the EOS ids, and the fan-out of n choices per
prompt with their seeds. Runs after `protocol.py` has typed, refused and tokenized the body; every client error
is an `APIError` naming the field.
"""

from __future__ import annotations

from specdec.core import FILTERS
from specdec.server.protocol import APIError, ChatRequest, ChoiceSpec, ParsedRequest

__all__ = ["build", "eos_ids", "DEFAULT_COMPLETION_MAX_TOKENS"]

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def build(request, llm, prompts: list[list[int]], max_tokens_limit: int, echo: tuple[str, ...] | None,
          default_seed: int | None = None, constraint=None) -> ParsedRequest:
    """The runner requests: prompt-major, n choices per prompt. `default_seed`: the seed of a request that sends
    none (None = fresh randomness). `constraint`: its structured output compiled (`server.structured`), or None."""
    chat = isinstance(request, ChatRequest)
    choices = []
    eos = _eos(request, llm)
    seed = request.seed if request.seed is not None else default_seed
    for i, ids in enumerate(prompts):
        base = _params(request, llm, len(ids), None if chat else DEFAULT_COMPLETION_MAX_TOKENS, max_tokens_limit)
        if constraint is not None:
            base["constraint"] = constraint
        for j in range(request.n):
            params = dict(base)
            if seed is not None:  # n > 1: the choices are independent draws (seed, seed + 1, ...)
                params["seed"] = (seed + i * request.n + j) % (1 << 63)
            choices.append(ChoiceSpec(i, params, eos))
    logprobs = (0 if request.logprobs else None) if chat else request.logprobs
    top = (request.top_logprobs or 0) if chat else (request.logprobs or 0)
    if top:  # the N most likely tokens of the target's raw law at each generated token (the engine's step)
        for choice in choices:
            choice.params["top_logprobs"] = top
    options = request.stream_options
    return ParsedRequest(
        prompts=prompts, choices=choices, stream=request.stream,
        include_usage=bool(options and options.include_usage), logprobs=logprobs,
        token_details=bool(request.specdec and request.specdec.token_details),
        num_draft_tokens=choices[0].params["num_draft_tokens"], echo=echo,
        return_token_ids=request.return_token_ids, request_id=request.request_id, top_logprobs=top,
    )


def eos_ids(request, llm) -> tuple[int, ...] | None:
    """The request's EOS ids (ignore_eos, stop_token_ids), or None = the model's."""
    return _eos(request, llm)


def _eos(request, llm) -> tuple[int, ...] | None:
    if not request.ignore_eos and not request.stop_token_ids:
        return None
    ids = [] if request.ignore_eos else list(llm.defaults.eos_token_ids)
    for t in request.stop_token_ids or []:
        if not 0 <= t < llm.vocab_size:
            raise APIError(f"stop_token_ids: {t} is outside the vocabulary [0, {llm.vocab_size})", param="stop_token_ids")
        if t not in ids:
            ids.append(t)
    return tuple(ids)


def _params(request, llm, num_prompt_tokens: int, default_max_tokens: int | None, max_tokens_limit: int) -> dict:
    """specdec.text parameters from the validated fields."""
    param = "messages" if isinstance(request, ChatRequest) else "prompt"
    room = llm.max_seq_len - num_prompt_tokens
    if room < 1:
        raise APIError(f"the prompt has {num_prompt_tokens} tokens; this model's context is {llm.max_seq_len} tokens",
                       param=param, code="context_length_exceeded")
    name, max_tokens = "max_tokens", request.max_tokens
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        name, max_tokens = "max_completion_tokens", request.max_completion_tokens
    limit = min(room, max_tokens_limit)
    if max_tokens is None:
        max_tokens = min(default_max_tokens or limit, limit)
    elif max_tokens > limit:
        why = (f"the prompt has {num_prompt_tokens} tokens and the context is {llm.max_seq_len}" if room < max_tokens_limit
               else f"this server's limit is {max_tokens_limit}")
        raise APIError(f"{name}={max_tokens} is too large: at most {limit} ({why})", param=name,
                       code="context_length_exceeded")
    params = {"max_new_tokens": max_tokens}
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.top_k is not None and request.top_k > llm.vocab_size:
        raise APIError(f"top_k must be at most the vocabulary size {llm.vocab_size}, got {request.top_k}",
                       param="top_k")
    for f in FILTERS:  # the sampling filters, each a field of the same name (schema.py bounds it)
        value = getattr(request, f.name, None)
        if value is not None:
            params[f.name] = max(value, 0) if f.name == "top_k" else value  # vLLM's top_k -1 = off
    if request.seed is not None:
        params["seed"] = request.seed
    if request.stop is not None:
        from specdec.text.prompts import check_stop

        try:
            params["stop"] = check_stop(request.stop)
        except (TypeError, ValueError) as err:
            raise APIError(str(err), param="stop") from None
    params.update(_processors(request, llm, max_tokens))
    params["num_draft_tokens"] = _num_draft_tokens(request, llm)
    params.update(_verification(request, params["num_draft_tokens"]))
    params["logprobs"] = request.logprobs is not None and request.logprobs is not False
    return params


def _processors(request, llm, max_tokens: int) -> dict:
    """The logits processors a request asks for (`core.processors`: applied to p and q along every draft, so the
    law is exactly the processed target's), checked against the model: logit_bias ids in the vocabulary,
    min_tokens at most max_tokens (as vLLM)."""
    out = {}
    for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
        value = getattr(request, name)
        if value is not None:
            out[name] = value
    if request.logit_bias:
        bias = {}
        for key, value in request.logit_bias.items():
            token = int(key) if isinstance(key, str) and key.strip().isdigit() and len(key) <= 20 else None
            if token is None or token >= llm.vocab_size:
                raise APIError(f"logit_bias: {key!r} is not a token id in the vocabulary [0, {llm.vocab_size})",
                               param="logit_bias")
            if not -100.0 <= value <= 100.0:
                raise APIError(f"logit_bias[{key}] must be in [-100, 100], got {value}", param="logit_bias")
            bias[token] = value
        out["logit_bias"] = bias
    if request.allowed_token_ids is not None:
        bad = [t for t in request.allowed_token_ids if not 0 <= t < llm.vocab_size]
        if bad or not request.allowed_token_ids:
            why = f"{bad[0]} is outside the vocabulary [0, {llm.vocab_size})" if bad else "the list is empty"
            raise APIError(f"allowed_token_ids: {why}", param="allowed_token_ids")
        out["allowed_token_ids"] = list(request.allowed_token_ids)
    if request.bad_words:
        out["bad_words_ids"] = _bad_words(request.bad_words, llm)
    if request.min_tokens:
        if request.min_tokens > max_tokens:
            raise APIError(f"min_tokens={request.min_tokens} must be at most max_tokens={max_tokens}",
                           param="min_tokens")
        out["min_tokens"] = request.min_tokens
    return out


def _bad_words(words: list[str], llm) -> list[list[int]]:
    """vLLM's bad_words: each word tokenized as it is and with a leading space (the two ways it can follow text);
    its last token is never generated after the others."""
    from specdec.core.processors import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS

    sequences: list[list[int]] = []
    for word in words:
        if not word.strip():
            raise APIError("bad_words: an empty word", param="bad_words")
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = list(llm.tokenizer.encode(text, add_special_tokens=False))
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise APIError(f"bad_words: {word[:40]!r} is {len(ids)} tokens; at most {MAX_BAD_WORD_TOKENS}",
                               param="bad_words")
            if ids and ids not in sequences:
                sequences.append(ids)
    if len(sequences) > MAX_BAD_WORDS:
        raise APIError(f"bad_words: {len(sequences)} token sequences (each word with and without a leading space); "
                       f"at most {MAX_BAD_WORDS}", param="bad_words")
    return sequences


def _verification(request, gamma) -> dict:
    """specdec.leniency and specdec.draft_tree: both act on speculative steps, so a request that runs plain
    decoding (γ = 0: asked for, or a server without a draft model) is refused rather than left as it was; a tree
    is verified exactly (lenience is a chain's rule); the tree's shape is checked here, its size against the
    engine's `max_tree_nodes` / `max_draft_tokens` when the request is submitted (a 400 naming the bound)."""
    options, out = request.specdec, {}
    if options is None:
        return out
    plain = "this request runs plain decoding (num_draft_tokens=0, or the server has no draft model)"
    if options.leniency is not None and options.leniency != 1.0:
        if gamma == 0:
            raise APIError(f"specdec.leniency={options.leniency} acts on speculative steps; {plain}",
                           param="specdec")
        out["leniency"] = options.leniency
    if options.draft_tree is not None:
        if gamma == 0:
            raise APIError(f"specdec.draft_tree needs a draft model's speculative steps; {plain}",
                           param="specdec")
        if "leniency" in out:
            raise APIError("specdec.draft_tree is verified exactly: it cannot be combined with specdec.leniency < 1",
                           param="specdec")
        from specdec.core.tree import TreeSpec

        try:
            out["draft_tree"] = TreeSpec(list(options.draft_tree)).branching
        except ValueError as err:
            raise APIError(f"specdec.draft_tree: {err}", param="specdec") from None
    return out


def _num_draft_tokens(request, llm) -> int:
    """The request's γ (`specdec.num_draft_tokens`, or the top-level field): 0 = plain decoding, 1..the engine's
    max_draft_tokens (one engine serves every value, in the same batches), none = the server's default."""
    value = request.draft_tokens
    if value is None:
        return llm.num_draft_tokens
    most = llm.max_draft_tokens
    if not 0 <= value <= most:
        served = "0 (plain decoding: the server has no draft model)" if not most else \
            f"in [0, {most}] on this server (0 = plain decoding)"
        raise APIError(f"num_draft_tokens must be {served}, got {value}", param="num_draft_tokens")
    return value
