"""Speculative decoding with token trees: `specdec.generate(..., draft_tree=[k_1, ..., k_D])`.

One step for every active row:
  1. the drafter proposes a tree (k_d children per node at depth d) and the q at every internal node;
  2. the target scores the root (the last committed token) and all nodes in ONE pass with a tree attention
     mask (`TreeCausalLM.forward_tree`) → p at every node;
  3. `specdec.tree.verify_tree` (recursive rejection sampling, exact) or `verify_tree_greedy` (the longest
     path matching the target's argmax) picks the accepted path and one more token;
  4. the path's tokens are committed (cut at EOS / max_new_tokens); the target keeps exactly the path's KV
     slots (`commit_path`: the other nodes become masked holes), the drafter keeps its own part of the path.
`draft_tree=[1] * γ` is a chain: the same law as plain speculative decoding with γ drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from specdec.core import SamplingConfig, standardize_logits
from specdec.metrics import SpecStats
from specdec.models.tree_lm import TreeCausalLM
from specdec.request import check_max_new_tokens, new_generator, normalize_prompts, resolve_eos
from specdec.step import Clock, GenerateResult, GenerationStream, TokenEvent, commit_counts
from specdec.tree import MODES, TreeSpec, verify_tree, verify_tree_greedy

__all__ = ["tree_generate", "tree_stream"]


def tree_generate(target, prompts, drafter, draft_tree: Sequence[int], *args, on_tokens: Callable | None = None, **kwargs):
    """Generate with draft trees → `GenerateResult`; arguments as `tree_stream`, plus `on_tokens` per step."""
    run = tree_stream(target, prompts, drafter, draft_tree, *args, **kwargs)
    for event in run:
        if on_tokens is not None:
            on_tokens(event)
    return run.result


def tree_stream(
    target,
    prompts,
    drafter,
    draft_tree: Sequence[int],
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: "int | Sequence[int] | None" = None,
    seed: int | None = None,
    *,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    tree_mode: str = "without_replacement",
) -> GenerationStream:
    """`GenerationStream` of per-step `TokenEvent`s; arguments as `specdec.generate`, plus:

    draft_tree   [k_1, ..., k_D]: children per node at each depth (e.g. [2, 2, 1]: 2 + 4 + 4 nodes)
    tree_mode    "without_replacement" (children distinct; RSD) or "iid" (SpecInfer); see `specdec.tree`
    target       a transformers decoder-only model; drafter: a transformers model or a drafter with
                 `propose_tree` / `commit_tree` (e.g. `TreeModelDrafter`)
    """
    spec = TreeSpec(draft_tree)
    if tree_mode not in MODES:
        raise ValueError(f"tree_mode must be one of {MODES}, got {tree_mode!r}")
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    target = _tree_target(target)
    drafter = _tree_drafter(drafter, target)
    rows = normalize_prompts(prompts, attention_mask, target.vocab_size)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    eos = resolve_eos(eos_token_id, target)
    if generator is None:
        generator = new_generator(seed, target.device)
    holder: dict = {}
    steps = _tree_decode(target, drafter, spec, tree_mode, rows, max_new_tokens, sampling, eos, generator, holder)
    return GenerationStream(steps, holder)


def _tree_decode(target, drafter, spec, tree_mode, rows, max_new_tokens, sampling, eos, generator, holder) -> Iterator[TokenEvent]:
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
    stats.target_calls += target.begin_forward_passes
    drafter.begin(context, target.vocab_size)
    stats.prefill_time_s = time.perf_counter() - t_start
    eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=device)
    original_row = torch.arange(len(rows), device=device)
    generated = torch.zeros(len(rows), dtype=torch.long, device=device)
    parents = spec.parents.to(device)
    clock = Clock(device)
    step = 0
    while original_row.numel():
        batch = original_row.numel()
        clock.mark(0)
        proposal = drafter.propose_tree(context, spec, sampling, generator, tree_mode)
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

        host = torch.cat([new_tokens, result.num_accepted[:, None], counts[:, None], finished[:, None].long(),
                          original_row[:, None]], 1).tolist()
        event_rows, event_tokens, done = [], [], []
        for row in host:
            n, fin, orig = row[-3], row[-2], row[-1]
            outputs[orig].extend(row[:n])
            if n:
                event_rows.append(orig)
                event_tokens.append(row[:n])
            if fin:
                done.append(orig)
        _fold(stats, [row[-4] for row in host], spec, proposal.forward_passes, clock.elapsed(0, 1), clock.elapsed(1, 2))
        stats.num_generated_tokens += sum(len(t) for t in event_tokens)
        yield TokenEvent(step=step, rows=event_rows, tokens=event_tokens, finished=done)
        step += 1
        if done:
            keep_rows = (~finished).nonzero().squeeze(1)
            original_row, generated = original_row[keep_rows], generated[keep_rows]
            if keep_rows.numel():
                context.select_rows(keep_rows)
                target.select_rows(keep_rows)
                drafter.select_rows(keep_rows)
    stats.wall_time_s = time.perf_counter() - t_start
    holder["result"] = GenerateResult(outputs, stats)


def _fold(stats: SpecStats, accepted: list[int], spec: TreeSpec, drafter_passes: int, draft_s, verify_s) -> None:
    """One tree step into SpecStats. Positions are depths; α (a single-draft β) is not defined for trees, and
    `drafted_tokens` counts tree nodes (N per row-step)."""
    depth, nodes = spec.depth, spec.num_nodes - 1
    stats.num_steps += 1
    stats.target_calls += 1
    stats.drafter_calls += drafter_passes
    stats.draft_time_s += draft_s
    stats.verify_time_s += verify_s
    stats.max_num_draft_tokens = max(stats.max_num_draft_tokens, depth)
    if len(stats.reached_by_position) < depth:
        stats.reached_by_position += [0] * (depth - len(stats.reached_by_position))
        stats.accepted_by_position += [0] * (depth - len(stats.accepted_by_position))
    for n in accepted:
        for d in range(min(n + 1, depth)):
            stats.reached_by_position[d] += 1
        for d in range(n):
            stats.accepted_by_position[d] += 1
    rows = len(accepted)
    stats.row_steps += rows
    stats.speculative_row_steps += rows
    stats.drafted_tokens += rows * nodes
    stats.accepted_tokens += sum(accepted)
    stats.algorithm_tokens += sum(accepted) + rows


def _tree_target(target) -> TreeCausalLM:
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
    if not hasattr(drafter, "propose_tree"):
        if not isinstance(drafter, torch.nn.Module) or getattr(drafter, "config", None) is None:
            raise TypeError(
                f"draft_tree needs a transformers model or a drafter with propose_tree as drafter, got {type(drafter).__name__}"
            )
        if getattr(drafter.config, "is_encoder_decoder", False):
            raise ValueError("draft_tree needs a decoder-only drafter (got an encoder-decoder model)")
        from specdec.drafters.tree import TreeModelDrafter

        drafter = TreeModelDrafter(drafter)
    from specdec.request import check_same_vocabulary

    return check_same_vocabulary(drafter, target)
