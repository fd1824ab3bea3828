"""Prompts and parameters of text requests: strings, ids, chat messages → token ids; kwargs → SamplingParams.

Defaults come from the target's generation_config as transformers reads it: greedy unless `do_sample`,
its temperature, sampling filters (every `core.FILTERS` entry by its name: top_k, top_p, min_p, …) and
max_new_tokens when set; explicit arguments win.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path

from specdec.core import FILTERS
from specdec.request import MAX_NEW_TOKENS, SamplingParams, as_int
from specdec.text.detokenize import MAX_STOP_LENGTH, MAX_STOP_STRINGS

__all__ = ["GenerationDefaults", "encode_prompts", "render_chat", "apply_template", "ChatTemplateError", "make_params",
           "PARAMS", "read_chat_template"]

PARAMS = ("max_new_tokens", "temperature", *(f.name for f in FILTERS), "seed", "stop", "num_draft_tokens", "logprobs",
          "top_logprobs", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens",
          "allowed_token_ids", "no_repeat_ngram_size", "bad_words_ids", "constraint", "leniency", "draft_tree")
#: Logits processors (`core.processors`), passed to SamplingParams as they are (it checks them, naming the field)
_PROCESSOR_PARAMS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens",
                     "allowed_token_ids", "no_repeat_ngram_size", "bad_words_ids", "constraint")
_DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class GenerationDefaults:
    """A model's request defaults. `filters`: (name, value) per `core.FILTERS` entry (its `off` value when the
    generation_config does not set it), also read as attributes (`defaults.top_p`)."""

    temperature: float = 0.0
    filters: tuple[tuple[str, object], ...] = tuple((f.name, f.off) for f in FILTERS)
    repetition_penalty: float = 1.0  # a generation config's repetition_penalty is honoured (transformers applies it)
    min_tokens: int = 0  # its min_new_tokens, likewise
    no_repeat_ngram_size: int = 0  # and its no_repeat_ngram_size
    bad_words_ids: tuple = ()  # and its bad_words_ids
    max_new_tokens: int | None = None  # None = 64, capped by the room left in the context
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_model(cls, model, eos_token_ids) -> "GenerationDefaults":
        config = getattr(model, "generation_config", None)

        def get(name, default):
            value = getattr(config, name, None) if config is not None else None
            return default if value is None else value

        sample = bool(get("do_sample", False))
        return cls(
            temperature=float(get("temperature", 1.0)) if sample else 0.0,
            filters=tuple((f.name, get(f.name, f.off)) for f in FILTERS),  # checked per request (SamplingConfig)
            repetition_penalty=float(get("repetition_penalty", 1.0)),
            min_tokens=int(get("min_new_tokens", 0)),
            no_repeat_ngram_size=int(get("no_repeat_ngram_size", 0)),
            bad_words_ids=tuple(tuple(w) for w in get("bad_words_ids", ()) or ()),
            max_new_tokens=get("max_new_tokens", None),
            eos_token_ids=tuple(eos_token_ids),
        )

    def __getattr__(self, name: str):
        """A filter's default by its name (`defaults.top_k`); only called for names that are not fields."""
        for key, value in self.__dict__.get("filters", ()):
            if key == name:
                return value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def render_chat(tokenizer, messages) -> str:
    """Chat messages rendered with the tokenizer's chat template, ending with the assistant's turn."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content', got {m!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template: pass chat_template= to specdec.load "
                         "(--chat-template FILE for the CLI and server), or send a plain text prompt")
    return apply_template(tokenizer, list(messages), add_generation_prompt=True)


class ChatTemplateError(ValueError):
    """The chat template failed while rendering: one line naming the template (a request's fault or the
    template's, never the server's: a 400)."""


def apply_template(tokenizer, messages: list, **options) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, **options)`, every exception from rendering
    (jinja2's own — `raise_exception`, the sandbox's SecurityError — and any other, e.g. the sandbox's
    `OverflowError: Range too big`) turned into one `ChatTemplateError` line."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except Exception as err:  # noqa: BLE001 - a template is code from the checkpoint: whatever it raises
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        text = lines[0] if lines else ""
        text = text if len(text) <= 200 else text[:197] + "..."
        kind = "" if type(err).__module__.startswith("jinja2") else f"{type(err).__name__}: "
        raise ChatTemplateError(f"chat template: {kind}{text}".rstrip(": ")) from None


def encode_prompts(prompts, tokenizer, vocab_size: int) -> tuple[list[list[int]], bool]:
    """(token ids per prompt, whether a single prompt was given).

    One prompt: a string, a list of ids, chat messages (a list of dicts), a 1-D tensor. Several: a list of
    those, a 2-D tensor, or a tokenizer's output (`BatchEncoding` / dict with input_ids, attention_mask honoured).
    """
    import torch

    if isinstance(prompts, dict) or hasattr(prompts, "input_ids") and not isinstance(prompts, torch.Tensor):
        return _from_encoding(prompts, vocab_size)
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2):
            raise ValueError(f"prompts tensor must be [T] or [B, T], got shape {tuple(prompts.shape)}")
        rows = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
        return [_ids(r, i, vocab_size) for i, r in enumerate(rows)], prompts.dim() == 1
    if isinstance(prompts, str) or _is_prompt_list(prompts):
        return [_encode_one(prompts, 0, tokenizer, vocab_size)], True
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a string, token ids, chat messages, or a non-empty list of those; "
                         f"got {type(prompts).__name__}")
    return [_encode_one(p, i, tokenizer, vocab_size) for i, p in enumerate(prompts)], False


def _is_prompt_list(value) -> bool:
    """A list that is ONE prompt: token ids or chat messages."""
    if not isinstance(value, (list, tuple)) or not value:
        return False
    first = value[0]
    return isinstance(first, dict) or (hasattr(first, "__index__") and not isinstance(first, (str, list, tuple)))


def _encode_one(prompt, index: int, tokenizer, vocab_size: int) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompt {index} is empty")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        ids = tokenizer.encode(render_chat(tokenizer, prompt), add_special_tokens=False)
    elif isinstance(prompt, (list, tuple)):
        ids = prompt
    else:
        raise ValueError(f"prompt {index} must be a string, token ids or chat messages, got {type(prompt).__name__}")
    return _ids(ids, index, vocab_size)


def _ids(ids, index: int, vocab_size: int) -> list[int]:
    if not ids:
        raise ValueError(f"prompt {index} has no tokens")
    out = []
    for tok in ids:
        if isinstance(tok, bool) or not hasattr(tok, "__index__"):
            raise ValueError(f"prompt {index} contains a non-integer token id {tok!r}")
        tok = operator.index(tok)
        if not 0 <= tok < vocab_size:
            raise ValueError(f"prompt {index} has token id {tok} outside the vocabulary [0, {vocab_size})")
        out.append(tok)
    return out


def _from_encoding(encoding, vocab_size: int) -> tuple[list[list[int]], bool]:
    import torch

    ids = encoding["input_ids"]
    mask = encoding.get("attention_mask") if hasattr(encoding, "get") else None
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    mask = mask.tolist() if isinstance(mask, torch.Tensor) else mask
    single = bool(ids) and not isinstance(ids[0], (list, tuple))
    rows, masks = ([ids], [mask] if mask is not None else None) if single else (ids, mask)
    if masks is not None:
        rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(rows, masks)]
    return [_ids(r, i, vocab_size) for i, r in enumerate(rows)], single


#: Why one request's γ is never a draft-length policy (`specdec.policy`: a name or an object).
PER_REQUEST_POLICY = ("a draft-length policy chooses one γ per step for the whole batch (its rows share one verify "
                      "pass, and the policy is told the batch's outcome), so it is a model's default γ "
                      "(`specdec.load(num_draft_tokens=...)`), not one request's: a request takes an integer "
                      "(its own draft cap, 0 = plain decoding) or 'auto'")


def check_num_draft_tokens(value):
    """A request's own γ: an int in [0, MAX_NUM_DRAFT_TOKENS] (0 = plain decoding; its draft cap) or "auto" (the
    engine picks γ each step). A draft-length policy's name or object is refused, saying why (`PER_REQUEST_POLICY`)."""
    from specdec.request import check_num_draft_tokens as check

    refuse_request_policy(value)
    return check(value, minimum=0, names=("auto",))


def refuse_request_policy(value) -> None:
    """A ValueError saying why (`PER_REQUEST_POLICY`) where one request's γ is a draft-length policy's name or object."""
    from specdec.policy import POLICY_NAMES, DraftLengthPolicy

    if isinstance(value, DraftLengthPolicy) or isinstance(value, str) and value.strip().lower() in POLICY_NAMES:
        raise ValueError(f"num_draft_tokens={gamma_label(value)!r} for one request: {PER_REQUEST_POLICY}")


def check_default_gamma(value):
    """A model's default γ: a request's (`check_num_draft_tokens`), a draft-length policy's name, or a policy object
    (`specdec.policy.check_policy`: a `DraftLengthPolicy` implementing `num_draft_tokens()`; another object refused,
    naming what it lacks). `text.runner.build_runner` sets a policy on the engine."""
    from specdec.policy import POLICY_NAMES, check_policy
    from specdec.request import check_num_draft_tokens as check

    if isinstance(value, (str, bool, float)) or hasattr(value, "__index__"):
        return check(value, minimum=0, names=("auto", *POLICY_NAMES))
    return check_policy(value)


def gamma_label(value):
    """A default γ as reports and labels name it: an int or a name as it is, a policy object by its class's name."""
    return value if isinstance(value, (int, str)) else type(value).__name__


def make_params(llm, prompt_len: int, params: dict):
    """(SamplingParams, stop strings, γ) from keyword arguments over the model's defaults. γ: the request's own
    `num_draft_tokens` (then also in the SamplingParams), else the model's default (the SamplingParams' None)."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise TypeError(f"unknown parameter {unknown[0]!r}; the parameters are {', '.join(PARAMS)}")
    d = llm.defaults
    room = llm.max_seq_len - prompt_len
    if room < 1:
        raise ValueError(f"prompt is {prompt_len} tokens: it must be shorter than the model context of "
                         f"{llm.max_seq_len} tokens")
    max_new = params.get("max_new_tokens")
    if max_new is None:
        max_new = min(d.max_new_tokens or _DEFAULT_MAX_NEW_TOKENS, room)
    max_new = as_int(max_new, "max_new_tokens", minimum=0, maximum=MAX_NEW_TOKENS)
    if max_new > room:
        raise ValueError(f"max_new_tokens={max_new} does not fit: the prompt has {prompt_len} tokens and the "
                         f"model context of {llm.max_seq_len} tokens leaves room for at most {room} new tokens")
    cap = params.get("num_draft_tokens")
    if cap is llm.num_draft_tokens or isinstance(cap, str) and cap.strip().lower() == llm.num_draft_tokens:
        cap = None  # (the model's default as it is: a policy's name or object too)
    cap = None if cap is None else llm.check_gamma(cap)  # (a draft for γ ≠ 0; SamplingParams: an int or "auto")
    cap = None if cap == llm.num_draft_tokens else cap
    gamma = llm.num_draft_tokens if cap is None else cap
    sampling = SamplingParams(
        max_new_tokens=max_new,
        temperature=_number(params.get("temperature", d.temperature), "temperature"),
        **{name: params.get(name, default) for name, default in d.filters},  # (SamplingConfig checks each, by name)
        seed=params.get("seed"),
        eos_token_ids=d.eos_token_ids,
        logprobs=_flag(params.get("logprobs", False), "logprobs"),
        top_logprobs=params.get("top_logprobs", 0),
        leniency=params.get("leniency", 1.0),  # (SamplingParams checks both, naming the field)
        draft_tree=params.get("draft_tree"),
        num_draft_tokens=cap,
        **{name: params[name] for name in _PROCESSOR_PARAMS if name in params and name != "constraint"},
        constraint=_constraint(llm, params.get("constraint")),
        **({} if "repetition_penalty" in params else {"repetition_penalty": d.repetition_penalty}),
        **({} if "min_tokens" in params else {"min_tokens": min(d.min_tokens, max_new)}),
        **({} if "no_repeat_ngram_size" in params else {"no_repeat_ngram_size": d.no_repeat_ngram_size}),
        **({} if "bad_words_ids" in params else {"bad_words_ids": d.bad_words_ids}),
    )
    return sampling, check_stop(params.get("stop")), gamma


def _constraint(llm, constraint):
    """A tokenizer-free `specdec.constrain.Constraint` compiled for this model (its tokenizer, logits, EOS ids);
    anything else (None, a compiled grammar, a `core.processors.ConstraintSpec`) as it is."""
    from specdec.constrain.spec import Constraint

    if not isinstance(constraint, Constraint):
        return constraint
    from specdec.constrain.grammar import compile_constraint

    return compile_constraint(constraint, llm.tokenizer, llm.vocab_size, llm.defaults.eos_token_ids)


def check_stop(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    for s in stops:
        if not s or len(s) > MAX_STOP_LENGTH:
            raise ValueError(f"stop strings must have 1 to {MAX_STOP_LENGTH} characters, got {s!r:.80}")
    return tuple(stops)


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def read_chat_template(template) -> str:
    """A Jinja chat template given as a string or a file path → its text."""
    if isinstance(template, Path) or (isinstance(template, str) and "{" not in template and Path(template).is_file()):
        return Path(template).read_text(encoding="utf-8")
    if not isinstance(template, str) or "{" not in template:
        raise ValueError(f"chat_template must be a Jinja template string or a file, got {template!r}")
    return template
