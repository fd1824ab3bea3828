"""The eager chain loop over transformers models: draft → verify in one target pass → emit → roll back, for a batch of ragged rows.

One step for every active row b (γ drafts; plain decoding is the same loop with γ = 0):
  1. the drafter proposes x_1..x_γ and the q they were sampled from;
  2. the target scores [last committed token, x_1..x_γ] in one forward pass → p_1..p_{γ+1};
  3. `core.verify` accepts n_b drafts and samples one more token (residual or bonus);
  4. the row's n_b + 1 new tokens are committed (cut at EOS / max_new_tokens), both caches are cropped
     back to the committed text, finished rows leave the batch.
The target's cache always holds all committed tokens but the last, which the next step feeds.
`run_chain` is what `specdec.decoding.stream_request` hands a call that neither token trees nor the engine take.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from specdec.core import invalid_scores, standardize_logits, verify, verify_greedy
from specdec.drafters.base import checked_proposal, empty_proposal
from specdec.drafters.protocol import as_drafter
from specdec.metrics import Clock, SpecStats
from specdec.models.protocol import as_target
from specdec.policy import DraftLengthPolicy, StepOutcome, resolve_policy
from specdec.processing import BatchProcessors
from specdec.request import (
    SamplingParams,
    check_context,
    check_num_draft_tokens,
    normalize_prompts,
    resolve_generator,
    step_num_draft_tokens,
)
from specdec.step import (
    GenerateResult,
    GenerationStream,
    StepLayout,
    StepRecord,
    TokenEvent,
    commit_counts,
    pack_step,
    step_counters,
)

__all__ = ["run_chain", "resolve_policy_by_name"]


def run_chain(target, prompts, drafter, params: SamplingParams, num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
              *, generator: torch.Generator | None = None,
              attention_mask: torch.Tensor | None = None) -> GenerationStream:
    """A `GenerationStream` of the chain loop for prompts described by one `SamplingParams` (arguments as
    `specdec.decoding.stream_request`)."""
    target = as_target(target)
    drafter = as_drafter(drafter, target)
    policy = resolve_policy_by_name(num_draft_tokens) if drafter is not None else None
    if drafter is None and not (type(num_draft_tokens) is int and num_draft_tokens == 0):
        resolve_policy_by_name(num_draft_tokens)  # checked even when unused (0 = plain decoding is fine)
    rows = normalize_prompts(prompts, attention_mask, target.vocab_size)
    check_context(target, rows, params.max_new_tokens)
    generator = resolve_generator(generator, params.seed, target.device)
    holder: dict = {}
    steps = _decode(target, drafter, policy, rows, params, generator, holder)
    return GenerationStream(steps, holder)


def _decode(target, drafter, policy, prompts, params: SamplingParams, generator, holder) -> Iterator[TokenEvent]:
    max_new_tokens, sampling, leniency = params.max_new_tokens, params.sampling, params.leniency
    stats = SpecStats(op_cost_ratio=_op_cost_ratio(target, drafter) if max_new_tokens else None)
    batch = len(prompts)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    device = target.device
    eos_ids = torch.tensor(sorted(params.eos_token_ids), dtype=torch.long, device=device)
    # Targets with static shapes (CUDA graphs) keep finished rows in the batch, masked out.
    drop_rows = getattr(target, "drop_finished_rows", True) and getattr(drafter, "drop_finished_rows", True)
    t_start = time.perf_counter()
    if max_new_tokens == 0:
        holder["result"] = GenerateResult(outputs, stats)
        return

    context = target.begin(prompts, max_new_tokens)
    context.reserve(int(context.lengths.max()) + max_new_tokens)
    context.growable = False
    if drafter is not None:
        drafter.begin(context, target.vocab_size)
    # logits processors: their history starts at each row's text (the prompt; seq2seq: the decoder start)
    processors = BatchProcessors.of(params, [row[:n] for row, n in zip(context.tokens.tolist(), context.lengths.tolist())],
                                    target.vocab_size, device)
    if processors is not None:
        processors.context = context  # (no_repeat_ngram_size reads the committed text)
    draft_kwargs = {"processor": processors.draft} if processors is not None and \
        getattr(drafter, "accepts_processor", False) else {}
    _sync(device)
    stats.add_prefill(time.perf_counter() - t_start, getattr(target, "begin_forward_passes", 1))  # (or encoder)

    original = list(range(batch))  # the step's row → caller's row (host)
    alive = [True] * batch  # the step's row is still generating (static targets keep finished rows, masked)
    generated = torch.zeros(batch, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    clock = Clock(device)
    step = 0
    num_active = batch
    most_remaining = max_new_tokens  # the most tokens an active row may still commit
    gamma_limits = (getattr(target, "max_draft_tokens", None), getattr(drafter, "max_draft_tokens", None))
    drafter_name = type(drafter).__name__
    while num_active:
        # 1. draft
        clock.mark(0)
        gamma = policy.num_draft_tokens() if policy is not None else 0
        gamma = step_num_draft_tokens(gamma, most_remaining, *gamma_limits)
        active = ~finished
        check = None  # the proposal's `core.proposals` check, read with the step's record (no sync here)
        if gamma > 0:
            proposal = drafter.propose(context, gamma, sampling, generator, policy.confidence_threshold(),
                                       **draft_kwargs)
            proposal, check = checked_proposal(proposal, context.batch_size, gamma, target.vocab_size, active)
        else:
            proposal = empty_proposal(context.batch_size, device)
        gamma = proposal.tokens.shape[1]
        clock.mark(1)

        # 2. one target pass over [last committed token, drafts]
        last, _ = context.tail(1)
        logits = target.forward(torch.cat([last, proposal.tokens], dim=1))  # [B, γ+1, V]

        # 3. verify
        # NaN logits are checked on the device and reported with the step's one transfer below.
        has_nan = invalid_scores(logits)
        if processors is not None:  # p̃ at positions 1..γ+1, each with the history advanced along the draft
            logits = processors.target(logits, proposal.tokens)
        if sampling.greedy:
            result = verify_greedy(proposal.tokens, logits, draft_lengths=proposal.lengths, check_nan=False, leniency=leniency)
        else:
            target_probs = standardize_logits(logits, sampling, check_nan=False)
            result = verify(proposal.tokens, proposal.probs, target_probs, generator, draft_lengths=proposal.lengths,
                            leniency=leniency)

        # 4. emit, cut at EOS / max_new_tokens, roll back
        new_tokens = result.tokens(proposal.tokens)  # [B, γ+1]
        counts, hit_eos = commit_counts(new_tokens, result.num_accepted, max_new_tokens - generated, eos_ids, active)
        context.append(new_tokens, counts)
        generated += counts
        newly_finished = active & (hit_eos | (generated >= max_new_tokens))
        finished |= newly_finished
        target.crop(context.lengths - 1)
        if drafter is not None and gamma > 0:
            drafter.commit(context)
        clock.mark(2)

        # bookkeeping: exactly one device → host transfer per step
        layout = StepLayout(gamma, counters=True, drafter=drafter_name)
        counters = step_counters(result.num_accepted, result.beta, proposal.lengths, active, gamma)
        packed = pack_step(layout, new_tokens, counts, result.num_accepted, proposal.lengths, newly_finished, hit_eos,
                           active, has_nan, counters=counters, proposal=check)
        draft_s, verify_s = clock.elapsed(0, 1), clock.elapsed(1, 2)
        record = StepRecord.unpack(packed, layout, drafter_calls=proposal.forward_passes, draft_time_s=draft_s,
                                   verify_time_s=verify_s, callers=original)  # (raises on an invalid proposal)
        stats.add_step(record)
        if processors is not None:
            processors.commit(new_tokens, counts, record.tokens)
        event = TokenEvent.of(record, step, original, outputs)
        most_remaining = max((max_new_tokens - len(outputs[orig]) for orig, a, f in
                              zip(original, alive, record.finished) if a and not f), default=0)
        if policy is not None:
            outcome = torch.tensor([[record.num_accepted[i], record.num_drafted[i]] for i in range(len(alive))
                                    if alive[i]], dtype=torch.long).reshape(-1, 2)
            policy.update(StepOutcome(gamma, outcome[:, 0], outcome[:, 1], draft_s, verify_s))
        alive = [a and not f for a, f in zip(alive, record.finished)]
        num_active = sum(alive)
        yield event
        step += 1

        if event.finished and drop_rows and num_active:
            keep = (~finished).nonzero().squeeze(1)
            original = [o for o, a in zip(original, alive) if a]
            alive = [True] * len(original)
            generated, finished = generated[keep], finished[keep]
            context.select_rows(keep)
            target.select_rows(keep)
            if drafter is not None:
                drafter.select_rows(keep)
            if processors is not None:
                processors.select(keep)

    stats.set_wall_time(time.perf_counter() - t_start)
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_policy_by_name(spec) -> DraftLengthPolicy:
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 with a drafter (got {spec}); use drafter=None for "
                             "plain decoding")
        check_num_draft_tokens(spec)  # <= MAX_NUM_DRAFT_TOKENS
    return resolve_policy(spec)
