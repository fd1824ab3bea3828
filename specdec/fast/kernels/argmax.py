"""The greedy token of each row of scores, and whether the scores can be trusted, in two short launches.

    tokens, invalid = greedy_tokens(logits)       # logits [..., V] → tokens [...] int64, invalid: a 0-dim bool

tokens is `torch.argmax(logits, -1)` exactly: the first index of the maximum, a NaN counting as the maximum (the
first NaN wins), as torch's. invalid is `core.invalid_scores(logits)`: True when the scores hold a NaN or a +inf,
or a row of only -inf — i.e. when some row's maximum is not finite.

Why a kernel: torch reduces one long row (decode at batch 1: one row of 128k logits for the 8B vocabulary) in one
launch of its generic reduction, 27.6 µs on an H200 (BENCHMARKS.md, "Where plain decoding's bandwidth goes"), and
the NaN / inf check is three more passes with three reductions. Here stage 1 gives each `BLOCK`-wide chunk of a
row to its own program (the chunk's finite-or-inf maximum, the first index of it, the first NaN's index), stage 2
reduces a row's chunks in index order (a NaN first; else the largest maximum, the smallest index among chunks
that hold it) and flags the row when its maximum is not finite. Comparisons are exact (bf16 / fp16 scores are
widened to fp32, which keeps every value), so the result is torch's bit for bit, ties included.
"""

from __future__ import annotations

import functools
import logging

import torch

from specdec.fast.kernels.select import next_power_of_2, use_triton

__all__ = ["greedy_tokens", "greedy_tokens_reference", "argmax"]

logger = logging.getLogger(__name__)
_FAILED: list[str] = []  # "auto": the kernels failed to build here once (logged); torch runs instead
BLOCK = 4096  # logits per stage-1 program
_BIG = 2**31 - 1  # "no index" (vocabularies are far smaller)


def greedy_tokens_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager definition: `logits.argmax(-1)`, and whether some row's maximum is not finite (NaN, +inf, or
    every entry -inf: `core.invalid_scores`'s rule, from one reduction)."""
    return logits.argmax(-1), ~torch.isfinite(logits.amax(-1)).all()


def greedy_tokens(logits: torch.Tensor, *, kernel: str = "auto",
                  check: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`greedy_tokens_reference`'s function (the module doc). kernel: "auto" (the Triton kernels on CUDA for
    fp32 / bf16 / fp16 scores with a contiguous vocabulary axis), "triton" (forced; also in Triton's interpreter),
    "reference". check=False: no validity check (None in its place). No host synchronization: capturable in a
    CUDA graph once warm."""
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError("logits must be a tensor [..., V] with V >= 1")
    supported = (logits.dtype in (torch.float32, torch.bfloat16, torch.float16) and logits.stride(-1) == 1
                 and logits.numel() > 0 and logits.shape[-1] < _BIG)
    if not use_triton(kernel, logits.device, supported and not (kernel == "auto" and _FAILED), "greedy_tokens"):
        return greedy_tokens_reference(logits) if check else (logits.argmax(-1), None)
    if kernel == "auto" and not (logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        try:  # (the first call compiles, in a warm-up before any capture: a build failure falls back, once, loudly)
            return _launch(logits, check)
        except Exception as err:  # noqa: BLE001 - a Triton/driver build error
            _FAILED.append(f"{type(err).__name__}: {err}")
            logger.warning("greedy_tokens: the Triton kernels failed (%s); torch.argmax runs instead", _FAILED[0])
            return greedy_tokens_reference(logits) if check else (logits.argmax(-1), None)
    return _launch(logits, check)


def argmax(logits: torch.Tensor, *, kernel: str = "auto") -> torch.Tensor:
    """`greedy_tokens`' tokens alone (`torch.argmax(logits, -1)` exactly; no validity check): a greedy drafter's
    draw, one per drafted token — with a 128k vocabulary torch's one-block reduction is ~27 µs of each."""
    return greedy_tokens(logits, kernel=kernel, check=False)[0]


def _launch(logits: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)  # (rows keep their stride; the vocabulary axis stays contiguous)
    n = rows.shape[0]
    chunks = -(-vocab // BLOCK)
    values = torch.empty(n, chunks, device=logits.device, dtype=torch.float32)
    index = torch.empty(n, chunks, device=logits.device, dtype=torch.int32)
    nan_index = torch.empty(n, chunks, device=logits.device, dtype=torch.int32)
    tokens = torch.empty(n, device=logits.device, dtype=torch.long)
    bad = torch.empty(n, device=logits.device, dtype=torch.int8)
    stage1, stage2 = _kernels()
    stage1[(n, chunks)](rows, values, index, nan_index, vocab, rows.stride(0), chunks, BLOCK=BLOCK, num_warps=4)
    stage2[(n,)](values, index, nan_index, tokens, bad, chunks, CHUNKS_BLOCK=next_power_of_2(chunks), num_warps=1)
    return tokens.view(logits.shape[:-1]), (bad.any() if check else None)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def argmax_chunks(x_ptr, values_ptr, index_ptr, nan_ptr, vocab, stride_row, chunks, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < vocab
        x = tl.load(x_ptr + row * stride_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        is_nan = (x != x) & mask
        nan_first = tl.min(tl.where(is_nan, offs, 2147483647), axis=0)
        top = tl.max(tl.where(is_nan, float("-inf"), x), axis=0)
        first = tl.min(tl.where((x == top) & mask, offs, 2147483647), axis=0)
        out = row * chunks + chunk
        tl.store(values_ptr + out, top)
        tl.store(index_ptr + out, first)
        tl.store(nan_ptr + out, nan_first)

    @triton.jit
    def argmax_rows(values_ptr, index_ptr, nan_ptr, tokens_ptr, bad_ptr, chunks, CHUNKS_BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, CHUNKS_BLOCK)
        mask = c < chunks
        top = tl.load(values_ptr + row * chunks + c, mask=mask, other=float("-inf"))
        first = tl.load(index_ptr + row * chunks + c, mask=mask, other=2147483647)
        nan_first = tl.min(tl.load(nan_ptr + row * chunks + c, mask=mask, other=2147483647), axis=0)
        best = tl.max(top, axis=0)
        token = tl.min(tl.where((top == best) & mask, first, 2147483647), axis=0)
        has_nan = nan_first < 2147483647
        token = tl.where(has_nan, nan_first, token)
        bad = has_nan | (best == float("inf")) | (best == float("-inf"))
        tl.store(tokens_ptr + row, token.to(tl.int64))
        tl.store(bad_ptr + row, bad.to(tl.int8))

    return argmax_chunks, argmax_rows
