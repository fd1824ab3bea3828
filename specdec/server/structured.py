"""Structured output: OpenAI's `response_format` and vLLM's `guided_*` / `structured_outputs` → one `Constraint`.

`constraint_of` reads the request (cheap, before tokenization: a schema keyword the grammar engine would not
enforce is a 400 naming it and where it is); `compile_for` compiles it for the served tokenizer (the app runs it
on a worker thread: the first compile per tokenizer reads the whole vocabulary). A request asks for at most one.
"""

from __future__ import annotations

from contextlib import contextmanager

from specdec.constrain import MISSING_ENGINE, Constraint, compile_constraint
from specdec.constrain.compiles import CompileTimeout, GrammarCompiles
from specdec.server.protocol import APIError

__all__ = ["constraint_of", "compile_for", "compile_on", "BACKENDS"]

#: guided_decoding_backend values honoured (vLLM's names; every one of them means xgrammar here)
BACKENDS = (None, "auto", "xgrammar")


def constraint_of(request) -> tuple[str, Constraint] | None:
    """(the field that asked, its Constraint), or None; APIError naming the field for a bad or double request."""
    asked = []
    fmt = request.response_format
    if fmt is not None and fmt.type != "text":
        asked.append(("response_format", lambda: _response_format(fmt)))
    for name, make in (("guided_json", Constraint.json_schema), ("guided_regex", _regex),
                       ("guided_choice", Constraint.choice), ("guided_grammar", _grammar)):
        value = getattr(request, name)
        if value is not None:
            asked.append((name, lambda make=make, value=value: make(value)))
    if request.structured_outputs is not None:
        asked.append(("structured_outputs", lambda: _structured_outputs(request.structured_outputs)))
    if request.guided_decoding_backend not in BACKENDS:
        raise APIError(f"guided_decoding_backend={request.guided_decoding_backend!r:.40} is not available: "
                       "constrained decoding uses xgrammar ('xgrammar' or 'auto')", param="guided_decoding_backend")
    if not asked:
        return None
    if len(asked) > 1:
        names = ", ".join(name for name, _ in asked)
        raise APIError(f"{names}: a request may ask for one structured output, got {len(asked)}", param=asked[1][0])
    name, make = asked[0]
    if request.min_tokens:
        raise APIError(f"min_tokens={request.min_tokens} cannot be combined with a constraint ({name}): once the "
                       "constrained text is complete only EOS is allowed, which min_tokens forbids", param="min_tokens")
    try:
        return name, make()
    except APIError:
        raise
    except (TypeError, ValueError) as err:
        raise APIError(f"{name}: {err}", param=name) from None


def _response_format(fmt) -> Constraint:
    if fmt.type == "json_object":
        return Constraint.json_object()
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError("json_schema must be an object with a name and a schema "
                             '({"name": ..., "schema": {...}, "strict": true})')
        unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if unknown:
            raise ValueError(f"json_schema.{unknown[0]} is not a field of json_schema")
        if "schema" not in spec:
            raise ValueError("json_schema.schema is required (the JSON schema the output must match)")
        return Constraint.json_schema(spec["schema"])
    raise ValueError(f"type {fmt.type!r} is not served: use json_object or json_schema (regular expressions and "
                     "grammars: guided_regex / guided_grammar)")


def _regex(value) -> Constraint:
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {type(value).__name__}")
    return Constraint.regex(value)


def _grammar(value) -> Constraint:
    if not isinstance(value, str):
        raise TypeError(f"must be a string (EBNF, root rule `root`), got {type(value).__name__}")
    return Constraint.grammar(value)


def _structured_outputs(value) -> Constraint:
    """vLLM's newer form: {"json": schema} | {"regex": str} | {"choice": [...]} | {"grammar": str} |
    {"json_object": true}."""
    if not isinstance(value, dict):
        raise TypeError(f"must be an object, got {type(value).__name__}")
    known = {"json": Constraint.json_schema, "regex": _regex, "choice": Constraint.choice, "grammar": _grammar,
             "json_object": lambda flag: Constraint.json_object() if flag is True else None}
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not served (json, regex, choice, grammar, json_object)")
    made = [(key, known[key](v)) for key, v in value.items() if v is not None]
    made = [(key, c) for key, c in made if c is not None]
    if len(made) != 1:
        raise ValueError(f"name exactly one of json, regex, choice, grammar, json_object; got {len(made)}")
    return made[0][1]


def compile_for(llm, name: str, constraint: Constraint, eos_token_ids):
    """The constraint compiled for the served tokenizer and logits (a `constrain.Grammar`), on this thread;
    APIError naming the field when it cannot be (no EOS id: ignore_eos; an engine error; xgrammar not installed)."""
    eos = _eos(llm, name, eos_token_ids)
    with _as_api_errors(name):
        return compile_constraint(constraint, llm.tokenizer, llm.vocab_size, eos)


async def compile_on(compiles: GrammarCompiles, llm, name: str, constraint: Constraint, eos_token_ids):
    """`compile_for` on the server's compile pool (`constrain.GrammarCompiles`: its own worker threads, a time
    limit, a bounded cache), awaited: no request waits on another's compile. Past the limit: a 400 naming it and
    its flag."""
    eos = _eos(llm, name, eos_token_ids)
    with _as_api_errors(name):
        return await compiles.compile_async(constraint, llm.tokenizer, llm.vocab_size, eos)


def _eos(llm, name: str, eos_token_ids) -> tuple:
    eos = tuple(llm.defaults.eos_token_ids if eos_token_ids is None else eos_token_ids)
    if not eos:
        raise APIError(f"{name}: the constrained text ends with an EOS token, and this request has none "
                       "(ignore_eos, or a model without EOS): drop ignore_eos or pass stop_token_ids", param=name)
    return eos


@contextmanager
def _as_api_errors(name: str):
    try:
        yield
    except CompileTimeout as err:
        raise APIError(f"{name}: {err} (--grammar-compile-timeout)", param=name) from None
    except ImportError:
        raise APIError(f"{name}: {MISSING_ENGINE} on the server", param=name) from None
    except (TypeError, ValueError) as err:
        raise APIError(f"{name}: {err}", param=name) from None
