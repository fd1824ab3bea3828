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
    run = stream(
        target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, num_draft_tokens, eos_token_id, seed,
        generator=generator, attention_mask=attention_mask,
    )
    for event in run:
        if on_tokens is not None:
            on_tokens(event)
    return run.result


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
    t_start = time.perf_counter()
    if max_new_tokens == 0:
        holder["result"] = GenerateResult(outputs, stats)
        return

    context = target.begin(prompts, max_new_tokens)
    stats.target_calls += int(int(max(len(p) for p in prompts)) > 1)
    if drafter is not None:
        drafter.begin(context, target.vocab_size)
    _sync(device)
    stats.prefill_time_s = time.perf_counter() - t_start

    original_row = torch.arange(batch, device=device)  # active row → caller's row
    generated = torch.zeros(batch, dtype=torch.long, device=device)
    step = 0
    while context.batch_size:
        # 1. draft
        t0 = time.perf_counter()
        gamma = policy.num_draft_tokens() if policy is not None else 0
        if gamma > 0:
            proposal = drafter.propose(context, gamma, sampling, generator, policy.confidence_threshold())
        else:
            proposal = empty_proposal(context.batch_size, device)
        gamma = proposal.tokens.shape[1]
        _sync(device)
        t1 = time.perf_counter()

        # 2. one target pass over [last committed token, drafts]
        last, _ = context.tail(1)
        logits = target.forward(torch.cat([last, proposal.tokens], dim=1))  # [B, γ+1, V]

        # 3. verify
        if sampling.greedy:
            result = verify_greedy(proposal.tokens, logits, draft_lengths=proposal.lengths)
        else:
            target_probs = standardize_logits(logits, sampling)
            result = verify(proposal.tokens, proposal.probs, target_probs, generator, draft_lengths=proposal.lengths)

        # 4. emit, cut at EOS / max_new_tokens, roll back
        new_tokens = result.tokens(proposal.tokens)  # [B, γ+1]
        counts = torch.minimum(result.num_accepted + 1, max_new_tokens - generated)
        cols = torch.arange(gamma + 1, device=device)[None, :]
        is_eos = torch.isin(new_tokens, eos_ids) & (cols < counts[:, None])
        hit_eos = is_eos.any(1)
        counts = torch.where(hit_eos, is_eos.long().argmax(1) + 1, counts)
        context.append(new_tokens, counts)
        generated += counts
        finished = hit_eos | (generated >= max_new_tokens)
        target.crop(context.lengths - 1)
        if drafter is not None and gamma > 0:
            drafter.commit(context)
        _sync(device)
        t2 = time.perf_counter()

        # bookkeeping on the host (one transfer per step)
        draft_lengths = proposal.lengths if proposal.lengths is not None else torch.full_like(counts, gamma)
        host = torch.cat(
            [new_tokens, counts[:, None], finished[:, None].long(), original_row[:, None]], dim=1
        ).tolist()
        _update_stats(stats, result, draft_lengths, proposal, gamma, t1 - t0, t2 - t1)
        event_rows, event_tokens, done = [], [], []
        for row in host:
            n, fin, orig = row[-3], row[-2], row[-1]
            if n:
                outputs[orig].extend(row[:n])
                event_rows.append(orig)
                event_tokens.append(row[:n])
            if fin:
                done.append(orig)
        stats.num_generated_tokens += sum(len(t) for t in event_tokens)
        if policy is not None:
            policy.update(StepOutcome(gamma, result.num_accepted, draft_lengths, t1 - t0, t2 - t1))
        yield TokenEvent(step=step, rows=event_rows, tokens=event_tokens, finished=done)
        step += 1

        if done:
            keep = (~finished).nonzero().squeeze(1)
            original_row = original_row[keep]
            generated = generated[keep]
            context.select_rows(keep)
            target.select_rows(keep)
            if drafter is not None:
                drafter.select_rows(keep)

    stats.wall_time_s = time.perf_counter() - t_start
    holder["result"] = GenerateResult(outputs, stats)


def _update_stats(stats: SpecStats, result, draft_lengths, proposal: Proposal, gamma, draft_s, verify_s) -> None:
    batch = result.num_accepted.shape[0]
    stats.num_steps += 1
    stats.target_calls += 1
    stats.drafter_calls += proposal.forward_passes
    stats.row_steps += batch
    stats.draft_time_s += draft_s
    stats.verify_time_s += verify_s
    stats.max_num_draft_tokens = max(stats.max_num_draft_tokens, gamma)
    if gamma == 0:
        stats.algorithm_tokens += batch
        return
    n = result.num_accepted
    pos = torch.arange(gamma, device=n.device)[None, :]
    drafted = pos < draft_lengths[:, None]
    reached = drafted & (pos <= n[:, None])  # prefixes of committed text
    accepted = pos < n[:, None]
    packed = torch.cat(
        [
            reached.sum(0).double(),
            accepted.sum(0).double(),
            (result.beta.double() * reached).sum().reshape(1),
            torch.stack([n.sum(), draft_lengths.sum(), (draft_lengths > 0).sum()]).double(),
        ]
    ).tolist()
    reached_pos, accepted_pos = packed[:gamma], packed[gamma : 2 * gamma]
    beta_sum, n_sum, drafted_sum, spec_rows = packed[2 * gamma :]
    if len(stats.reached_by_position) < gamma:
        extra = gamma - len(stats.reached_by_position)
        stats.reached_by_position += [0] * extra
        stats.accepted_by_position += [0] * extra
    for i in range(gamma):
        stats.reached_by_position[i] += int(reached_pos[i])
        stats.accepted_by_position[i] += int(accepted_pos[i])
    stats.beta_sum += beta_sum
    stats.beta_count += int(sum(reached_pos))
    stats.accepted_tokens += int(n_sum)
    stats.drafted_tokens += int(drafted_sum)
    stats.speculative_row_steps += int(spec_rows)
    stats.algorithm_tokens += int(n_sum) + batch


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
