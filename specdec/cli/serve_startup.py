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


def kv_cache_line(gamma, runner) -> str:
    """What one runner's KV cache takes and holds (the engine's slot caches: target, and a drafter's own)."""
    name = "plain decoding" if gamma == 0 else f"num_draft_tokens={gamma}"
    cache = getattr(runner, "cache", None)
    if cache is None:  # the eager transformers loop: transformers' cache, sized by each batch as it runs
        return f"KV cache ({name}): transformers' dynamic cache, allocated per batch as it runs (eager loop)"
    total = getattr(runner, "kv_cache_bytes", None)  # (the paged pool's property, where the engine has one)
    parts = [f"target {_gib(cache.nbytes)}"]
    drafter_cache = getattr(getattr(runner, "drafter", None), "cache", None) if getattr(runner, "drafter_cached",
                                                                                       False) else None
    if drafter_cache is not None:
        parts.append(f"drafter {_gib(drafter_cache.nbytes)}")
    if total is None:
        total = cache.nbytes + (drafter_cache.nbytes if drafter_cache is not None else 0)
    keys = cache.keys
    layers, _, heads, _, dim = keys.shape
    return (f"KV cache ({name}): {_gib(total)} ({', '.join(parts)}) — {runner.max_batch} sequences × "
            f"{cache.num_positions} positions, {layers} layers × {heads} KV heads × {dim} dims, "
            f"{str(keys.dtype).removeprefix('torch.')} on {keys.device}")


def warmup_line(gamma, runner, warmups: dict) -> str | None:
    """The warm-up's line for a runner that did not capture (CUDA graphs are captured on CUDA only)."""
    if gamma in warmups:
        return None  # the library logged the capture
    name = "plain decoding" if gamma == 0 else f"num_draft_tokens={gamma}"
    if getattr(runner, "cache", None) is None:
        return f"warm-up ({name}): none (the eager loop builds nothing ahead)"
    return f"warm-up ({name}): none needed on {runner.cache.keys.device.type} (CUDA graphs are captured on CUDA only)"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**27 else f"{nbytes / 2**20:.1f} MiB"
