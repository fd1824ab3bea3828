"""Grammar compilation off the request path: `GrammarCompiles`, a bounded pool of compile workers with a time
limit per compile and a bounded cache.

A JSON schema can take seconds to compile (a pattern such as `((r{50}){50}){20}`: ~3.5 s and 13 MB on the demo
tokenizer), and before this pool one lock serialized every compile, so two such requests held every
constrained request behind them (a trivial `guided_choice` waited 12.9 s instead of 0.31 s). Here:

  workers     compiles run on their own threads (xgrammar releases the GIL while compiling), at most `workers`
              at once; nothing else (tokenization, the event loop, the model's driver) waits on them, and a
              compile waits only for a free worker, never on another request's compile
  timeout_s   a compile not finished this long after it was asked for (queueing included) fails its request
              with `CompileTimeout`; xgrammar cannot stop a compile that has started, so a queued one is
              cancelled and a running one runs on: its late result is discarded and counted (`late_results`)
              — it does land in the cache, so the same schema asked again later is a cache hit
  cache_mb    xgrammar's own compiled-grammar cache, per (tokenizer, V, stop ids), LRU-bounded to this size
              (`GrammarCompiler(cache_limit_bytes=)`); before, unbounded: +22 MB per 100 requests when one in
              five brought a new schema
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from specdec.constrain.grammar import DEFAULT_CACHE_MB, Grammar, compile_constraint
from specdec.constrain.spec import Constraint

logger = logging.getLogger(__name__)

__all__ = ["GrammarCompiles", "CompileTimeout", "DEFAULT_WORKERS", "DEFAULT_TIMEOUT_S", "MAX_WORKERS"]

DEFAULT_WORKERS = 4
DEFAULT_TIMEOUT_S = 30.0
MAX_WORKERS = 64


class CompileTimeout(ValueError):
    """A grammar did not compile within the pool's time limit (names the limit)."""


class GrammarCompiles:
    """A bounded pool compiling `Constraint`s for one server (see the module doc). Thread-safe."""

    def __init__(self, *, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 cache_mb: float = DEFAULT_CACHE_MB):
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"grammar compile workers must be an integer in [1, {MAX_WORKERS}], got {workers!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                math.isfinite(timeout_s) and 0 < timeout_s <= 3600):
            raise ValueError(f"grammar compile timeout must be a number of seconds in (0, 3600], got {timeout_s!r}")
        if isinstance(cache_mb, bool) or not isinstance(cache_mb, (int, float)) or not (
                math.isfinite(cache_mb) and 0 <= cache_mb <= 1 << 20):
            raise ValueError(f"grammar cache size must be a number of MB in [0, {1 << 20}], got {cache_mb!r}")
        self.workers, self.timeout_s, self.cache_mb = workers, float(timeout_s), cache_mb
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specdec-grammar")
        self._lock = threading.Lock()
        self.compiled = self.timeouts = self.cancelled = self.late_results = self.failed = 0

    def submit(self, constraint: Constraint, tokenizer, vocab_size: int, stop_token_ids) -> Future:
        """A future of the `Grammar` (or of the compile's ValueError / ImportError); returns at once."""
        return self._pool.submit(compile_constraint, constraint, tokenizer, vocab_size, stop_token_ids,
                                 cache_mb=self.cache_mb)

    def compile(self, constraint: Constraint, tokenizer, vocab_size: int, stop_token_ids) -> Grammar:
        """The `Grammar`, waiting at most `timeout_s` (a blocking call, for threads)."""
        future = self.submit(constraint, tokenizer, vocab_size, stop_token_ids)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(self.timeout_s):
            self._gave_up(future, constraint)
        return self._result(future)

    async def compile_async(self, constraint: Constraint, tokenizer, vocab_size: int, stop_token_ids) -> Grammar:
        """The `Grammar`, awaited on the event loop for at most `timeout_s`."""
        loop, done = asyncio.get_running_loop(), asyncio.Event()

        def wake(_) -> None:  # (a worker thread)
            try:
                loop.call_soon_threadsafe(done.set)
            except RuntimeError:  # the loop closed meanwhile: nobody is waiting
                pass

        future = self.submit(constraint, tokenizer, vocab_size, stop_token_ids)
        future.add_done_callback(wake)
        try:
            await asyncio.wait_for(done.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            self._gave_up(future, constraint)
        return self._result(future)

    def _result(self, future: Future) -> Grammar:
        try:
            grammar = future.result()
        except Exception:
            with self._lock:
                self.failed += 1
            raise
        with self._lock:
            self.compiled += 1
        return grammar

    def _gave_up(self, future: Future, constraint: Constraint) -> None:
        cancelled = future.cancel()  # only a compile still queued can be stopped (xgrammar has no cancel)
        with self._lock:
            self.timeouts += 1
            self.cancelled += cancelled
        if not cancelled:
            future.add_done_callback(self._discard)
        raise CompileTimeout(f"{constraint.kind}: the grammar did not compile within the {self.timeout_s:g} s "
                             "limit for a compile")

    def _discard(self, future: Future) -> None:
        """A compile that finished after its request gave up: its result is dropped and counted."""
        with self._lock:
            self.late_results += 1
        logger.info("a grammar compile finished after its request's time limit; result discarded")

    def stats(self) -> dict:
        """Counters: compiled, failed, timeouts, cancelled (queued when they timed out), late_results."""
        with self._lock:
            return {"compiled": self.compiled, "failed": self.failed, "timeouts": self.timeouts,
                    "cancelled": self.cancelled, "late_results": self.late_results}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
