"""Grammar compiles off the request path (issue 35, items 2, 3 and 6): `GrammarCompiles` runs compiles on its
own bounded pool with no lock between them (a trivial compile completes while a slow one is in flight), a compile
past its time limit is a `CompileTimeout` naming the limit (a queued one cancelled, a running one's late result
discarded and counted), and the compiled-grammar cache is bounded in MB. Orderings and counters are asserted,
never wall times."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("xgrammar")

from specdec.constrain import Constraint, compile_constraint  # noqa: E402
from specdec.constrain import compiles  # noqa: E402
from specdec.constrain.compiles import CompileTimeout, GrammarCompiles  # noqa: E402
from specdec.constrain.grammar import _compiler  # noqa: E402
from specdec.server.protocol import APIError  # noqa: E402
from specdec.server.structured import compile_on  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair" / "target"
EOS = (2,)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)
    compile_constraint(Constraint.choice(["warm"]), tok, len(tok), EOS)  # the vocabulary read once
    return tok


def slow_schema(k: int = 10, letter: str = "r") -> Constraint:
    """A schema whose compile takes about a second or more (the issue's pattern, ((r{50}){50}){20}, scaled)."""
    return Constraint.json_schema({"type": "object", "required": ["a"],
                                   "properties": {"a": {"type": "string", "pattern": f"(({letter}{{50}}){{50}}){{{k}}}"}}})


@pytest.fixture
def held_schemas(monkeypatch):
    """JSON-schema compiles that wait until the test sets the returned event, then compile: slow by construction.
    (A real slow schema's compile time depends on the host and on what xgrammar has seen: in one CI run it beat a
    0.2 s limit; the limit logic is tested without a race.)"""
    release = threading.Event()
    real = compiles.compile_constraint

    def held(constraint, *args, **kwargs):
        if constraint.kind == "json_schema":
            release.wait(120)
        return real(constraint, *args, **kwargs)

    monkeypatch.setattr(compiles, "compile_constraint", held)
    yield release
    release.set()


def test_a_trivial_compile_never_waits_on_a_slow_one(tokenizer):
    pool = GrammarCompiles(workers=2, timeout_s=600, cache_mb=0)
    slow = pool.submit(slow_schema(), tokenizer, len(tokenizer), EOS)
    while not slow.running():  # the slow compile holds a worker
        time.sleep(0.001)
    choice = pool.compile(Constraint.choice(["yes", "no"]), tokenizer, len(tokenizer), EOS)
    assert not slow.done()  # the choice finished while the slow schema was still compiling
    assert choice.constraint.kind == "choice" and slow.result().constraint.kind == "json_schema"
    pool.close()


def test_a_compile_past_its_limit_is_refused_then_cancelled_or_discarded(tokenizer, held_schemas):
    pool = GrammarCompiles(workers=1, timeout_s=0.2, cache_mb=0)
    with pytest.raises(CompileTimeout, match=r"^json_schema: the grammar did not compile within the 0.2 s limit"):
        pool.compile(slow_schema(letter="s"), tokenizer, len(tokenizer), EOS)  # running: runs on, result dropped
    with pytest.raises(CompileTimeout):  # queued behind it on the one worker: cancelled before it starts
        pool.compile(Constraint.choice(["yes"]), tokenizer, len(tokenizer), EOS)
    held_schemas.set()  # the running compile finishes now: its late result is discarded and counted
    deadline = time.monotonic() + 120
    while pool.stats()["late_results"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.stats() == {"compiled": 0, "failed": 0, "timeouts": 2, "cancelled": 1, "late_results": 1}
    pool.close()


def test_the_server_turns_a_timeout_into_a_400_naming_the_flag(tokenizer, held_schemas):
    llm = SimpleNamespace(tokenizer=tokenizer, vocab_size=len(tokenizer), defaults=SimpleNamespace(eos_token_ids=EOS))
    pool = GrammarCompiles(workers=2, timeout_s=0.1, cache_mb=0)
    with pytest.raises(APIError) as caught:
        asyncio.run(compile_on(pool, llm, "guided_json", slow_schema(letter="t"), None))
    assert caught.value.status == 400 and "0.1 s limit" in str(caught.value.body()) \
        and "--grammar-compile-timeout" in str(caught.value.body())
    held_schemas.set()
    grammar = asyncio.run(compile_on(GrammarCompiles(), llm, "guided_choice", Constraint.choice(["a", "b"]), None))
    assert grammar.constraint.choices == ("a", "b")  # the negative control: in time, compiled
    pool.close()


def test_the_compiled_grammar_cache_is_bounded_in_mb(tokenizer):
    schemas = [slow_schema(k=1, letter=c) for c in "abcdef"]  # ~0.7 MB each compiled
    sizes, largest = {}, 0
    for cache_mb in (2, 1024):  # bounded, and the negative control: a cache large enough to keep all six
        for schema in schemas:
            grammar = compile_constraint(schema, tokenizer, len(tokenizer), EOS, cache_mb=cache_mb)
            largest = max(largest, grammar.compiled.memory_size_bytes)
        sizes[cache_mb] = _compiler(tokenizer, len(tokenizer), EOS, cache_mb).get_cache_size_bytes()
    # xgrammar's LRU evicts once past the limit: it may overshoot by about the entry just added
    assert sizes[2] <= 2 * (1 << 20) + largest < sizes[1024]


def test_xgrammar_assertion_text_never_reaches_the_message(tokenizer):
    with pytest.raises(ValueError) as caught:  # checked before xgrammar sees it (spec.check_schema)
        compile_constraint(Constraint.json_schema({"type": "integer", "minimum": -1e30}), tokenizer, len(tokenizer), EOS)
    assert "Check failed" not in str(caught.value) and "json_schema.minimum" in str(caught.value)
