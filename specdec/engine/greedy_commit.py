"""The tail of an all-greedy verify pass in one launch: accept, commit, count and pack (`StepRunner`'s fast path).

After the target's forward, a greedy step runs `core.verify_greedy`, `step.commit_counts`, `sequences.write_tokens`,
the length and budget moves, `step.step_counters` (widened and added into the running sums) and `step.pack_step`:
some 70 small torch launches, each a few µs inside the graph, for a few hundred integers. `greedy_commit` does the
same in one Triton program over the step's rows (`kernel="triton"`, or "auto" on CUDA); `greedy_commit_reference`
is that torch sequence, the definition the kernel is tested against bit for bit (tables, tokens, lengths, budgets,
counters; tests/engine/test_greedy_commit.py).

It covers the steps whose rows are all greedy, exact (no leniency), without logits processors, log-probabilities,
synthetic acceptance or target features (`covers`); any other step takes the general body.

Inputs (B = the step's rows, γ its draft length, one integer per token):
  target_tokens [B, γ+1]   the target's argmax at each verified position
  drafts        [B, γ]     the draft; draft_lengths [B] (None = γ for every row)
  state                    the engine's `SlotState` (rows 0..B−1): tokens, lengths, generated, max_new, eos, active,
                           counters (updated in place), and `counter_sums` (the engine-wide running sum, in place)
  invalid                  a 0-dim bool: the target's scores were NaN / inf (packed into the table's last row)
→ the step's `pack_step` table `[B + 1, γ + 6]` (int64).
"""

from __future__ import annotations

import functools
import logging

import torch

from specdec.core import verify_greedy
from specdec.fast.kernels.select import next_power_of_2, use_triton
from specdec.sequences import write_tokens
from specdec.step import StepCounts, StepLayout, commit_counts, pack_step, step_counters

__all__ = ["greedy_commit", "greedy_commit_reference", "covers"]

logger = logging.getLogger(__name__)
_FAILED: list[str] = []  # "auto": the kernel failed to build here once (logged); the torch sequence runs instead


def covers(flavor, view, synthetic, features) -> bool:
    """Whether a step of this flavor can take `greedy_commit` (the module doc)."""
    return (flavor.all_greedy and not flavor.lenient and not flavor.logprobs and view.processors is None
            and view.history is None and synthetic is None and features is None)


def greedy_commit_reference(target_tokens, drafts, draft_lengths, state, rows: slice, lengths, counter_sums,
                            max_gamma: int, invalid) -> torch.Tensor:
    """The torch sequence (`StepRunner.verify_body`'s, for a greedy step): see the module doc."""
    gamma = drafts.shape[1]
    logits_stub = target_tokens.new_zeros(*target_tokens.shape, 1)  # (shape only: the argmax is given)
    result = verify_greedy(drafts, logits_stub, draft_lengths=draft_lengths, check_nan=False,
                           target_tokens=target_tokens)
    new_tokens = result.tokens(drafts)
    active, generated = state.active[rows], state.generated[rows]
    counts, hit_eos = commit_counts(new_tokens, result.num_accepted, state.max_new[rows] - generated, state.eos[rows],
                                    active)
    write_tokens(state.tokens[rows], lengths, new_tokens, counts)
    lengths.add_(counts)
    generated.add_(counts)
    finished = active & (hit_eos | (generated >= state.max_new[rows]))
    counters = step_counters(result.num_accepted, result.beta, draft_lengths, active, gamma)
    wide = StepCounts.widen(counters, gamma, max_gamma)
    state.counters[rows].add_(wide)
    counter_sums.add_(wide.sum(0))
    return pack_step(StepLayout(gamma), new_tokens, counts, result.num_accepted, draft_lengths, finished, hit_eos,
                     active, invalid)


def greedy_commit(target_tokens, drafts, draft_lengths, state, rows: slice, lengths, counter_sums, max_gamma: int,
                  invalid, *, kernel: str = "auto") -> torch.Tensor:
    """`greedy_commit_reference`'s function in one launch (kernel "auto": on CUDA; "triton": forced, also in
    Triton's interpreter; "reference"). `lengths` is `state.lengths[rows]` (moved in place)."""
    b, gamma = drafts.shape
    supported = b <= 1024 and gamma <= 64 and not (kernel == "auto" and _FAILED)
    if not use_triton(kernel, target_tokens.device, supported, "greedy_commit"):
        return greedy_commit_reference(target_tokens, drafts, draft_lengths, state, rows, lengths, counter_sums,
                                       max_gamma, invalid)
    if kernel == "auto" and not (target_tokens.is_cuda and torch.cuda.is_current_stream_capturing()):
        try:  # (the first call compiles, in a warm-up before any capture: a build failure falls back, once, loudly)
            return _launch(target_tokens, drafts, draft_lengths, state, rows, lengths, counter_sums, max_gamma,
                           invalid)
        except Exception as err:  # noqa: BLE001 - a Triton/driver build error; the state is untouched before launch
            _FAILED.append(f"{type(err).__name__}: {err}")
            logger.warning("greedy_commit: the Triton kernel failed (%s); the torch sequence runs instead", _FAILED[0])
            return greedy_commit_reference(target_tokens, drafts, draft_lengths, state, rows, lengths, counter_sums,
                                           max_gamma, invalid)
    return _launch(target_tokens, drafts, draft_lengths, state, rows, lengths, counter_sums, max_gamma, invalid)


def _launch(target_tokens, drafts, draft_lengths, state, rows, lengths, counter_sums, max_gamma, invalid):
    b, gamma = drafts.shape
    k = gamma + 1
    table = torch.empty(b + 1, k + 5, dtype=torch.long, device=target_tokens.device)
    tokens, counters = state.tokens[rows], state.counters[rows]
    width = StepCounts.width(max_gamma)
    _kernel()[(1,)](
        target_tokens.contiguous(), drafts.contiguous() if gamma else target_tokens,
        draft_lengths if draft_lengths is not None else target_tokens, tokens, tokens.stride(0), tokens.shape[1] - 1,
        lengths, state.generated[rows], state.max_new[rows], state.eos[rows], state.eos.stride(0),
        state.active[rows].view(torch.uint8), counters, counters.stride(0), counter_sums, table,
        invalid.reshape(1).view(torch.uint8), b,
        GAMMA=gamma, MAX_GAMMA=max_gamma, NUM_EOS=state.eos.shape[1], HAS_LENGTHS=draft_lengths is not None,
        WIDTH=width, BLOCK_B=max(2, next_power_of_2(b)), BLOCK_K=max(2, next_power_of_2(k + 5)),
        BLOCK_W=max(2, next_power_of_2(width)), num_warps=4)
    return table


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def greedy_commit_kernel(t_ptr, d_ptr, dl_ptr, tok_ptr, tok_stride, last_col, len_ptr, gen_ptr, max_ptr, eos_ptr,
                             eos_stride, act_ptr, cnt_ptr, cnt_stride, sums_ptr, table_ptr, invalid_ptr, B,
                             GAMMA: tl.constexpr, MAX_GAMMA: tl.constexpr, NUM_EOS: tl.constexpr,
                             HAS_LENGTHS: tl.constexpr, WIDTH: tl.constexpr, BLOCK_B: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr):
        K: tl.constexpr = GAMMA + 1
        rows = tl.arange(0, BLOCK_B)
        rmask = rows < B
        rows64 = rows.to(tl.int64)
        col = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
        r2 = rows64[:, None]
        m2 = rmask[:, None]
        # verify: the drafts accepted while they equal the target's argmax (positions < the row's draft length)
        t = tl.load(t_ptr + r2 * K + col, mask=m2 & (col < K), other=0)
        d = tl.load(d_ptr + r2 * GAMMA + col, mask=m2 & (col < GAMMA), other=0)
        if HAS_LENGTHS:
            dl = tl.load(dl_ptr + rows64, mask=rmask, other=0)
        else:
            dl = tl.full((BLOCK_B,), GAMMA, tl.int64)
        drafted = (col < GAMMA) & (col < dl[:, None])
        match = (t == d) & drafted
        n = tl.min(tl.where((col < GAMMA) & ~match, col, GAMMA), axis=1).to(tl.int64)  # [B] accepted
        at_n = col == n[:, None]
        next_token = tl.sum(tl.where(at_n, t, 0), axis=1)
        new = tl.where(at_n, next_token[:, None], tl.where(col < GAMMA, d, 0))  # [B, K]: drafts, next, 0
        # commit: budget, then a cut after the first EOS among the committed tokens
        active = tl.load(act_ptr + rows64, mask=rmask, other=0) != 0
        a = active.to(tl.int64)
        gen = tl.load(gen_ptr + rows64, mask=rmask, other=0)
        budget = tl.load(max_ptr + rows64, mask=rmask, other=0)
        start = tl.load(len_ptr + rows64, mask=rmask, other=0)
        counts = tl.minimum(n + 1, budget - gen) * a
        is_eos = tl.zeros((BLOCK_B, BLOCK_K), dtype=tl.int1)
        for e in tl.static_range(NUM_EOS):
            eos = tl.load(eos_ptr + rows64 * eos_stride + e, mask=rmask, other=-1)
            is_eos = is_eos | (new == eos[:, None])
        is_eos = is_eos & (col < K) & (col < counts[:, None])
        hit = tl.max(is_eos.to(tl.int32), axis=1) > 0
        first_eos = tl.min(tl.where(is_eos, col, BLOCK_K), axis=1).to(tl.int64)
        counts = tl.where(hit, first_eos + 1, counts)
        write = m2 & (col < counts[:, None])
        tl.store(tok_ptr + r2 * tok_stride + tl.minimum(start[:, None] + col, last_col), new, mask=write)
        tl.store(len_ptr + rows64, start + counts, mask=rmask)
        gen = gen + counts
        tl.store(gen_ptr + rows64, gen, mask=rmask)
        finished = active & (hit | (gen >= budget))
        # counters (`step_counters`, widened to MAX_GAMMA) added into the row's and the engine's running sums
        n_a = n * a
        length_a = dl * a
        reached = (col < length_a[:, None]) & (col <= n_a[:, None]) & (col < GAMMA)
        beta_sum = tl.sum(tl.where(reached & match, 1.0, 0.0).to(tl.float64), axis=1)
        w = tl.arange(0, BLOCK_W)[None, :]
        wide = tl.where(w < GAMMA, ((w < length_a[:, None]) & (w <= n_a[:, None])).to(tl.float64), 0.0)
        acc_col = w - MAX_GAMMA
        wide = tl.where((acc_col >= 0) & (acc_col < GAMMA), (acc_col < n_a[:, None]).to(tl.float64), wide)
        s = w - 2 * MAX_GAMMA
        wide = tl.where(s == 0, beta_sum[:, None], wide)
        wide = tl.where(s == 1, n_a[:, None].to(tl.float64), wide)
        wide = tl.where(s == 2, length_a[:, None].to(tl.float64), wide)
        wide = tl.where(s == 3, (length_a > 0)[:, None].to(tl.float64), wide)
        wide = tl.where(s == 4, a[:, None].to(tl.float64), wide)
        wmask = m2 & (w < WIDTH)
        wide = tl.where(wmask, wide, 0.0)
        cnt = cnt_ptr + r2 * cnt_stride + w
        tl.store(cnt, tl.load(cnt, mask=wmask, other=0.0) + wide, mask=wmask)
        sums = sums_ptr + tl.arange(0, BLOCK_W)
        smask = tl.arange(0, BLOCK_W) < WIDTH
        tl.store(sums, tl.load(sums, mask=smask, other=0.0) + tl.sum(wide, axis=0), mask=smask)
        # the table (`pack_step`): tokens | committed | accepted | drafted | finished | hit_eos; then the sums row
        row = tl.where(col < K, new, 0)
        row = tl.where(col == K, counts[:, None], row)
        row = tl.where(col == K + 1, n_a[:, None], row)
        row = tl.where(col == K + 2, length_a[:, None], row)
        row = tl.where(col == K + 3, finished[:, None].to(tl.int64), row)
        row = tl.where(col == K + 4, hit[:, None].to(tl.int64), row)
        tl.store(table_ptr + r2 * (K + 5) + col, row, mask=m2 & (col < K + 5))
        invalid = tl.load(invalid_ptr).to(tl.int64)
        c1 = tl.arange(0, BLOCK_K)
        produced = tl.sum(tl.where(rmask, n_a + a, 0), axis=0)
        committed = tl.sum(tl.where(rmask, counts, 0), axis=0)
        done = tl.sum(tl.where(rmask, finished.to(tl.int64), 0), axis=0)
        tail = tl.where(c1 == 0, invalid, tl.where(c1 == 1, produced, tl.where(c1 == 2, committed,
                                                                                 tl.where(c1 == 3, done, 0))))
        tl.store(table_ptr + B * (K + 5) + c1, tail, mask=c1 < K + 5)

    return greedy_commit_kernel
