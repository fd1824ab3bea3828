"""Speculative decoding with token trees: `specdec.generate(..., draft_tree=[k_1, ..., k_D])`.

One step for every active row:
  1. the drafter proposes a tree (k_d children per node at depth d) and the q at every internal node;
  2. the target scores the root (the last committed token) and all nodes in ONE pass with a tree attention
     mask (`TreeCausalLM.forward_tree`) → p at every node;
  3. `specdec.core.tree.verify_tree` (recursive rejection sampling, exact) or `verify_tree_greedy` (the longest
     path matching the target's argmax) picks the accepted path and one more token;
  4. the path's tokens are committed (cut at EOS / max_new_tokens); the target keeps exactly the path's KV
     slots (`commit_path`: the other nodes become masked holes), the drafter keeps its own part of the path.
`draft_tree=[1] * γ` is a chain: the same law as plain speculative decoding with γ drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from specdec.core import standardize_logits
from specdec.core.proposals import proposal_check
from specdec.core.tree import MODES, TreeSpec, verify_tree, verify_tree_greedy
from specdec.drafters.protocol import TreeLoopDrafter
from specdec.metrics import Clock, SpecStats
from specdec.models.tree_lm import TreeCausalLM
from specdec.request import SamplingParams, normalize_prompts, resolve_eos, resolve_generator
from specdec.step import GenerateResult, GenerationStream, StepLayout, StepRecord, TokenEvent
from specdec.step import commit_counts, pack_step, step_counters

__all__ = ["tree_generate", "run_tree"]


def tree_generate(target, prompts, drafter, draft_tree: Sequence[int], *, max_new_tokens: int = 64,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  eos_token_id: "int | Sequence[int] | None" = None, seed: int | None = None,
                  generator: torch.Generator | None = None, attention_mask: torch.Tensor | None = None,
                  tree_mode: str = "without_replacement", on_tokens: Callable | None = None) -> GenerateResult:
    """Generate with draft trees → `GenerateResult`; sampling arguments as `specdec.generate` (which runs the
    same loop for `generate(..., draft_tree=)`), plus:

    draft_tree   [k_1, ..., k_D]: children per node at each depth (e.g. [2, 2, 1]: 2 + 4 + 4 nodes)
    tree_mode    "without_replacement" (children distinct; RSD) or "iid" (SpecInfer); see `specdec.core.tree`
    target       a transformers decoder-only model; drafter: a transformers model or a
                 `drafters.protocol.TreeLoopDrafter` (`propose_tree` / `commit_tree`, e.g. `TreeModelDrafter`)
    on_tokens    called with each step's `TokenEvent`
    """
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, eos_token_ids=tuple(resolve_eos(eos_token_id, target)))
    run = run_tree(target, prompts, drafter, draft_tree, params, generator=generator, attention_mask=attention_mask,
                   tree_mode=tree_mode)
    for event in run:
        if on_tokens is not None:
            on_tokens(event)
    return run.result


def run_tree(target, prompts, drafter, draft_tree: Sequence[int], params: SamplingParams, *,
             generator: torch.Generator | None = None, attention_mask: torch.Tensor | None = None,
             tree_mode: str = "without_replacement") -> GenerationStream:
    """A `GenerationStream` of per-step `TokenEvent`s for prompts described by one `SamplingParams` (`eos_token_ids` as
    given: () = none); arguments as `tree_generate`."""
    spec = TreeSpec(draft_tree)
    if tree_mode not in MODES:
        raise ValueError(f"tree_mode must be one of {MODES}, got {tree_mode!r}")
    if params.leniency != 1.0 or params.logprobs:
        raise ValueError("token trees verify exactly and report no logprobs: leniency must be 1.0, logprobs False")
    target = _tree_target(target)
    drafter = _tree_drafter(drafter, target)
    rows = normalize_prompts(prompts, attention_mask, target.vocab_size)
    generator = resolve_generator(generator, params.seed, target.device)
    holder: dict = {}
    steps = _tree_decode(target, drafter, spec, tree_mode, rows, params, generator, holder)
    return GenerationStream(steps, holder)


def _tree_decode(target, drafter, spec, tree_mode, rows, params, generator, holder) -> Iterator[TokenEvent]:
    max_new_tokens, sampling = params.max_new_tokens, params.sampling
    stats = SpecStats()
    outputs: list[list[int]] = [[] for _ in rows]
    t_start = time.perf_counter()
    if max_new_tokens == 0:
        holder["result"] = GenerateResult(outputs, stats)
        return
    device = target.device
    context = target.begin(rows, max_new_tokens)
    context.reserve(int(context.lengths.max()) + max_new_tokens)
    context.growable = False
    drafter.begin(context, target.vocab_size)
    stats.add_prefill(time.perf_counter() - t_start, target.begin_forward_passes)
    eos_ids = torch.tensor(sorted(params.eos_token_ids), dtype=torch.long, device=device)
    original = list(range(len(rows)))  # the step's row → caller's row
    generated = torch.zeros(len(rows), dtype=torch.long, device=device)
    parents = spec.parents.to(device)
    # Counters per depth: positions are depths, `drafted` counts tree nodes (N per row-step) and α (a
    # single-draft β) is not defined for trees (`has_beta=False`).
    layout = StepLayout(spec.depth, counters=True, drafter=type(drafter).__name__)
    child_parents = parents[1:]  # the q row (internal node) each drafted node was drawn from
    clock = Clock(device)
    step = 0
    while original:
        batch = len(original)
        clock.mark(0)
        proposal = drafter.propose_tree(context, spec, sampling, generator, tree_mode)
        proposal, check = _checked_tree(proposal, batch, spec, target.vocab_size, child_parents)  # (read with the record)
        clock.mark(1)
        target.begin_tree()
        logits = target.forward_tree(proposal.tokens, parents.expand(batch, -1))  # [B, N+1, V]
        if sampling.greedy:
            result = verify_tree_greedy(spec, proposal.tokens, logits)
        else:
            target_probs = standardize_logits(logits, sampling)
            result = verify_tree(spec, proposal.tokens, proposal.probs, target_probs, generator, mode=tree_mode)
        keep = torch.zeros(batch, spec.num_nodes, dtype=torch.bool, device=device)
        keep.scatter_(1, result.path.clamp_min(0), result.path >= 0)
        keep[:, 0] = True  # the root (the last committed token) is now in the cache
        target.commit_path(keep)

        new_tokens = result.tokens(proposal.tokens)  # [B, D+1]
        active = torch.ones(batch, dtype=torch.bool, device=device)
        counts, hit_eos = commit_counts(new_tokens, result.num_accepted, max_new_tokens - generated, eos_ids, active)
        context.append(new_tokens, counts)
        generated += counts
        finished = hit_eos | (generated >= max_new_tokens)
        target.crop(context.lengths - 1)
        drafter.commit_tree(context, spec, proposal.tokens)
        clock.mark(2)

        nodes = torch.full_like(counts, spec.num_nodes - 1)
        no_beta = torch.zeros(batch, spec.depth, dtype=torch.float64, device=device)
        counters = step_counters(result.num_accepted, no_beta, nodes, active, spec.depth)
        packed = pack_step(layout, new_tokens, counts, result.num_accepted, nodes, finished, hit_eos, active,
                           torch.zeros((), dtype=torch.bool, device=device), counters=counters, proposal=check)
        record = StepRecord.unpack(packed, layout, drafter_calls=proposal.forward_passes, has_beta=False,
                                   draft_time_s=clock.elapsed(0, 1), verify_time_s=clock.elapsed(1, 2), callers=original)
        stats.add_step(record)
        event = TokenEvent.of(record, step, original, outputs)
        yield event
        step += 1
        if event.finished:
            keep_rows = (~finished).nonzero().squeeze(1)
            original = [o for o, f in zip(original, record.finished) if not f]
            generated = generated[keep_rows]
            if keep_rows.numel():
                context.select_rows(keep_rows)
                target.select_rows(keep_rows)
                drafter.select_rows(keep_rows)
    stats.set_wall_time(time.perf_counter() - t_start)
    holder["result"] = GenerateResult(outputs, stats)


def _checked_tree(proposal, batch: int, spec: TreeSpec, vocab_size: int, child_parents: torch.Tensor):
    """A tree drafter's proposal with ids outside [0, V) fed as 0, and its `core.proposals.proposal_check` [2]
    (ids, q; the step raises when its record is read); shapes checked here."""
    tokens, probs = proposal.tokens, proposal.probs
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (batch, spec.num_nodes) \
            or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        shape = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tree drafter returned tokens {shape}; expected integer ids [B, N+1] = [{batch}, {spec.num_nodes}]")
    expected = (batch, spec.num_internal, vocab_size)
    if probs is not None and (not isinstance(probs, torch.Tensor) or tuple(probs.shape) != expected
                              or not probs.dtype.is_floating_point):
        shape = f"{tuple(probs.shape)} {probs.dtype}" if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise ValueError(f"tree drafter returned probs {shape}; expected None or floating [B, M, V] = {list(expected)}")
    check = proposal_check(tokens[:, 1:], probs, None, vocab_size, parents=child_parents)
    safe = torch.where((tokens >= 0) & (tokens < vocab_size), tokens, torch.zeros_like(tokens)).long()
    return replace(proposal, tokens=safe), check


def _tree_target(target) -> TreeCausalLM:
    from specdec.models.protocol import own_methods

    if own_methods(target):  # (a tree verifies through the model's own forward, never the target's methods)
        raise TypeError(f"draft_tree needs a transformers decoder-only target model, got {type(target).__name__}, a "
                        f"Target whose {', '.join(own_methods(target))} its own class defines")
    model = getattr(target, "model", target) if not isinstance(target, torch.nn.Module) else target
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise TypeError(f"draft_tree needs a transformers decoder-only target model, got {type(target).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("draft_tree is supported for decoder-only targets only (got an encoder-decoder model)")
    return TreeCausalLM(model)


def _tree_drafter(drafter, target: TreeCausalLM):
    if drafter is None:
        raise ValueError("draft_tree needs a drafter (a transformers model or a tree drafter)")
    if not isinstance(drafter, TreeLoopDrafter):
        if not isinstance(drafter, torch.nn.Module) or getattr(drafter, "config", None) is None:
            raise TypeError(
                f"draft_tree needs a transformers model or a tree drafter (begin, propose_tree, commit_tree, select_rows) "
                f"as drafter, got {type(drafter).__name__}"
            )
        if getattr(drafter.config, "is_encoder_decoder", False):
            raise ValueError("draft_tree needs a decoder-only drafter (got an encoder-decoder model)")
        from specdec.drafters.tree import TreeModelDrafter

        drafter = TreeModelDrafter(drafter)
    from specdec.drafters.protocol import check_same_vocabulary

    return check_same_vocabulary(drafter, target)
