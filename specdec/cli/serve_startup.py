"""`specdec serve`'s start-up, said on stderr: one line per phase as the library logs it (loading the target, the
drafter, the engine's KV cache and what it holds, the warm-up with a progress bar, ready), each with the seconds
since start-up began. Off with --quiet; the progress bar only on a terminal.

The library never prints: it logs (`specdec.loading`, `specdec.text`), and `StartupLog` is the handler that shows
those records while the server starts; `kv_cache_line` reads the built runners.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["StartupLog", "kv_cache_line", "warmup_line"]

#: the library loggers whose INFO records are start-up phases (their DEBUG progress records drive the bar)
PHASE_LOGGERS = ("specdec",)
PROGRESS_LOGGER = "specdec.text.warmup"


class StartupLog(logging.Handler):
    """Shows `specdec.*` INFO records as `specdec serve [12.3 s]: message` lines on `stream`; records with a
    `progress` = (done, total) attribute drive one tqdm bar (on a terminal; elsewhere they are not shown)."""

    def __init__(self, stream=None, quiet: bool = False):
        super().__init__(logging.DEBUG)
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.start = time.perf_counter()
        self._bar = None
        self._saved: list[tuple[logging.Logger, int]] = []

    def install(self) -> "StartupLog":
        for name in PHASE_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level))
            logger.addHandler(self)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
        progress = logging.getLogger(PROGRESS_LOGGER)
        self._saved.append((progress, progress.level))
        progress.setLevel(logging.DEBUG)
        return self

    def uninstall(self) -> None:
        self._close_bar()
        for logger, level in reversed(self._saved):
            logger.setLevel(level)
            if self in logger.handlers:
                logger.removeHandler(self)
        self._saved.clear()

    def say(self, message: str) -> None:
        """A phase line of the CLI's own."""
        if not self.quiet:
            self._close_bar()
            print(f"specdec serve [{time.perf_counter() - self.start:5.1f} s]: {message}", file=self.stream, flush=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            progress = getattr(record, "progress", None)
            if progress is not None:
                self._progress(*progress, record.getMessage())
            elif record.levelno >= logging.INFO:
                self.say(record.getMessage())
        except Exception:  # noqa: BLE001 - logging must never take the server down
            self.handleError(record)

    def _progress(self, done: int, total: int, what: str) -> None:
        if self.quiet or not getattr(self.stream, "isatty", lambda: False)():
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=what, file=self.stream, unit="shape", leave=False)
        self._bar.n = done
        self._bar.refresh()
        if done >= total:
            self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def kv_cache_line(runner) -> str:
    """What the runner's KV cache takes (`Engine.kv_cache_bytes`, by part: `Engine.memory`) and what it holds
    (sequences × positions, or the paged pool's blocks; layers × KV heads × head dims, dtype, device)."""
    from specdec.engine import Engine
    from specdec.engine.memory import format_bytes

    if not isinstance(runner, Engine):  # the eager transformers loop: transformers' cache, sized per batch
        return "KV cache: transformers' dynamic cache, allocated per batch as it runs (eager loop)"
    shape = runner.model.shape
    pool = runner.kv_pool
    holds = (f"{pool.allocator.num_usable_blocks} blocks of {pool.block_size} tokens = "
             f"{pool.allocator.num_usable_blocks * pool.block_size} tokens (paged, {_budget(runner.config)}; up to "
             f"{runner.max_batch} sequences × {runner.num_positions} positions)" if pool is not None else
             f"{runner.max_batch} sequences × {runner.num_positions} positions")
    return (f"KV cache: {format_bytes(runner.kv_cache_bytes)} ({runner.memory.describe()}) — {holds}, "
            f"target {shape.n_layers} layers × {shape.n_kv_heads} KV heads × {shape.head_dim} dims, "
            f"{str(runner.model.dtype).removeprefix('torch.')} on {runner.device}")


def _budget(config) -> str:
    """Where the paged pool's size came from (`EngineConfig.kv_cache_memory`)."""
    memory = config.kv_cache_memory
    if memory is None:
        return "the default budget: every slot's whole context, at most 0.9 of free GPU memory or 2 GiB on a CPU"
    if isinstance(memory, float):
        return f"--kv-cache-memory {memory:g} of the free memory"
    from specdec.engine.memory import format_bytes

    return f"--kv-cache-memory {format_bytes(memory)}"


def warmup_line(runner, warmups: dict) -> str | None:
    """The warm-up's line for a runner that did not capture (CUDA graphs are captured on CUDA only)."""
    if warmups:
        return None  # the library logged the capture
    from specdec.engine import Engine

    if not isinstance(runner, Engine):
        return "warm-up: none (the eager loop builds nothing ahead)"
    why = "paged KV cache: eager steps" if runner.kv_pool is not None else "CUDA graphs are captured on CUDA only"
    return f"warm-up: none needed on {runner.device.type} ({why})"
