"""A `Constraint` compiled for one tokenizer and vocabulary width: `Grammar` (xgrammar under the hood).

xgrammar (`pip install specdec[grammar]`) is imported here, lazily: nothing else in specdec needs it. The
tokenizer's vocabulary is read once per (tokenizer, V, stop ids) and cached; compiled grammars are cached by the
compiler. V is the width of the target's logits, which may exceed the tokenizer's size (padded embeddings):
ids past the tokenizer are never allowed.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from dataclasses import dataclass, field

from specdec.constrain.spec import Constraint

__all__ = ["Grammar", "compile_constraint", "grammar_engine_available", "MISSING_ENGINE", "DEFAULT_CACHE_MB"]

MISSING_ENGINE = "constrained decoding needs xgrammar: pip install 'specdec[grammar]'"
#: the compiled-grammar cache of each compiler, LRU-bounded (vLLM's VLLM_XGRAMMAR_CACHE_MB default)
DEFAULT_CACHE_MB = 512
_lock = threading.Lock()
_compilers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer → {(V, stops, MB): compiler}


def grammar_engine_available() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ImportError(MISSING_ENGINE) from None
    return xgrammar


@dataclass(frozen=True, eq=False)
class Grammar:
    """A constraint compiled for one tokenizer: what a request carries to the runner (`SamplingParams.constraint`,
    a `core.processors.ConstraintSpec`).

    vocab_size      V: the logits' width the masks are made for
    stop_token_ids  the tokens that end the text (the request's EOS ids): allowed exactly where the constraint
                    is complete, and then nothing else
    Equality is identity: two requests batch together only when they carry the same compiled grammar.
    """

    constraint: Constraint
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    compiled: object = field(repr=False)

    def matcher(self):
        """A fresh `xgrammar.GrammarMatcher` at the start of the text (one per row)."""
        xgr = _xgrammar()
        return xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(self.stop_token_ids))

    def start(self, vocab_size: int):
        """One row's state (`core.processors.ConstraintSpec`): a `GrammarState` at the start of the text, for a
        model whose logits have `vocab_size` ≥ V entries (ids past V are never allowed)."""
        if vocab_size < self.vocab_size:
            raise ValueError(f"grammar: compiled for {self.vocab_size} logits but the model has {vocab_size}: "
                             f"compile it with vocab_size={vocab_size}")
        from specdec.constrain.state import GrammarState

        return GrammarState(self)

    @property
    def bitmask_width(self) -> int:
        return (self.vocab_size + 31) // 32


def compile_constraint(constraint: Constraint, tokenizer, vocab_size: int, stop_token_ids, *,
                       cache_mb: float = DEFAULT_CACHE_MB) -> Grammar:
    """`constraint` as token masks for `tokenizer` (a transformers tokenizer, or the token texts by id) over
    V = `vocab_size` logits; the text ends with one of
    `stop_token_ids` (at least one: a constrained text must be able to end). Errors name the constraint.
    Compiles run concurrently (xgrammar releases the GIL; `compiles.GrammarCompiles` bounds and times them);
    `cache_mb` bounds the compiler's cache of compiled grammars (LRU; 0 = no cache)."""
    if not isinstance(constraint, Constraint):
        raise TypeError(f"constraint must be a specdec.constrain.Constraint, got {type(constraint).__name__}")
    stops = tuple(sorted({int(t) for t in stop_token_ids}))
    if not stops:
        raise ValueError(f"{constraint.kind}: constrained decoding needs an EOS token id (the text ends with it "
                         "once the constraint is complete); this request has none")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    bad = [t for t in stops if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"EOS token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    compiler = _compiler(tokenizer, vocab_size, stops, cache_mb)
    try:
        compiled = _compile(compiler, constraint)
    except (RuntimeError, ValueError) as err:  # xgrammar reports a bad schema / regex / grammar as RuntimeError
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[-1] if lines else type(err).__name__)  # xgrammar's
        message = re.sub(r"Check failed: .*? is false:? ?", "", message) or "rejected"  # its C++ assertion text
        raise ValueError(f"{constraint.kind}: cannot be compiled: {message}") from None
    return Grammar(constraint, vocab_size, stops, compiled)


def _compile(compiler, constraint: Constraint):
    kind = constraint.kind
    if kind == "json_schema":
        return compiler.compile_json_schema(constraint.source, any_whitespace=False, strict_mode=True)
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return compiler.compile_regex(constraint.source)
    if kind == "choice":
        ebnf = "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choices)
        return compiler.compile_grammar(ebnf)
    return compiler.compile_grammar(constraint.source)


def _compiler(tokenizer, vocab_size: int, stops: tuple[int, ...], cache_mb: float = DEFAULT_CACHE_MB):
    xgr = _xgrammar()
    key = (vocab_size, stops, cache_mb)
    with _lock:
        try:
            per_tokenizer = _compilers.setdefault(tokenizer, {})
        except TypeError:  # not weak-referenceable: not cached
            per_tokenizer = {}
        compiler = per_tokenizer.get(key)
        if compiler is None:
            if len(tokenizer) > vocab_size:
                raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's logits only "
                                 f"{vocab_size}: they do not belong together")
            if isinstance(tokenizer, (list, tuple)):  # token texts by id (a custom vocabulary; "" = special)
                info = xgr.TokenizerInfo(list(tokenizer), vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                         stop_token_ids=list(stops))
            else:
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                          stop_token_ids=list(stops))
            compiler = per_tokenizer[key] = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=cache_mb > 0,
                                                                cache_limit_bytes=int(cache_mb * (1 << 20)) or -1)
        return compiler
