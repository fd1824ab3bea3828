"""What a request is, checked once: prompts, sampling parameters, EOS ids, seeds, γ, context and vocabulary bounds.

Every runner (the eager transformers loop in `specdec.loop`, the request-level engine in `specdec.engine`)
normalizes its arguments here, so a bad argument gets the same error, naming it, whichever runner takes it.
Numbers are bounded here, before anything is allocated.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.core import FILTERS, SamplingConfig, check_leniency
from specdec.core.processors import MAX_NGRAM_SIZE, check_bad_words, check_logit_bias, check_token_ids
from specdec.core.tree import TreeSpec

__all__ = ["SamplingParams", "MAX_NUM_DRAFT_TOKENS", "MAX_NEW_TOKENS", "MAX_TOP_LOGPROBS", "as_int", "check_max_new_tokens",
           "check_num_draft_tokens", "check_context", "context_length", "vocab_size", "step_num_draft_tokens",
           "normalize_prompts", "resolve_eos", "resolve_seed", "new_generator", "resolve_generator"]

#: Largest γ a step may draft: beyond it a step costs more than any acceptance rate can repay. A larger
#: integer is refused; a policy asking for more in a step is clamped to it.
MAX_NUM_DRAFT_TOKENS = 64
#: Largest max_new_tokens accepted; the model's context (prompt + max_new_tokens) is checked too.
MAX_NEW_TOKENS = 1 << 20
#: Most alternatives per generated token `top_logprobs` may ask for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20
_SEED_LIMIT = 1 << 63


def as_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as a Python int (numpy and torch integers accepted), bounded; the error names `name`."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got a bool ({value!r})")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer, got a tensor of shape {tuple(value.shape)} ({value.dtype})")
        value = value.item()
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_max_new_tokens(value) -> int:
    return as_int(value, "max_new_tokens", minimum=0, maximum=MAX_NEW_TOKENS)


def check_num_draft_tokens(value, name: str = "num_draft_tokens", minimum: int = 1, *, names: Sequence[str] = ()):
    """The one check of γ as a user gives it: an integer (numpy / torch integers, or digits in a string) with
    `minimum` <= γ <= MAX_NUM_DRAFT_TOKENS, or — where the caller accepts them — one of `names` (e.g. "auto",
    the loop's policy names), returned lower-cased. The error names `name`."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text.lstrip("-").isdigit() and len(text) <= 20:
            return as_int(int(text), name, minimum=minimum, maximum=MAX_NUM_DRAFT_TOKENS)
        if text in names:
            return text
        choices = f", or one of {', '.join(names)}" if names else ""
        raise ValueError(f"{name} must be an integer in [{minimum}, {MAX_NUM_DRAFT_TOKENS}]{choices}, got {value!r}")
    return as_int(value, name, minimum=minimum, maximum=MAX_NUM_DRAFT_TOKENS)


def step_num_draft_tokens(requested, remaining: int, *limits: int | None) -> int:
    """The γ a step really drafts: the policy's `requested` γ clamped to MAX_NUM_DRAFT_TOKENS, to what the
    step can commit (a row with `remaining` tokens to go keeps at most `remaining` = γ + 1 of them, so more
    drafts are wasted work) and to the target's and drafter's own `limits` (None = none). Exactness does
    not depend on γ, so clamping never changes the output law."""
    gamma = as_int(requested, "the policy's num_draft_tokens()", minimum=0)
    for limit in (MAX_NUM_DRAFT_TOKENS, remaining - 1, *limits):
        if limit is not None:
            gamma = min(gamma, limit)
    return max(gamma, 0)


_CONTEXT_NAMES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def context_length(model) -> int | None:
    """The positions a decoder can attend over (None = the model names none): a specdec target's or fast
    model's `max_positions`, else its transformers config's (`max_position_embeddings`, `n_positions`, …)."""
    for source in (model, getattr(model, "shape", None)):
        limit = getattr(source, "max_positions", None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return limit
    config = getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)
    for name in _CONTEXT_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def vocab_size(model) -> int:
    """V, the width of the model's logits: a transformers model's output-embedding rows (which may exceed
    `config.vocab_size`, padded for speed), a fast model's `shape.vocab_size`, a specdec target's `vocab_size`."""
    embeddings = getattr(model, "get_output_embeddings", None)
    layer = embeddings() if callable(embeddings) else None
    # a Linear says its width in out_features (a quantized head too: torch.ao's quantize_dynamic, whose `weight` is a
    # method; bitsandbytes' packed rows; `fast.held_quantized.QuantizedLinear`, whose `weight` dequantizes them all)
    rows = getattr(layer, "out_features", None)
    if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0:
        return rows
    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point():
        return int(weight.shape[0])
    for source in (getattr(model, "shape", None), model, getattr(model, "config", None)):
        value = getattr(source, "vocab_size", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise TypeError(f"cannot tell the vocabulary size of {type(model).__name__}: no output embeddings, "
                    "shape.vocab_size or config.vocab_size")


def check_context(target, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Refuse, before anything is allocated, a request the model's context cannot hold: for every
    architecture, prompt + max_new_tokens must fit the decoder's positions (encoder-decoder: the prompt fits
    the encoder's and max_new_tokens the decoder's, where the model has absolute positions)."""
    longest = max(len(p) for p in prompts)
    if hasattr(target, "encode"):  # encoder-decoder adapter: `position_limit` is None for relative positions
        limit = getattr(target, "position_limit", None)
        if limit is not None and longest > limit:
            raise ValueError(f"prompt length {longest} exceeds the encoder's context of {limit} tokens")
        if limit is not None and max_new_tokens > limit:
            raise ValueError(f"max_new_tokens {max_new_tokens} exceeds the decoder's context of {limit} tokens")
        return
    limit = context_length(target)
    if limit is None:
        return
    if longest > limit:
        raise ValueError(f"prompt length {longest} exceeds the model's context of {limit} tokens")
    if longest + max_new_tokens > limit:
        raise ValueError(
            f"prompt length {longest} + max_new_tokens {max_new_tokens} exceeds the model's context of {limit} "
            f"tokens: lower max_new_tokens to at most {limit - longest}"
        )


def resolve_seed(seed) -> int:
    """The request's seed: the given one (0 <= seed < 2**63), or fresh OS randomness."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little") >> 1
    return as_int(seed, "seed", minimum=0, maximum=_SEED_LIMIT - 1)


def new_generator(seed, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(resolve_seed(seed))


def resolve_generator(generator, seed, device: torch.device | str) -> torch.Generator:
    """The call's random generator: `generator` if given (checked), else one seeded by `seed` (checked too)."""
    if generator is None:
        return new_generator(seed, device)
    if seed is not None:
        resolve_seed(seed)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
    if torch.device(generator.device).type != torch.device(device).type:
        raise ValueError(f"generator is on {generator.device} but the target is on {device}")
    return generator


@dataclass(frozen=True)
class SamplingParams:
    """One request's decoding parameters (validated on construction; errors name the field).

    Built once at the edge (`specdec.generate` / `stream`, `LLM.generate`, the server) from keyword arguments
    and carried as it is to the runner: the eager loop, token trees, the engine's rows.

    temperature 0 = greedy (the exact argmax path); top_k 0, top_p 1.0 and min_p 0.0 = off (applied in that
    order after temperature, to p and q alike, as transformers' warpers). `eos_token_ids` () = none.
    `seed` None = fresh randomness; with a seed, the request's tokens depend only on its prompt, its
    parameters and the seed (not on other requests in the batch). `logprobs`: report log p(token) of the
    target's raw distribution for each generated token. `leniency` l ∈ (0, 1]: 1 = exact; l < 1 accepts
    more drafts and is LOSSY (appendix A.5; the loop and the engine's rows alike).

    Logits processors (`core.processors`; applied before temperature, to p and q at every drafted position with
    their state advanced along the draft, so the output law is exactly the processed target's):
    `repetition_penalty` r > 0 (1 = off; transformers' semantics over prompt + output), `frequency_penalty` and
    `presence_penalty` in [-2, 2] (0 = off; OpenAI's, over the output), `logit_bias` {token id: bias in
    [-100, 100]} (ids checked against the vocabulary by the runner), `min_tokens` (EOS ids masked until that many
    tokens were generated), `constraint` (a `core.processors.ConstraintSpec`, e.g. a
    compiled grammar; None = none), `allowed_token_ids` (only these ids may be generated; None = all),
    `no_repeat_ngram_size` n (transformers': no n-gram of the text twice; 0 = off), `bad_words_ids` (token
    sequences never generated: transformers' bad_words_ids).
    `top_logprobs` N ≤ 20: also report the N most likely tokens of the target's
    raw distribution at each generated token (needs `logprobs`).
    `draft_tree` [k_1, ..., k_D] (None = a chain): verify a token tree per step (`core.tree.TreeSpec`; exact).
    `num_draft_tokens` the request's draft cap γ: 0 = plain decoding, an int k (exactly k drafts a step, fewer only
    where its budget ends: `check_num_draft_tokens`), "auto" (the engine's policy picks), None = the runner's default;
    one engine serves every value in one batch (rows verify their own draft length; a tree sets its own depth).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    leniency: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    constraint: object | None = None
    top_logprobs: int = 0
    allowed_token_ids: tuple[int, ...] | None = None
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    draft_tree: tuple[int, ...] | None = None
    num_draft_tokens: int | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_new_tokens", check_max_new_tokens(self.max_new_tokens))
        if self.num_draft_tokens is not None:
            object.__setattr__(self, "num_draft_tokens", check_num_draft_tokens(self.num_draft_tokens, minimum=0,
                                                                                names=("auto",)))
        self._check_processors()
        if self.seed is not None:
            object.__setattr__(self, "seed", resolve_seed(self.seed))
        ids = () if self.eos_token_ids is None else self.eos_token_ids
        if hasattr(ids, "__index__") and not isinstance(ids, bool):
            ids = (ids,)
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"eos_token_ids must be an int or a list of ints, got {type(ids).__name__} {ids!r}")
        object.__setattr__(self, "eos_token_ids", tuple(as_int(t, "eos_token_id", minimum=0) for t in ids))
        if not isinstance(self.logprobs, bool):
            raise TypeError(f"logprobs must be a bool, got {type(self.logprobs).__name__}")
        object.__setattr__(self, "leniency", check_leniency(self.leniency))
        if self.draft_tree is not None:  # checked (and made a tuple) by the tree's own shape
            object.__setattr__(self, "draft_tree", TreeSpec(self.draft_tree).branching)
            if self.num_draft_tokens == 0:
                raise ValueError("draft_tree needs speculative steps: num_draft_tokens=0 is plain decoding")
        for name, value in vars(self.sampling).items():  # validated by SamplingConfig, normalized here
            object.__setattr__(self, name, value)

    def _check_processors(self) -> None:
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not (0 < r < math.inf):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {r!r}")
        object.__setattr__(self, "repetition_penalty", float(r))
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (-2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        object.__setattr__(self, "min_tokens", as_int(self.min_tokens, "min_tokens", minimum=0,
                                                      maximum=MAX_NEW_TOKENS))
        if self.allowed_token_ids is not None:
            ids = check_token_ids(self.allowed_token_ids, "allowed_token_ids")
            if self.min_tokens and set(ids) <= set(self.eos_token_ids):
                raise ValueError("allowed_token_ids allows only EOS ids, which min_tokens masks: nothing could be "
                                 "generated")
            object.__setattr__(self, "allowed_token_ids", ids)
        object.__setattr__(self, "bad_words_ids", check_bad_words(self.bad_words_ids or ()))
        object.__setattr__(self, "no_repeat_ngram_size", as_int(self.no_repeat_ngram_size, "no_repeat_ngram_size",
                                                                minimum=0, maximum=MAX_NGRAM_SIZE))
        if self.constraint is not None and not callable(getattr(self.constraint, "start", None)):
            raise TypeError("constraint must be None or a ConstraintSpec (an object with start(vocab_size) -> "
                            f"TokenConstraint), got {type(self.constraint).__name__}")
        if self.constraint is not None and self.min_tokens and self.eos_token_ids:
            raise ValueError(f"min_tokens={self.min_tokens} cannot be combined with a constraint: once the constrained "
                             "text is complete only EOS is allowed, which min_tokens forbids (no token would be left)")
        stops = getattr(self.constraint, "stop_token_ids", ())  # a grammar ends its text with one of these
        if self.constraint is not None and not set(stops) <= set(self.eos_token_ids):
            raise ValueError(f"constraint: its text ends with token {sorted(set(stops) - set(self.eos_token_ids))[0]}, "
                             f"which is not among the request's eos_token_ids {list(self.eos_token_ids)}")
        object.__setattr__(self, "top_logprobs", as_int(self.top_logprobs, "top_logprobs", minimum=0,
                                                        maximum=MAX_TOP_LOGPROBS))
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs={self.top_logprobs} needs logprobs=True")

    @property
    def processors(self) -> tuple[str, ...]:
        """The names of the logits processors this request turns on (in `core.processors`' order)."""
        on = (("no_repeat_ngram_size", self.no_repeat_ngram_size > 0), ("bad_words_ids", bool(self.bad_words_ids)),
              ("allowed_token_ids", self.allowed_token_ids is not None), ("logit_bias", bool(self.logit_bias)), ("min_tokens", self.min_tokens > 0 and bool(self.eos_token_ids)),
              ("repetition_penalty", self.repetition_penalty != 1.0),
              ("frequency_penalty", self.frequency_penalty != 0.0), ("presence_penalty", self.presence_penalty != 0.0),
              ("constraint", self.constraint is not None))
        return tuple(name for name, used in on if used)

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse token ids outside the model's vocabulary [0, vocab_size) (logit_bias; EOS ids)."""
        for token, _ in self.logit_bias:
            if token >= vocab_size:
                raise ValueError(f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})")
        for token in {t for word in self.bad_words_ids for t in word}:
            if token >= vocab_size:
                raise ValueError(f"bad_words_ids: {token} is outside the vocabulary [0, {vocab_size})")
        for token in self.allowed_token_ids or ():
            if token >= vocab_size:
                raise ValueError(f"allowed_token_ids: {token} is outside the vocabulary [0, {vocab_size})")
        for token in self.eos_token_ids:
            if token >= vocab_size:
                raise ValueError(f"eos_token_id {token} is outside the vocabulary [0, {vocab_size})")

    @property
    def sampling(self) -> SamplingConfig:
        """The law's parameters (temperature and every `core.FILTERS` filter) as the core reads them."""
        return SamplingConfig(self.temperature, **{f.name: getattr(self, f.name) for f in FILTERS})

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy  # temperature below core.TEMPERATURE_FLOOR


def normalize_prompts(prompts, attention_mask, vocab_size: int) -> list[list[int]]:
    """list[list[int]] from a ragged list or a [B, T] tensor (+ optional attention mask); numpy arrays too."""
    if _is_array(prompts):  # numpy: [B, T] or one prompt [T]
        prompts = prompts.tolist() if prompts.ndim != 1 else [prompts.tolist()]
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None, :]
        if prompts.dim() != 2 or prompts.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"prompts tensor must be an integer tensor [B, T], got {prompts.dtype} {tuple(prompts.shape)}")
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise TypeError(f"attention_mask must be a tensor [B, T] like prompts, got {type(attention_mask).__name__}")
            if attention_mask.shape != prompts.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} must equal prompts shape {tuple(prompts.shape)}"
                )
            keep = attention_mask.bool().cpu()
            rows = [row[m].tolist() for row, m in zip(prompts.cpu(), keep)]
        else:
            rows = prompts.cpu().tolist()
    else:
        if attention_mask is not None:
            raise ValueError("attention_mask is only accepted with a prompts tensor")
        if not isinstance(prompts, (list, tuple)) or not all(_is_row(p) for p in prompts):
            hint = ""
            if isinstance(prompts, str) or hasattr(prompts, "input_ids") or (
                    isinstance(prompts, (list, tuple)) and any(isinstance(p, (str, dict)) for p in prompts)):
                hint = ("; for text, chat messages or a tokenizer's output use the text API: "
                        "llm = specdec.load(target_dir, draft); llm.generate(\"def f(\")")
            raise ValueError("prompts must be a list of token-id lists (list[list[int]]) or a LongTensor [B, T]" + hint)
        rows = [p.tolist() if not isinstance(p, (list, tuple)) else list(p) for p in prompts]
    if not rows:
        raise ValueError("prompts is empty: give at least one prompt")
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        for j, tok in enumerate(row):
            if isinstance(tok, bool) or not hasattr(tok, "__index__"):
                raise ValueError(f"prompt {i} contains a non-integer token id {tok!r}")
            row[j] = operator.index(tok)
        lo, hi = min(row), max(row)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompt {i} has token id {lo if lo < 0 else hi} outside the vocabulary [0, {vocab_size})")
    return rows


def _is_array(value) -> bool:
    return not isinstance(value, (torch.Tensor, list, tuple, str, bytes)) and hasattr(value, "tolist") \
        and hasattr(value, "ndim")


def _is_row(value) -> bool:
    """One prompt: a list/tuple of ids, or a 1-D tensor / numpy array."""
    return isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) or _is_array(value)) and value.ndim == 1


def resolve_eos(eos_token_id, target) -> list[int]:
    """EOS ids: the argument, else the model's generation config, else its config (as in transformers)."""
    if eos_token_id is None:  # a transformers model itself, or what a specdec wrapper wraps
        model = target if isinstance(target, torch.nn.Module) else getattr(target, "model", target)
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
            eos_token_id = getattr(source, "eos_token_id", None) if source is not None else None
            if eos_token_id is not None:
                break
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, bool):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    ids = [eos_token_id] if hasattr(eos_token_id, "__index__") else eos_token_id
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    if any(isinstance(tok, bool) or not hasattr(tok, "__index__") for tok in ids):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return [operator.index(tok) for tok in ids]
