"""`specdec.check`: the law tests on the user's own target, drafter, sampling parameters and runner.

1. Prompts: among the prefixes (≤ `max_prompt_tokens` tokens) of the given prompts, the `num_prompts` where a
   verification bug would show most (largest chi-square noncentrality of the `resample_from_p` control — the
   `cooler` one where q is unknown — per trial and per token of work, at the first position) — chosen from the
   models' laws, never from samples.
2. Trials: `trials` seeded requests of `positions` new tokens each, spread over the prompts, run through the
   runner (`specdec.generate(engine=...)`) in memory-bounded batches, EOS off.
3. Laws: the exact target law of tokens 1..K from plain forward passes (`laws.build_tree`), and deliberately
   wrong laws (q itself, the "resample from p after a rejection" bug, and p at 0.8× the temperature).
4. Per position: chi-square of the trials against the target law (must not reject at `level`), and against
   the q-based wrong laws (or, where q is unknown, the generic one), which must reject at `level`: otherwise the
   test lacks power on this pair and the result says "underpowered", never "pass".
5. Greedy: plain decoding vs speculative decoding on the full prompts, token for token (must be identical).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.core import SamplingConfig
from specdec.exactness.laws import (
    CELL_MIN_EXPECTED,
    LAWS,
    bug_law,
    build_tree,
    cooler_law,
    drafter_laws,
    model_laws,
    position_cells,
)
from specdec.exactness.limits import (
    DEFAULT_POSITIONS,
    DEFAULT_TRIALS,
    ENGINES,
    MAX_GREEDY_TOKENS,
    MAX_POSITIONS,
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    MAX_TRIALS,
)
from specdec.exactness.result import CheckResult, CheckTimings, GreedyDifference, GreedyResult, PositionResult
from specdec.exactness.stats import chi_square
from specdec.request import vocab_size

__all__ = ["check", "CheckResult", "PositionResult", "GreedyResult", "GreedyDifference", "CheckTimings", "TIE_ULPS"]

logger = logging.getLogger(__name__)

#: logits elements a trial batch may hold at once (rows × (prompt + γ + 1) × V: the transformers loop's prefill
#: computes logits at every prompt position), bounds memory (64 MiB of fp32 logits)
_BATCH_ELEMENTS = 1 << 24
#: rows per `specdec.generate` call on the engine: its slots (more queue; the peak memory of one call grew with its
#: rows, 1.3 GB at 64 rows and 3.2 GB at 340 for the demo pair on a CPU)
_ENGINE_ROWS = 64


def _validate(trials, positions, num_prompts, max_prompt_tokens, greedy_tokens, level, seed, engine,
              num_draft_tokens, prompts):
    from specdec.request import as_int, check_num_draft_tokens

    trials = as_int(trials, "trials", minimum=1, maximum=MAX_TRIALS)
    positions = as_int(positions, "positions", minimum=2, maximum=MAX_POSITIONS)  # 1 token: nothing is drafted
    num_prompts = as_int(num_prompts, "num_prompts", minimum=1, maximum=MAX_PROMPTS)
    max_prompt_tokens = as_int(max_prompt_tokens, "max_prompt_tokens", minimum=1, maximum=MAX_PROMPT_TOKENS)
    greedy_tokens = as_int(greedy_tokens, "greedy_tokens", minimum=0, maximum=MAX_GREEDY_TOKENS)
    seed = as_int(seed, "seed", minimum=0, maximum=(1 << 63) - 1)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 0.5:
        raise ValueError(f"level must be a number in (0, 0.5), got {level!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not isinstance(num_draft_tokens, str):
        num_draft_tokens = check_num_draft_tokens(num_draft_tokens)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts, got {len(prompts)}")
    clean = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence) or not prompt:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids")
        if len(prompt) > MAX_PROMPT_TOKENS:
            raise ValueError(f"prompts[{i}] has {len(prompt)} tokens; at most {MAX_PROMPT_TOKENS}")
        clean.append([as_int(t, f"prompts[{i}] token", minimum=0) for t in prompt])
    return trials, positions, num_prompts, max_prompt_tokens, greedy_tokens, float(level), seed, num_draft_tokens, clean


def _check_models(target, drafter) -> int:
    config = getattr(target, "config", None)
    if not isinstance(target, torch.nn.Module) or config is None or not hasattr(target, "get_output_embeddings"):
        raise TypeError(f"target must be a transformers causal LM, got {type(target).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("specdec.check covers decoder-only targets; encoder-decoder models are not supported yet")
    if drafter is None:
        raise ValueError("specdec.check needs a drafter (the law it tests is speculative decoding's)")
    return vocab_size(target)


def _power_per_trial(p: torch.Tensor, wrong: torch.Tensor, trials: float) -> torch.Tensor:
    """Noncentrality per trial of a chi-square test of `wrong` against `p` with `trials` samples
    (cells pooled as the test pools them). p, wrong: [N, V] → [N]."""
    own = p * trials >= CELL_MIN_EXPECTED
    diff = wrong - p
    spread = torch.where(own, diff.square() / p.clamp_min(1e-300), torch.zeros_like(p)).sum(-1)
    rest_p = torch.where(own, torch.zeros_like(p), p).sum(-1)
    rest_diff = torch.where(own, torch.zeros_like(p), diff).sum(-1)
    return spread + torch.where(rest_p > 0, rest_diff.square() / rest_p.clamp_min(1e-300), torch.zeros_like(rest_p))


def _select_prompts(target, drafter, vocab, prompts, num_prompts, max_prompt_tokens, positions, gamma, sampling,
                    trials, seed) -> list[list[int]]:
    """The `num_prompts` most telling prefixes of `prompts` (at most one per prompt while prompts last)."""
    candidates = []
    for i, prompt in enumerate(prompts):
        top = min(len(prompt), max_prompt_tokens)
        candidates += [(i, prompt[:n]) for n in range(min(2, top), top + 1)]
    if len(candidates) <= num_prompts and len(prompts) >= len(candidates):
        return [c for _, c in candidates]
    contexts = [c for _, c in candidates]
    p = model_laws(target, contexts, sampling)
    q = drafter_laws(drafter, vocab, contexts, sampling, seed)
    per_prompt = trials / num_prompts
    if q is not None:
        q = torch.where(torch.isnan(q).any(-1, keepdim=True), p, q)
        power = _power_per_trial(p, bug_law(p, q), per_prompt)
    else:  # no q: the generic control's power
        power = _power_per_trial(p, cooler_law(p), per_prompt)
    work = torch.tensor([len(c) + positions + (gamma if isinstance(gamma, int) else 4) for c in contexts],
                        dtype=torch.float64)
    order = torch.argsort(power / work, descending=True, stable=True).tolist()
    chosen, used = [], set()
    for rank in order:  # first the best prefix of each prompt, then the best of what is left
        if candidates[rank][0] not in used and len(chosen) < num_prompts:
            chosen.append(rank)
            used.add(candidates[rank][0])
    for rank in order:
        if rank not in chosen and len(chosen) < num_prompts:
            chosen.append(rank)
    return [contexts[r] for r in chosen]


def _chunk_seed(seed: int, chunk: int) -> int:
    return (seed * 1_000_003 + chunk * 0x9E3779B97F4A7C15) % (1 << 62)


def _run_trials(target, drafter, prompts, rows, positions, sampling, gamma, engine, seed, vocab, progress=None):
    """Generated tokens per prompt: samples[i] = list of `positions`-token lists."""
    import specdec

    width = max(len(p) for p in prompts) + (gamma if isinstance(gamma, int) else 8) + 1
    per_batch = max(1, min(4096, _BATCH_ELEMENTS // (width * vocab)))
    if engine != "hf":  # the engine runs 64 slots at once; a call's peak memory grows with its rows (measured)
        per_batch = min(per_batch, _ENGINE_ROWS)
    samples: list[list[list[int]]] = [[] for _ in prompts]
    for chunk, start in enumerate(range(0, len(rows), per_batch)):
        batch = rows[start:start + per_batch]
        result = specdec.generate(target, [prompts[i] for i in batch], drafter=drafter, max_new_tokens=positions,
                                  temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                  num_draft_tokens=gamma, eos_token_id=[], seed=_chunk_seed(seed, chunk),
                                  engine=engine)
        for i, tokens in zip(batch, result.sequences):
            if len(tokens) != positions:
                raise RuntimeError(f"the runner returned {len(tokens)} tokens for a request of {positions} "
                                   "with EOS off")
            samples[i].append(list(tokens))
        if progress is not None:
            progress("trials", start + len(batch), len(rows))
    return samples


#: a greedy difference in a non-fp32 model is a tie when the top-2 margin is within this many ulps of the top logit
TIE_ULPS = 2.0


@torch.inference_mode()
def _margin(target, context: list[int]) -> tuple[float, float]:
    """(top-2 logit margin, the top logit's magnitude) after `context`, from one plain forward pass."""
    ids = torch.tensor([context], dtype=torch.long, device=next(target.parameters()).device)
    top2 = target(input_ids=ids).logits[0, -1].float().topk(2).values
    return float(top2[0] - top2[1]), float(top2[0].abs())


def _greedy(target, drafter, prompts, new_tokens, gamma, engine, progress=None) -> GreedyResult:
    import specdec

    common = dict(max_new_tokens=new_tokens, temperature=0.0, eos_token_id=[], engine=engine, seed=0)
    plain = specdec.generate(target, prompts, drafter=None, **common).sequences
    if progress is not None:
        progress("greedy", 1, 2)
    spec = specdec.generate(target, prompts, drafter=drafter, num_draft_tokens=gamma, **common).sequences
    if progress is not None:
        progress("greedy", 2, 2)
    identical = sum(a == b for a, b in zip(plain, spec))
    dtype = next(target.parameters()).dtype
    strict = dtype in (torch.float32, torch.float64)
    differences = []
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a == b:
            continue
        j = next(k for k in range(max(len(a), len(b))) if k >= min(len(a), len(b)) or a[k] != b[k])
        margin, scale = _margin(target, list(prompts[i]) + list(a[:j]))
        tie = not strict and j < min(len(a), len(b)) and margin <= TIE_ULPS * torch.finfo(dtype).eps * scale
        differences.append(GreedyDifference(i, j + 1, a[j] if j < len(a) else None, b[j] if j < len(b) else None,
                                            margin, bool(tie)))
    return GreedyResult(len(prompts), new_tokens, identical, tuple(differences), None if strict else TIE_ULPS)


@dataclass(frozen=True)
class _LawRun:
    prompts: list
    trials_per_prompt: list
    positions: tuple
    power: bool | None
    reasons: tuple
    select_s: float
    trials_s: float
    laws_s: float


def _law_tests(target, drafter, vocab, prompts, sampling, gamma, engine, trials, positions, num_prompts,
               max_prompt_tokens, level, seed, progress=None) -> _LawRun:
    """Prompts, trials through the runner, the exact laws, and the chi-square tests of every position."""
    t0 = time.perf_counter()
    law_prompts = _select_prompts(target, drafter, vocab, prompts, num_prompts, max_prompt_tokens, positions, gamma,
                                  sampling, trials, seed)
    rows = [r % len(law_prompts) for r in range(trials)]
    per_prompt = [rows.count(i) for i in range(len(law_prompts))]
    t1 = time.perf_counter()
    samples = _run_trials(target, drafter, law_prompts, rows, positions, sampling, gamma, engine, seed, vocab,
                          progress)
    t2 = time.perf_counter()
    tree = build_tree(target, drafter, law_prompts, per_prompt, positions, sampling, seed)
    results = []
    for depth in range(positions):
        observed, expected, groups = position_cells(tree, depth, samples, per_prompt)
        law, wrong_q, wrong_rule, cooler = (chi_square(observed, expected[k], groups, CELL_MIN_EXPECTED)
                                            for k in range(len(LAWS)))
        results.append(PositionResult(depth + 1, law, wrong_q if tree.controls else None,
                                      wrong_rule if tree.controls else None, cooler))
    t3 = time.perf_counter()
    reasons = []
    for r in results:
        if r.law.rejects(level):
            why = f"{r.law.impossible} impossible tokens" if r.law.impossible else f"p = {r.law.p_value:.3g}"
            reasons.append(f"position {r.position}: the trials do not follow the target's law ({why} < {level:g})")
    if tree.controls:
        weak = [r.position for r in results if not (r.drafter.rejects(level) and r.resample_from_p.rejects(level))]
    else:  # q unknown (a feature head drafts from the target's features inside the engine): the generic control
        weak = [r.position for r in results if not r.cooler.rejects(level)]
        reasons.append("the drafter's q cannot be computed outside the engine: power is shown with a generic wrong "
                       "law (the target at 0.8× the temperature) instead of the q-based ones")
    power = not weak
    if weak:
        reasons.append(f"underpowered at position(s) {', '.join(map(str, weak))}: a wrong law was not "
                       f"rejected; raise trials (now {trials})")
    return _LawRun(law_prompts, per_prompt, tuple(results), power, tuple(reasons), t1 - t0, t2 - t1, t3 - t2)


def _greedy_reasons(greedy: GreedyResult, dtype: torch.dtype) -> list[str]:
    reasons = []
    if greedy.failed:
        d = next(d for d in greedy.differences if not d.tie)
        reasons.append(f"greedy: {greedy.prompts - greedy.identical - greedy.ties} of {greedy.prompts} prompts "
                       f"differ from plain decoding with a clear margin (prompt {d.prompt}, token {d.position}: "
                       f"{d.plain_token} vs {d.speculative_token}, top-2 margin {d.margin:.3g})")
    if greedy.ties:
        reasons.append(f"greedy: {greedy.ties} prompts differ at a near-tie (top-2 margin within {TIE_ULPS:g} ulps "
                       f"of the top logit in {str(dtype).removeprefix('torch.')}): rounding of a batch of another "
                       "shape, not a failure")
    return reasons


def check(target, drafter, prompts, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
          num_draft_tokens: int | str = 4, engine: str = "auto", trials: int = DEFAULT_TRIALS,
          positions: int = DEFAULT_POSITIONS, num_prompts: int = 4, max_prompt_tokens: int = 8,
          greedy_tokens: int = 32, level: float = 1e-4, seed: int = 0,
          progress: "Callable[[str, int, int], None] | None" = None) -> CheckResult:
    """Test that speculative decoding with this target, drafter, sampling and runner samples the target's law.

    target     a transformers decoder-only LM (the law is computed from its plain forward passes)
    drafter    what `specdec.generate` takes: a transformers model, a `Drafter`, a feature-head folder
    prompts    token-id lists: the law test uses their best prefixes (see the module docstring), the greedy
               comparison the prompts themselves
    positions  generated tokens per trial K ≥ 2, each position tested (the first step drafts min(γ, K − 1))
    level      a law test fails below this p-value; a wrong law must be rejected below it
    progress   called as work completes: ("trials", requests done, of total), then ("greedy", 1 | 2, 2)
    Returns a `CheckResult` (never raises for a failed test; raises ValueError/TypeError for bad arguments,
    before any model runs).
    """
    from specdec.request import check_context

    start = time.perf_counter()
    trials, positions, num_prompts, max_prompt_tokens, greedy_tokens, level, seed, gamma, prompts = _validate(
        trials, positions, num_prompts, max_prompt_tokens, greedy_tokens, level, seed, engine, num_draft_tokens,
        prompts)
    sampling = SamplingConfig(temperature, top_k, top_p)
    vocab = _check_models(target, drafter)
    for i, prompt in enumerate(prompts):
        if max(prompt) >= vocab:
            raise ValueError(f"prompts[{i}] has token {max(prompt)} outside the target's vocabulary of {vocab}")
    check_context(target, [p[:max_prompt_tokens] for p in prompts], positions)
    check_context(target, prompts, greedy_tokens)
    law = None
    if not sampling.greedy:
        law = _law_tests(target, drafter, vocab, prompts, sampling, gamma, engine, trials, positions, num_prompts,
                         max_prompt_tokens, level, seed, progress)
    reasons = list(law.reasons) if law else []
    greedy = None
    t_greedy = time.perf_counter()
    if greedy_tokens:
        greedy = _greedy(target, drafter, prompts, greedy_tokens, gamma, engine, progress)
        reasons += _greedy_reasons(greedy, next(target.parameters()).dtype)
    t_greedy = time.perf_counter() - t_greedy
    results = law.positions if law else ()
    if any(r.law.rejects(level) for r in results) or (greedy is not None and greedy.failed):
        status = "fail"
    elif law is not None and law.power is not True:
        status = "underpowered"
    elif law is None and greedy is None:
        status = "underpowered"
        reasons.append("nothing was tested (temperature 0 and greedy_tokens 0)")
    else:
        status = "pass"
    timings = CheckTimings(law.select_s if law else 0.0, law.trials_s if law else 0.0, law.laws_s if law else 0.0,
                           t_greedy, time.perf_counter() - start)
    logger.info("specdec.check: %s in %.1fs", status, timings.total_s)
    return CheckResult(status, tuple(reasons), engine, gamma, sampling.temperature, sampling.top_k, sampling.top_p,
                       level, trials if law else 0, tuple(law.trials_per_prompt) if law else (),
                       tuple(tuple(p) for p in law.prompts) if law else (), results, law.power if law else None,
                       greedy, timings, _runner(engine, target, drafter, gamma))


def _runner(engine: str, target, drafter, gamma) -> str:
    """The runner `specdec.generate(engine=...)` picks for the speculative runs (the same rule, not a copy)."""
    from specdec.decoding.route import runner_for

    return runner_for(engine, target, drafter, gamma)
