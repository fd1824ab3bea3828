"""What a request needs of an engine, checked when it is queued (`Engine.add_request`), each failure one line naming
the argument.

`RequestLimits` is the engine's side as a frozen record, read once at construction (its vocabulary, lengths, draft
caps, what its drafter and layout can do); `check_request` and `check_tree` are functions of (request, limits), so
the checks hold no engine state and read no attribute another module defines.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.tree import TreeSpec
from specdec.engine.slots import MAX_EOS_IDS
from specdec.request import SamplingParams

__all__ = ["RequestLimits", "check_request", "check_tree", "pool_margin"]


@dataclass(frozen=True)
class RequestLimits:
    """An engine's limits as requests meet them.

    drafter       the drafter's class name (None: plain decoding only)
    tree_drafter  the drafter grows token trees (a same-vocabulary draft model)
    paged         the paged KV pool (`kv_layout="paged"`)
    windowed      some target layer attends over a sliding window (no token trees)
    """

    vocab_size: int
    max_seq_len: int
    max_draft_tokens: int
    max_tree_nodes: int
    drafter: str | None
    tree_drafter: bool
    paged: bool
    bitwise: bool
    windowed: bool


def check_request(prompt_length: int, params: SamplingParams, limits: RequestLimits) -> None:
    """A token tree's needs, the length, EOS ids, vocabulary, draft cap and lenience of one request against the
    engine's limits."""
    if params.draft_tree is not None:
        check_tree(params, limits)
    total = prompt_length + params.max_new_tokens
    if total > limits.max_seq_len:
        raise ValueError(f"prompt length {prompt_length} + max_new_tokens {params.max_new_tokens} = {total} exceeds "
                         f"the engine's max_seq_len of {limits.max_seq_len} tokens")
    if len(params.eos_token_ids) > MAX_EOS_IDS:
        raise ValueError(f"at most {MAX_EOS_IDS} eos_token_ids per request, got {len(params.eos_token_ids)}")
    params.check_vocabulary(limits.vocab_size)  # EOS ids, logit_bias ids
    cap = params.num_draft_tokens
    if cap not in (None, 0) and limits.drafter is None:
        raise ValueError(f"num_draft_tokens={cap!r} needs a drafter; this engine has none (0 = plain decoding)")
    if isinstance(cap, int) and cap > limits.max_draft_tokens:
        raise ValueError(f"num_draft_tokens={cap} exceeds the engine's max_draft_tokens of {limits.max_draft_tokens}")
    if limits.bitwise and params.leniency != 1.0:
        raise ValueError(f"leniency={params.leniency} is not available with bitwise=True (bit-exact output is "
                         "plain decoding's; lenience changes it)")


def check_tree(params: SamplingParams, limits: RequestLimits) -> None:
    """What a request's `draft_tree` needs of the engine (one line naming what is missing)."""
    tree, nodes = params.draft_tree, TreeSpec(list(params.draft_tree)).num_nodes
    if not limits.tree_drafter:  # (not the cross-vocabulary drafter: one draft token per target token)
        what = "no drafter" if limits.drafter is None else f"a {limits.drafter}"
        raise ValueError(f"draft_tree {list(tree)}: token trees need a draft model, the engine has {what}")
    if nodes > limits.max_tree_nodes:
        raise ValueError(f"draft_tree {list(tree)} has {nodes} nodes (root included); the engine's "
                         f"max_tree_nodes is {limits.max_tree_nodes}")
    if len(tree) > limits.max_draft_tokens:
        raise ValueError(f"draft_tree {list(tree)} is {len(tree)} deep; the engine's max_draft_tokens is "
                         f"{limits.max_draft_tokens}")
    if params.leniency != 1.0:
        raise ValueError("leniency is not supported with draft_tree: token trees verify exactly (leniency=1.0)")
    if params.processors:
        raise ValueError(f"{', '.join(params.processors)}: logits processors run on chains, not on draft_tree")
    if limits.bitwise:
        raise ValueError("draft_tree: bitwise=True has no tree mask in its batch-invariant attention")
    if limits.windowed:
        raise ValueError("draft_tree: the target has sliding-window layers, which token trees do not support")


def tree_nodes(branching) -> int:
    """Nodes of a token tree with this branching per level, the root included (`core.tree.TreeSpec.num_nodes`)."""
    nodes = width = 1
    for k in branching:
        width *= int(k)
        nodes += width
    return nodes


def pool_margin(params: SamplingParams, max_draft_tokens: int) -> int:
    """Positions past a row's committed length n that one step of this request may write, in the paged pool's
    blocks: a chain's γ + 1 from slot n − 1, or a token tree's N + 1 nodes (root included) from slot n − 1, plus
    one spare (the junk slot's side of the span)."""
    tree = params.draft_tree
    written = max_draft_tokens if tree is None else max(max_draft_tokens, tree_nodes(tree) - 1)
    return written + 2
