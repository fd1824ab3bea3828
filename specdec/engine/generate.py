"""`specdec.generate` / `specdec.stream` on the engine: a batch of prompts becomes a batch of requests.

The engine (and its captured graphs) is kept on the target object, per drafter, and reused by later calls;
it is rebuilt only when a call needs longer texts than it was sized for (sizes grow by powers of two).
Each prompt i of a call with seed s gets the request seed (s, i), so the same call repeats exactly.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import replace
from collections.abc import Iterator

import torch

from specdec.drafters.loop_adapter import is_loop_only
from specdec.engine.build import refuse_own_target
from specdec.engine.config import EngineConfig, UnsupportedModel
from specdec.engine.engine import Engine
from specdec.fast.model import FastLlama, LlamaShape
from specdec.engine.policy_loop import declared_max
from specdec.metrics import SpecStats
from specdec.policy import DraftLengthPolicy, resolve_policy
from specdec.request import (
    SamplingParams,
    check_num_draft_tokens,
    context_length,
    normalize_prompts,
    resolve_seed,
    vocab_size,
)
from specdec.step import GenerateResult, GenerationStream, TokenEvent

__all__ = ["engine_stream", "engine_for", "release_engines"]

_MIN_SEQ_LEN = 256
_SEED_MIX = 0x9E3779B97F4A7C15


def _request_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index * _SEED_MIX) % (1 << 63)


class _Cached(dict):
    """What `specdec.generate` keeps on a model (its engines, its fast copies): never copied or pickled with it — a
    `copy.deepcopy(model)` or `pickle.dumps(model)` after a generate call gets an empty cache, not a copy of engines
    (with their locks, caches and graphs)."""

    def __deepcopy__(self, memo) -> "_Cached":
        return _Cached()

    def __reduce__(self):
        return (_Cached, ())


def _owner(target):
    """The object engines are kept on: the model itself, or what a specdec wrapper wraps."""
    return target if isinstance(target, torch.nn.Module) else getattr(target, "model", target)


def engine_for(target, drafter, *, seq_len: int, batch: int, num_draft_tokens, tree_nodes: int = 0) -> Engine:
    """The cached engine for (target, drafter), rebuilt larger when this call needs more (tree_nodes: the token
    tree a request asks for, root included)."""
    refuse_own_target(target)  # (before the engines kept on the model it wraps: they never call its methods)
    owner = _owner(target)
    store = owner.__dict__.setdefault("_specdec_engines", _Cached())
    device = _device(owner)
    key = (id(drafter), device)
    entry = store.get(key)
    engine = None
    if entry is not None and entry[0]() is drafter:
        engine = entry[1]
    max_draft = max(8, num_draft_tokens if isinstance(num_draft_tokens, int) else 8)
    fits = engine is not None and engine.max_seq_len >= seq_len and engine.max_batch >= batch \
        and engine.max_draft_tokens >= (max_draft if drafter is not None else 0) \
        and (drafter is None or engine.max_tree_nodes >= tree_nodes)
    if not fits:
        context = _exact_context(owner)
        want = max(_MIN_SEQ_LEN, 1 << (seq_len - 1).bit_length())
        if engine is not None:
            want = max(want, engine.max_seq_len)
            batch = max(batch, engine.max_batch)
        if context is not None:
            if seq_len > context:
                raise ValueError(f"prompt + max_new_tokens = {seq_len} tokens exceeds the model's context of "
                                 f"{context} tokens")
            want = min(want, context)
        buckets = 1 << max(batch - 1, 0).bit_length()
        store.pop(key, None)
        engine = None  # free the old engine's cache and graphs before allocating the new one
        fast_models = owner.__dict__.setdefault("_specdec_fast_models", _Cached())
        fast_model = fast_models.get(device)
        config = EngineConfig(max_batch_size=min(buckets, 64), max_seq_len=want, num_draft_tokens="auto",
                              max_draft_tokens=max_draft, max_tree_nodes=max(EngineConfig.max_tree_nodes, tree_nodes),
                              cuda_graphs=False if is_loop_only(drafter) else None)  # (loop drafters: host reads)
        engine = Engine(fast_model if fast_model is not None else target, drafter, config)
        fast_models[device] = engine.model
        store[key] = (_ref(drafter), engine)
    return engine


def _device(owner) -> str:
    if isinstance(owner, torch.nn.Module):
        param = next(owner.parameters(), None)
        return str(param.device) if param is not None else "cpu"
    return str(getattr(owner, "device", "cpu"))


def _ref(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # None and other objects without weak references
        return lambda: obj


def _exact_context(owner) -> int | None:
    """The model's context, or less where the engine computes it exactly only so far (LongRoPE's short range)."""
    context = context_length(owner)
    try:
        shape = owner.shape if isinstance(owner, FastLlama) else LlamaShape.from_hf(owner.config)
    except (ValueError, TypeError, AttributeError):
        return context
    limit = shape.arch.rope_limit
    return context if limit is None else min(context or limit, limit)


def engine_stream(target, prompts, drafter, params: SamplingParams, num_draft_tokens=4, *, generator=None,
                  attention_mask=None) -> GenerationStream:
    """`specdec.stream_request` on the engine (arguments validated now; see the module doc): prompt i runs as a
    request with `params` and the seed (s, i)."""
    policy = None  # a draft-length policy (`engine.policy_loop`): a name or a `DraftLengthPolicy`
    if num_draft_tokens != "auto" and (isinstance(num_draft_tokens, (str, DraftLengthPolicy)) or not isinstance(
            num_draft_tokens, (bool, float, type(None))) and not hasattr(num_draft_tokens, "__index__")):
        policy = resolve_policy(num_draft_tokens)  # (checked — an object of another class refused, naming what it
        # lacks: `policy.check_policy` — and reset for this call, with a drafter or not)
    elif num_draft_tokens != "auto" and (isinstance(num_draft_tokens, bool) or not hasattr(num_draft_tokens,
                                                                                         "__index__")):
        raise ValueError(f"num_draft_tokens must be an integer >= 1, 'auto', a policy name or a DraftLengthPolicy, "
                         f"got {num_draft_tokens!r}")
    if drafter is None:
        gamma, policy = 0, None
    elif policy is not None:
        gamma = policy
    elif num_draft_tokens == "auto":
        gamma = "auto"
    else:
        gamma = check_num_draft_tokens(num_draft_tokens)
    owner = _owner(target)
    if isinstance(owner, FastLlama):
        vocab = owner.shape.vocab_size
    elif getattr(owner, "config", None) is None:
        raise UnsupportedModel(f"the engine needs a transformers model, got {type(target).__name__}")
    else:
        vocab = vocab_size(owner)
    rows = normalize_prompts(prompts, attention_mask, vocab)
    seed = params.seed
    if generator is not None:
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator, device=generator.device))
    base_seed = resolve_seed(seed)
    per_row = [replace(params, seed=_request_seed(base_seed, i)) for i in range(len(rows))]
    tree = params.draft_tree  # sizes the engine: γ up to its depth, its nodes
    gamma_bound = declared_max(policy) if policy is not None else gamma  # (a policy: the largest γ it asks)
    sizing = gamma_bound if tree is None else max(len(tree), gamma_bound if isinstance(gamma_bound, int) else 8)
    nodes = 0 if tree is None else sum(math.prod(tree[:d]) for d in range(len(tree) + 1))
    engine = engine_for(target, drafter, seq_len=max(len(r) for r in rows) + params.max_new_tokens, batch=len(rows),
                        num_draft_tokens=sizing, tree_nodes=nodes)
    holder: dict = {}
    return GenerationStream(_run(engine, rows, per_row, gamma, holder), holder)


def _run(engine: Engine, rows, params, gamma, holder) -> Iterator[TokenEvent]:
    start = time.perf_counter()
    engine.policy.set_fixed(gamma)  # (a `DraftLengthPolicy`: asked and told every step, `engine.policy_loop`)
    engine.stats = SpecStats()
    ids = [engine.add_request(row, p) for row, p in zip(rows, params)]
    index = {rid: i for i, rid in enumerate(ids)}
    pending = set(ids)
    outputs: list[list[int]] = [[] for _ in rows]
    prefill = 0.0
    step = 0
    token = engine.__dict__["_generate_call"] = object()  # the call stepping this (cached) engine now
    try:
        while pending and engine.has_unfinished():
            if engine.__dict__.get("_generate_call") is not token:
                raise ValueError("drafter: the engine of this target and drafter is serving another generate/stream "
                                 "call, started before this one finished: finish or close one stream first")
            event_rows, event_tokens, finished = [], [], []
            for out in engine.step():
                i = index.get(out.request_id)
                if i is None:  # a request of a call this one took the engine over from
                    continue
                if out.finished:
                    pending.discard(out.request_id)
                if out.new_token_ids:
                    outputs[i].extend(out.new_token_ids)
                    event_rows.append(i)
                    event_tokens.append(out.new_token_ids)
                if out.finished:
                    finished.append(i)
                    if out.stats is not None:
                        prefill += out.stats.prefill_time_s
            yield TokenEvent(step=step, rows=event_rows, tokens=event_tokens, finished=finished)
            step += 1
    finally:
        for rid in ids:  # a stream closed early leaves nothing running
            engine.abort(rid)
        if engine.__dict__.get("_generate_call") is token and engine.has_unfinished():
            engine.step()  # (not while another call steps it: this step's outputs would be that call's)
        if engine.__dict__.get("_generate_call") is token and engine.policy.loop is not None:
            engine.policy.set_fixed("auto")  # (the kept engine holds no caller's policy after the call)
    stats = engine.stats
    stats.add_prefill(prefill, sum(1 for r in rows if len(r) > 1))
    stats.set_wall_time(time.perf_counter() - start)
    holder["result"] = GenerateResult(outputs, stats)


def release_engines(target) -> None:
    """Drop the engines (slot caches, CUDA graphs) and fast copies cached on `target` by `specdec.generate`.

    Needed before tearing down a process group: graphs that captured NCCL collectives must be destroyed before
    their communicator is, or `destroy_process_group` blocks.
    """
    owner = _owner(target)
    owner.__dict__.pop("_specdec_engines", None)
    owner.__dict__.pop("_specdec_fast_models", None)
