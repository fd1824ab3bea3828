"""The decoding loop: draft → verify in one target pass → emit → roll back, for a batch of ragged rows.

One step for every active row b (γ drafts; plain decoding is the same loop with γ = 0):
  1. the drafter proposes x_1..x_γ and the q they were sampled from;
  2. the target scores [last committed token, x_1..x_γ] in one forward pass → p_1..p_{γ+1};
  3. `core.verify` accepts n_b drafts and samples one more token (residual or bonus);
  4. the row's n_b + 1 new tokens are committed (cut at EOS / max_new_tokens), both caches are cropped
     back to the committed text, finished rows leave the batch.
The target's cache always holds all committed tokens but the last, which the next step feeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from specdec.core import SamplingConfig, standardize_logits, verify, verify_greedy
from specdec.drafters.base import Drafter, Proposal, empty_proposal
from specdec.metrics import SpecStats
from specdec.policy import DraftLengthPolicy, StepOutcome, resolve_policy

__all__ = ["generate", "stream", "GenerateResult", "TokenEvent", "GenerationStream"]


@dataclass(frozen=True)
class GenerateResult:
    sequences: list[list[int]]  # new tokens per row, prompt excluded, cut after EOS
    stats: SpecStats


@dataclass(frozen=True)
class TokenEvent:
    """Tokens committed in one step: `tokens[i]` were appended to prompt `rows[i]`."""

    step: int
    rows: list[int]
    tokens: list[list[int]]
    finished: list[int]  # rows that finished in this step


def generate(
    target,
    prompts,
    drafter=None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
    eos_token_id: "int | Sequence[int] | None" = None,
    seed: int | None = None,
    *,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    on_tokens: Callable[[TokenEvent], None] | None = None,
) -> GenerateResult:
    """Generate up to `max_new_tokens` per prompt with speculative decoding (plain decoding if drafter=None).

    target          a transformers PreTrainedModel (decoder-only or encoder-decoder) or a specdec target
    prompts         list[list[int]] (ragged) or LongTensor [B, T] (with `attention_mask` [B, T] for padding)
    drafter         None | transformers model | `NGramDrafter` | `PromptLookupDrafter` | any `Drafter`
    temperature     0 = greedy (exact argmax path); top_k 0 and top_p 1.0 = off
    num_draft_tokens γ: an int, a policy name ("heuristic", "optimal", ...) or a `DraftLengthPolicy`
    eos_token_id    int or list; None = the target's generation_config / config EOS (as in transformers)
    seed            int → reproducible; otherwise pass `generator` or get fresh OS randomness
    on_tokens       called with a `TokenEvent` after every step (streaming)
    """
    fast = _fused_engine_for(target, num_draft_tokens, on_tokens)
    if fast is not None:
        if attention_mask is not None:
            prompts = normalize_prompts(prompts, attention_mask, target.vocab_size)
        return fast(
            target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, num_draft_tokens, eos_token_id,
            seed, generator=generator,
        )
    run = stream(
        target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, num_draft_tokens, eos_token_id, seed,
        generator=generator, attention_mask=attention_mask,
    )
    for event in run:
        if on_tokens is not None:
            on_tokens(event)
    return run.result


def _fused_engine_for(target, num_draft_tokens, on_tokens):
    """`specdec.fast.fast_generate` when it applies: a FastTarget, a fixed γ, no per-step callback.

    It runs the same algorithm with every step as CUDA-graph replays and one host sync (see specdec/fast).
    """
    import sys

    fast_target = sys.modules.get("specdec.fast.target")  # never import the fast path just to check
    if fast_target is None or not isinstance(target, fast_target.FastTarget) or on_tokens is not None:
        return None
    if not isinstance(num_draft_tokens, int) or isinstance(num_draft_tokens, bool):
        return None
    from specdec.fast.engine import fast_generate

    return fast_generate


class GenerationStream:
    """Iterate to get a `TokenEvent` per step; `.result` holds the `GenerateResult` once exhausted."""

    def __init__(self, steps: Iterator[TokenEvent], holder: dict):
        self._steps = steps
        self._holder = holder

    def __iter__(self) -> Iterator[TokenEvent]:
        yield from self._steps

    @property
    def result(self) -> GenerateResult:
        if "result" not in self._holder:
            raise RuntimeError("the stream has not finished yet: iterate over it first")
        return self._holder["result"]


def stream(
    target,
    prompts,
    drafter=None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
    eos_token_id: "int | Sequence[int] | None" = None,
    seed: int | None = None,
    *,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
) -> GenerationStream:
    """Like `generate`, but returns a `GenerationStream` of per-step `TokenEvent`s (arguments validated now)."""
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    target = as_target(target)
    drafter = as_drafter(drafter, target)
    policy = resolve_policy_by_name(num_draft_tokens) if drafter is not None else None
    rows = normalize_prompts(prompts, attention_mask, target.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    eos = resolve_eos(eos_token_id, target)
    if generator is None:
        generator = torch.Generator(device=target.device)
        generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    holder: dict = {}
    steps = _decode(target, drafter, policy, rows, max_new_tokens, sampling, eos, generator, holder)
    return GenerationStream(steps, holder)


def _decode(target, drafter, policy, prompts, max_new_tokens, sampling, eos, generator, holder) -> Iterator[TokenEvent]:
    stats = SpecStats()
    batch = len(prompts)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    device = target.device
    eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=device)
    # Targets with static shapes (CUDA graphs) keep finished rows in the batch, masked out.
    drop_rows = getattr(target, "drop_finished_rows", True) and getattr(drafter, "drop_finished_rows", True)
    t_start = time.perf_counter()
    if max_new_tokens == 0:
        holder["result"] = GenerateResult(outputs, stats)
        return

    stats.op_cost_ratio = _op_cost_ratio(target, drafter)
    context = target.begin(prompts, max_new_tokens)
    context.reserve(int(context.lengths.max()) + max_new_tokens)
    context.growable = False
    stats.target_calls += getattr(target, "begin_forward_passes", 1)  # prefill (or encoder) pass
    if drafter is not None:
        drafter.begin(context, target.vocab_size)
    _sync(device)
    stats.prefill_time_s = time.perf_counter() - t_start

    original_row = torch.arange(batch, device=device)  # active row → caller's row
    generated = torch.zeros(batch, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    clock = _Clock(device)
    step = 0
    num_active = batch
    while num_active:
        # 1. draft
        clock.mark(0)
        gamma = policy.num_draft_tokens() if policy is not None else 0
        if gamma > 0:
            proposal = drafter.propose(context, gamma, sampling, generator, policy.confidence_threshold())
        else:
            proposal = empty_proposal(context.batch_size, device)
        gamma = proposal.tokens.shape[1]
        clock.mark(1)

        # 2. one target pass over [last committed token, drafts]
        last, _ = context.tail(1)
        logits = target.forward(torch.cat([last, proposal.tokens], dim=1))  # [B, γ+1, V]

        # 3. verify
        # NaN logits are checked on the device and reported with the step's one transfer below.
        has_nan = torch.isnan(logits).any()
        if sampling.greedy:
            result = verify_greedy(proposal.tokens, logits, draft_lengths=proposal.lengths, check_nan=False)
        else:
            target_probs = standardize_logits(logits, sampling, check_nan=False)
            result = verify(proposal.tokens, proposal.probs, target_probs, generator, draft_lengths=proposal.lengths)

        # 4. emit, cut at EOS / max_new_tokens, roll back
        new_tokens = result.tokens(proposal.tokens)  # [B, γ+1]
        active = ~finished
        counts = torch.minimum(result.num_accepted + 1, max_new_tokens - generated) * active
        cols = torch.arange(gamma + 1, device=device)[None, :]
        is_eos = torch.isin(new_tokens, eos_ids) & (cols < counts[:, None])
        hit_eos = is_eos.any(1)
        counts = torch.where(hit_eos, is_eos.long().argmax(1) + 1, counts)
        context.append(new_tokens, counts)
        generated += counts
        newly_finished = active & (hit_eos | (generated >= max_new_tokens))
        finished |= newly_finished
        target.crop(context.lengths - 1)
        if drafter is not None and gamma > 0:
            drafter.commit(context)
        clock.mark(2)

        # bookkeeping: exactly one device → host transfer per step
        draft_lengths = proposal.lengths if proposal.lengths is not None else torch.full_like(counts, gamma)
        summary = _step_summary(result, draft_lengths, active, gamma)
        rows = torch.cat(
            [new_tokens, result.num_accepted[:, None], draft_lengths[:, None], active[:, None].long(),
             counts[:, None], newly_finished[:, None].long(), original_row[:, None]], 1,
        )
        host = torch.cat([rows.flatten().double(), summary, has_nan.double().reshape(1)]).tolist()
        if host.pop():
            raise ValueError("target logits contain NaN; the model produced invalid scores")
        width = gamma + 7
        table = [host[i * width : (i + 1) * width] for i in range(context.batch_size)]
        draft_s, verify_s = clock.elapsed(0, 1), clock.elapsed(1, 2)
        num_active_before = _record_step(stats, host[len(table) * width :], gamma, proposal, draft_s, verify_s)
        event_rows, event_tokens, done = [], [], []
        for row in table:
            n, fin, orig = int(row[-3]), row[-2], int(row[-1])
            if n:
                tokens = [int(t) for t in row[:n]]
                outputs[orig].extend(tokens)
                event_rows.append(orig)
                event_tokens.append(tokens)
            if fin:
                done.append(orig)
        stats.num_generated_tokens += sum(len(t) for t in event_tokens)
        num_active = num_active_before - len(done)
        if policy is not None:
            outcome = torch.tensor([[int(r[-6]), int(r[-5])] for r in table if r[-4]], dtype=torch.long).reshape(-1, 2)
            policy.update(StepOutcome(gamma, outcome[:, 0], outcome[:, 1], draft_s, verify_s))
        yield TokenEvent(step=step, rows=event_rows, tokens=event_tokens, finished=done)
        step += 1

        if done and drop_rows and num_active:
            keep = (~finished).nonzero().squeeze(1)
            original_row, generated, finished = original_row[keep], generated[keep], finished[keep]
            context.select_rows(keep)
            target.select_rows(keep)
            if drafter is not None:
                drafter.select_rows(keep)

    stats.wall_time_s = time.perf_counter() - t_start
    holder["result"] = GenerateResult(outputs, stats)


def _op_cost_ratio(target, drafter) -> float | None:
    """ĉ for the stats: parameter-count ratio for model drafters, 0 for table/lookup drafters."""
    if drafter is None:
        return None
    draft_model, target_model = getattr(drafter, "model", None), getattr(target, "model", None)
    if draft_model is None:
        return 0.0
    if not isinstance(draft_model, torch.nn.Module) or not isinstance(target_model, torch.nn.Module):
        return None
    from specdec.analysis import op_cost_ratio

    return op_cost_ratio(target_model, draft_model)


class _Clock:
    """Step timings: perf_counter on CPU; CUDA events on GPU (read after the step's one host sync)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        else:
            self.times = [0.0] * 3

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def elapsed(self, i: int, j: int) -> float:
        if self.cuda:
            self.events[j].synchronize()
            return self.events[i].elapsed_time(self.events[j]) / 1000.0
        return self.times[j] - self.times[i]


def _step_summary(result, draft_lengths, active, gamma) -> torch.Tensor:
    """Per-step counts for SpecStats as one float64 vector (stays on the device until the step's transfer).

    Layout: reached[γ], accepted[γ], β-sum, Σn, Σdraft lengths, rows with drafts, active rows.
    """
    n = result.num_accepted
    pos = torch.arange(gamma, device=n.device)[None, :]
    drafted = (pos < draft_lengths[:, None]) & active[:, None]
    reached = drafted & (pos <= n[:, None])  # positions whose prefix is committed text
    accepted = pos < (n * active)[:, None]
    return torch.cat(
        [
            reached.sum(0).double(),
            accepted.sum(0).double(),
            (result.beta.double() * reached).sum().reshape(1),
            torch.stack([(n * active).sum(), (draft_lengths * active).sum(), ((draft_lengths > 0) & active).sum(), active.sum()]).double(),
        ]
    )


def _record_step(stats: SpecStats, summary: list[float], gamma: int, proposal: Proposal, draft_s, verify_s) -> int:
    """Fold one step's summary into the stats; returns the number of rows active in the step."""
    stats.num_steps += 1
    stats.target_calls += 1
    stats.drafter_calls += proposal.forward_passes
    stats.draft_time_s += draft_s
    stats.verify_time_s += verify_s
    stats.max_num_draft_tokens = max(stats.max_num_draft_tokens, gamma)
    return stats.add_counts(summary, gamma)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------
# Input normalization: every bad input gets a clear error naming the argument.


def as_target(target):
    """A specdec target from a transformers model (or a specdec target, passed through)."""
    if all(hasattr(target, name) for name in ("begin", "forward", "crop", "select_rows")):
        return target
    config = getattr(target, "config", None)
    if config is None or not isinstance(target, torch.nn.Module):
        raise TypeError(f"target must be a transformers model or a specdec target, got {type(target).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        from specdec.models.seq2seq import HFSeq2SeqLM

        return HFSeq2SeqLM(target)
    from specdec.models.hf import HFCausalLM

    return HFCausalLM(target)


def as_drafter(drafter, target) -> Drafter | None:
    """A specdec Drafter from a transformers model or a Drafter; checks the vocabularies agree."""
    if drafter is None:
        return None
    if not isinstance(drafter, Drafter):
        config = getattr(drafter, "config", None)
        if config is None or not isinstance(drafter, torch.nn.Module):
            raise TypeError(
                f"drafter must be None, a transformers model or a specdec Drafter, got {type(drafter).__name__}"
            )
        target_is_seq2seq = bool(getattr(getattr(target, "config", None), "is_encoder_decoder", False))
        if bool(getattr(config, "is_encoder_decoder", False)) != target_is_seq2seq:
            raise ValueError(
                "drafter and target must both be decoder-only or both encoder-decoder models "
                f"(target is_encoder_decoder={target_is_seq2seq}, drafter is_encoder_decoder={not target_is_seq2seq})"
            )
        if target_is_seq2seq:
            from specdec.drafters.seq2seq import Seq2SeqModelDrafter

            drafter = Seq2SeqModelDrafter(drafter)
        else:
            from specdec.drafters.model import ModelDrafter

            drafter = ModelDrafter(drafter)
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ: drafter has {drafter.vocab_size} tokens, "
            f"target has {target.vocab_size}; speculative decoding needs the same vocabulary"
        )
    return drafter


def resolve_policy_by_name(spec) -> DraftLengthPolicy:
    if isinstance(spec, int) and not isinstance(spec, bool) and spec < 1:
        raise ValueError(f"num_draft_tokens must be >= 1 with a drafter (got {spec}); use drafter=None for plain decoding")
    return resolve_policy(spec)


def normalize_prompts(prompts, attention_mask, vocab_size: int) -> list[list[int]]:
    """list[list[int]] from a ragged list or a [B, T] tensor (+ optional attention mask)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None, :]
        if prompts.dim() != 2 or prompts.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"prompts tensor must be an integer tensor [B, T], got {prompts.dtype} {tuple(prompts.shape)}")
        if attention_mask is not None:
            if attention_mask.shape != prompts.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} must equal prompts shape {tuple(prompts.shape)}"
                )
            keep = attention_mask.bool().cpu()
            rows = [row[m].tolist() for row, m in zip(prompts.cpu(), keep)]
        else:
            rows = prompts.cpu().tolist()
    else:
        if attention_mask is not None:
            raise ValueError("attention_mask is only accepted with a prompts tensor")
        if not isinstance(prompts, (list, tuple)) or (prompts and not all(isinstance(p, (list, tuple)) for p in prompts)):
            raise ValueError("prompts must be a list of token-id lists (list[list[int]]) or a LongTensor [B, T]")
        rows = [list(p) for p in prompts]
    if not rows:
        raise ValueError("prompts is empty: give at least one prompt")
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise ValueError(f"prompt {i} contains a non-integer token id {tok!r}")
        lo, hi = min(row), max(row)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompt {i} has token id {lo if lo < 0 else hi} outside the vocabulary [0, {vocab_size})")
    return rows


def resolve_eos(eos_token_id, target) -> list[int]:
    """EOS ids: the argument, else the model's generation config, else its config (as in transformers)."""
    if eos_token_id is None:
        model = getattr(target, "model", None)
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
            eos_token_id = getattr(source, "eos_token_id", None) if source is not None else None
            if eos_token_id is not None:
                break
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    for tok in ids:
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return ids
