"""The paper's analysis (§3) as a tool: predict the speedup of a model pair, measure α and c, pick γ.

Terms (Leviathan, Kalman & Matias 2023):
  α  `alpha`          expected acceptance rate E[β], β = Σ_x min(p(x), q(x)) (Thm 3.5, Cor 3.6)
  γ  `gamma`          tokens drafted per step (`num_draft_tokens`)
  c  `cost_ratio`     walltime of one drafter call / walltime of one target call
  ĉ  `op_cost_ratio`  arithmetic operations per token of the drafter / of the target

The four formula functions (`expected_tokens`, `walltime_improvement`, `operations_increase`,
`optimal_gamma`) are pure Python and need no torch; they assume i.i.d. β, as the paper does.
The measurement helpers (`measure_alpha`, `measure_cost_ratio`, `op_cost_ratio`; `timed` / `median_timed`, the
benchmarks' one wall clock) import torch inside the function: `import specdec.analysis` stays cheap for the CLI.
transformers is never imported here: models are duck-typed Hugging Face causal LMs
(`model(input_ids=..., attention_mask=..., past_key_values=..., use_cache=...).logits`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is only needed by the measurement helpers
    import torch

__all__ = [
    "expected_tokens",
    "walltime_improvement",
    "operations_increase",
    "optimal_gamma",
    "speculation_pays",
    "AlphaMeasurement",
    "measure_alpha",
    "measure_cost_ratio",
    "op_cost_ratio",
    "drain", "timed", "median_timed",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Argument checks: every public function names the offending argument in its error.


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_gamma(gamma: int, name: str = "gamma", minimum: int = 0) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {gamma!r}")
    return gamma


def _check_ratio(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value < math.inf):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------
# §3 formulas


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per step (Eq. 1): (1 − α^(γ+1)) / (1 − α); γ + 1 at α = 1.

    Computed as −expm1((γ+1)·ln α) / (1 − α) so that α close to 1 keeps full precision (the
    naive form cancels catastrophically there); the value is continuous into the α = 1 limit.
    """
    alpha = _check_alpha(alpha)
    gamma = _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    if alpha == 0.0 or gamma == 0:
        return 1.0  # only the correction/next token (exact 1.0, not 1 ± round-off)
    return -math.expm1((gamma + 1) * math.log(alpha)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Expected walltime speedup over plain decoding (Thm 3.8): (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

    γ = 0 is plain decoding and gives exactly 1.0.
    """
    cost_ratio = _check_ratio(cost_ratio, "cost_ratio")
    return expected_tokens(alpha, gamma) / (gamma * cost_ratio + 1.0)


def operations_increase(alpha: float, gamma: int, op_cost_ratio: float) -> float:
    """Expected factor of increase in arithmetic operations (Thm 3.11): (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1)).

    Each step runs the target on γ + 1 positions and the drafter γ times, and emits E tokens.
    """
    op_cost_ratio = _check_ratio(op_cost_ratio, "op_cost_ratio")
    return (gamma * op_cost_ratio + gamma + 1.0) / expected_tokens(alpha, gamma)


def speculation_pays(alpha: float, cost_ratio: float) -> bool:
    """True when some γ ≥ 1 gives an expected speedup above 1, which is exactly when α > c (Cor 3.9).

    If α > c then γ = 1 already gives (1 + α)/(1 + c) > 1. Conversely, if α ≤ c then
    Σ_{i≤γ} α^i ≤ 1 + γα ≤ 1 + γc for every γ, so no γ beats plain decoding.
    """
    return _check_alpha(alpha) > _check_ratio(cost_ratio, "cost_ratio")


def optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = 64) -> int:
    """The integer γ in [1, max_gamma] maximizing `walltime_improvement` (§3.5), found by search.

    Ties go to the smaller γ (fewer wasted drafts). The argmax is returned even when no γ beats
    plain decoding (α ≤ c, see `speculation_pays`): the caller decides whether to speculate at all,
    e.g. by checking `walltime_improvement(alpha, gamma, cost_ratio) > 1`. γ = 0 is never returned.
    With α = 1 and c = 0 the speedup grows without bound, so the answer is `max_gamma`.
    """
    alpha = _check_alpha(alpha)
    cost_ratio = _check_ratio(cost_ratio, "cost_ratio")
    max_gamma = _check_gamma(max_gamma, "max_gamma", minimum=1)
    best_gamma, best = 1, walltime_improvement(alpha, 1, cost_ratio)
    for gamma in range(2, max_gamma + 1):
        speedup = walltime_improvement(alpha, gamma, cost_ratio)
        if speedup > best:
            best_gamma, best = gamma, speedup
    return best_gamma


# --------------------------------------------------------------------------------------------
# Measurements on real models


@dataclass(frozen=True)
class AlphaMeasurement:
    """α measured teacher-forced on a set of sequences.

    alpha          mean β over all measured positions (pooled, so long sequences weigh more)
    num_positions  how many positions were measured
    betas          [num_positions] β at every measured position, sequence after sequence, in order
                   (None unless asked for with `return_betas=True`)
    """

    alpha: float
    num_positions: int
    betas: torch.Tensor | None = None


@contextlib.contextmanager
def _eval_mode(*models: torch.nn.Module) -> Iterator[None]:
    """Run with dropout off, then give each model back the train/eval mode it came with."""
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _as_rows(sequences: torch.Tensor | Sequence[Sequence[int]]) -> list[list[int]]:
    import torch

    if isinstance(sequences, torch.Tensor):
        if sequences.dim() != 2 or sequences.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"sequences must be an integer tensor [N, T], got {sequences.dtype} {tuple(sequences.shape)}")
        return [row.tolist() for row in sequences.cpu()]
    return [list(map(int, row)) for row in sequences]


def measure_alpha(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    sequences: torch.Tensor | Sequence[Sequence[int]],
    *,
    prompt_lengths: int | Sequence[int] | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    batch_size: int = 8,
    return_betas: bool = False,
) -> AlphaMeasurement:
    """Measure α = E[β] (Cor 3.6) for a target/draft pair, teacher-forced on given token sequences.

    target, draft   Hugging Face causal LMs sharing one vocabulary (logits `[B, T, V]`, same V)
    sequences       [N, T] long tensor, or N lists of token ids (ragged allowed); normally prompts
                    followed by text the target generated, since α is defined on the target's text
    prompt_lengths  int or [N]: β is measured at the distributions that predict tokens
                    prompt_length .. len−1 of each sequence (the generated part). None = 1: every
                    position that has at least one token of context
    temperature, top_k, top_p
                    the sampling config; p and q are standardized identically (§2.2), so at
                    temperature 0 both are one-hot argmaxes and every β is 0 or 1

    Both models run once per batch of `batch_size` sequences (right-padded, with an attention mask;
    causal attention means padding never changes the real positions). Returns the pooled mean β.
    """
    import torch

    from specdec.core import SamplingConfig, standardize_logits

    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    _check_gamma(batch_size, "batch_size", minimum=1)
    rows = _as_rows(sequences)
    if not rows:
        raise ValueError("sequences is empty")
    if prompt_lengths is None:
        starts = [1] * len(rows)
    elif isinstance(prompt_lengths, int) and not isinstance(prompt_lengths, bool):
        starts = [prompt_lengths] * len(rows)
    else:
        starts = [int(n) for n in prompt_lengths]
        if len(starts) != len(rows):
            raise ValueError(f"prompt_lengths has {len(starts)} entries for {len(rows)} sequences")
    for i, (row, start) in enumerate(zip(rows, starts)):
        if start < 1:
            raise ValueError(f"prompt_lengths[{i}] must be >= 1 (β needs a prefix), got {start}")
        if start > len(row):
            raise ValueError(f"prompt_lengths[{i}] = {start} is longer than sequence {i} ({len(row)} tokens)")

    target_device, draft_device = _model_device(target), _model_device(draft)
    betas: list[torch.Tensor] = []
    with _eval_mode(target, draft), torch.inference_mode():
        for lo in range(0, len(rows), batch_size):
            batch_rows, batch_starts = rows[lo : lo + batch_size], starts[lo : lo + batch_size]
            width = max(len(r) for r in batch_rows)
            ids = torch.zeros(len(batch_rows), width, dtype=torch.long)
            mask = torch.zeros(len(batch_rows), width, dtype=torch.long)
            # select[b, t]: logits at t predict token t+1, a generated token of row b
            select = torch.zeros(len(batch_rows), width, dtype=torch.bool)
            for b, (row, start) in enumerate(zip(batch_rows, batch_starts)):
                ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
                mask[b, : len(row)] = 1
                select[b, start - 1 : len(row) - 1] = True
            if not select.any():
                continue
            target_logits = target(input_ids=ids.to(target_device), attention_mask=mask.to(target_device)).logits
            draft_logits = draft(input_ids=ids.to(draft_device), attention_mask=mask.to(draft_device)).logits
            if target_logits.shape[-1] != draft_logits.shape[-1]:
                raise ValueError(
                    f"target and draft vocabularies differ: {target_logits.shape[-1]} vs {draft_logits.shape[-1]} logits"
                )
            # Standardize only the selected positions: [num_selected, V] keeps memory at one batch's worth.
            p = standardize_logits(target_logits[select.to(target_device)], sampling)
            q = standardize_logits(draft_logits[select.to(draft_device)], sampling).to(p.device)
            betas.append(torch.minimum(p, q).sum(-1).clamp(max=1.0).cpu())
    if not betas:
        raise ValueError("no positions to measure: every sequence ends at its prompt")
    all_betas = torch.cat(betas).double()
    return AlphaMeasurement(
        alpha=float(all_betas.mean()),
        num_positions=int(all_betas.numel()),
        betas=all_betas.float() if return_betas else None,
    )


def drain(device: torch.device) -> None:
    """Wait for the work queued on `device`: a CUDA sync on CUDA, nothing on the CPU."""
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """The benchmarks' one wall clock: `fn()` with `device` drained before and after → (seconds, its result)."""
    drain(device)
    start = time.perf_counter()
    result = fn()
    drain(device)
    return time.perf_counter() - start, result


def median_timed(fn: Callable[[int], object], device: torch.device, repeats: int,
                 warmup: Callable[[], object] | None = None) -> tuple[float, object]:
    """Warm up once (`warmup()`, default `fn(0)`: compiles and graph captures stay outside), then `timed`
    `fn(1)` .. `fn(repeats)` → (median seconds, the median run's result)."""
    _check_gamma(repeats, "repeats", minimum=1)
    (warmup or (lambda: fn(0)))()
    runs = sorted((timed(lambda i=i: fn(i), device) for i in range(1, repeats + 1)), key=lambda run: run[0])
    return runs[len(runs) // 2]


class _DecodeTimer:
    """One model prefilled with random context, stepping one token at a time on its KV cache."""

    def __init__(self, model: torch.nn.Module, context: torch.Tensor, steps: torch.Tensor) -> None:
        self.model, self.steps, self.next = model, steps, 0
        self.device = _model_device(model)
        # transformers renamed `past_key_values` to `cache` during the 5.x series; accept both.
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.cache = self._forward(context.to(self.device), None)

    def _forward(self, ids: torch.Tensor, cache: object) -> object:
        out = self.model(input_ids=ids, use_cache=True, **({self.cache_kwarg: cache} if cache is not None else {}))
        return out.cache if hasattr(out, "cache") else out.past_key_values

    def step(self) -> float:
        """Seconds for one single-token forward pass."""
        ids, self.next = self.steps[:, self.next : self.next + 1].to(self.device), self.next + 1
        seconds, self.cache = timed(lambda: self._forward(ids, self.cache), self.device)
        return seconds


def measure_cost_ratio(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    *,
    batch_size: int = 1,
    context_length: int = 128,
    num_tokens: int = 32,
    warmup: int = 4,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> float:
    """Measure c = t_draft / t_target: walltime of one decode step of the drafter over one of the target.

    Each model is prefilled with the same `context_length` random tokens (batch `batch_size`), then
    runs `warmup` untimed and `num_tokens` timed single-token forward passes on its KV cache; c is
    the ratio of the median step times. Target and draft steps alternate, so that a machine whose
    speed drifts (other processes, clocks) slows both alike. On CUDA every step is bracketed by
    `torch.cuda.synchronize`. Python and framework overhead per call is included on purpose: the
    decoding loop pays it too.

    device  where to time both models; when given, both are moved there (`Module.to` is in place).
            None = leave them where they are (a warning is logged if the two devices differ,
            since c is then not a same-hardware ratio).
    """
    import torch

    for name, value in (("batch_size", batch_size), ("context_length", context_length), ("num_tokens", num_tokens)):
        _check_gamma(value, name, minimum=1)
    _check_gamma(warmup, "warmup")
    if device is not None:
        target.to(device)
        draft.to(device)
    if _model_device(target) != _model_device(draft):
        logger.warning("timing target on %s and draft on %s: c compares different hardware",
                       _model_device(target), _model_device(draft))
    vocab_size = min(_vocab_size(target), _vocab_size(draft))
    generator = torch.Generator().manual_seed(seed)  # own generator: never touch the global RNG
    context = torch.randint(vocab_size, (batch_size, context_length), generator=generator)
    steps = torch.randint(vocab_size, (batch_size, warmup + num_tokens), generator=generator)
    target_times: list[float] = []
    draft_times: list[float] = []
    with _eval_mode(target, draft), torch.inference_mode():
        timers = _DecodeTimer(target, context, steps), _DecodeTimer(draft, context, steps)
        for i in range(warmup + num_tokens):
            t_target, t_draft = timers[0].step(), timers[1].step()
            if i >= warmup:
                target_times.append(t_target)
                draft_times.append(t_draft)
    t_target, t_draft = statistics.median(target_times), statistics.median(draft_times)
    logger.info("decode step: target %.3f ms, draft %.3f ms", 1e3 * t_target, 1e3 * t_draft)
    return t_draft / t_target


def _vocab_size(model: torch.nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def _ops_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in a matrix multiply for every token.

    Embedding tables (token, and learned positions where present) are lookups, not arithmetic, so
    they are left out; the output projection (lm_head) is a real matmul over the vocabulary, so it
    is counted even when it shares its weight with the input embedding.
    """
    import torch

    unique = {id(p): p for p in model.parameters()}
    lookup = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False)}
    count = sum(p.numel() for k, p in unique.items() if k not in lookup)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and id(output.weight) in lookup:  # tied: the lookup table doubles as lm_head
        count += output.weight.numel()
    return count


def op_cost_ratio(target: torch.nn.Module, draft: torch.nn.Module) -> float:
    """ĉ: arithmetic operations per token of the draft over those of the target (Thm 3.11).

    Uses the usual 2·N FLOPs-per-token estimate, where N counts the parameters used in a matmul
    for each token: every weight except embedding lookups, plus the output projection (see
    `_ops_parameters`). The factor 2 cancels in the ratio. The attention-over-context term
    (∝ layers · context · width) is ignored, which is accurate while context ≪ 6·width.
    For encoder-decoder models this counts the encoder too, which overstates per-token cost.
    """
    return _ops_parameters(draft) / _ops_parameters(target)
