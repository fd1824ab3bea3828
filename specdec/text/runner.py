"""What the text layer drives: a request-level runner (add_request / abort / step), and the fallback runner.

The request-level engine (`specdec.engine.Engine`) is a runner. `FallbackRunner` gives the same interface
for targets the engine does not cover (encoder-decoder, GPT-2, ...): it serves requests through the eager
loop `specdec.stream(...)`, a batch of requests at a time when their sampling parameters match.
`add_request` and `abort` are thread-safe; `step` is called from one thread (the `Driver`).
`build_runner(target, drafter, RunnerSpec)`: the one runner an `LLM` holds, serving every request's γ.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import torch

from specdec.metrics import SpecStats
from specdec.policy import DraftLengthPolicy, resolve_policy
from specdec.request import SamplingParams, as_int, context_length, vocab_size
from specdec.step import RequestOutput, StepCounts

__all__ = ["RequestOutput", "Runner", "FallbackRunner", "RunnerSpec", "build_runner", "context_length",
           "DEFAULT_CONTEXT"]

logger = logging.getLogger(__name__)

#: Context assumed for a model whose config names none (relative-position models such as T5).
DEFAULT_CONTEXT = 4096


@runtime_checkable
class Runner(Protocol):
    """A request-level runner: `specdec.engine.Engine` or `FallbackRunner`."""

    vocab_size: int
    max_seq_len: int

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list: ...

    def has_unfinished(self) -> bool: ...


@dataclass(frozen=True)
class RunnerSpec:
    """What an `LLM` asks of its runner (`specdec.load`'s options; see there)."""

    runner: str  # "auto" | "engine" | "fallback"
    num_draft_tokens: int | str  # the default γ of a request that names none
    options: Mapping = field(default_factory=dict)  # the engine options given (`text.options`: EngineConfig's fields)


def build_runner(target, drafter, spec: RunnerSpec) -> tuple["Runner", dict | None]:
    """(the request-level engine — a fast family body or the transformers backend, `EngineConfig.model_impl` —
    falling back to the eager loop's `FallbackRunner` only where the engine refuses the model or drafter
    (`UnsupportedModel`, with runner="auto"), its start-up warm-up report on CUDA or None). One runner for every γ: it holds the
    drafter, and plain requests run on it too (rows capped at 0, `SamplingParams.num_draft_tokens`). A default γ that
    is a draft-length policy — its name ("heuristic", ...: `specdec.policy.resolve_policy`, a misspelled one refused
    by name) or a `DraftLengthPolicy` object (`specdec.policy.check_policy`) — runs on the engine too: built as for
    "auto" (`max_draft_tokens` at least the policy's `declared_max`), then `engine.policy.set_fixed(policy)` — the
    policy chooses every step's γ, up to the engine's `max_draft_tokens`, for the rows that name no γ of their own."""
    gamma, options = spec.num_draft_tokens, dict(spec.options)
    if spec.runner != "fallback":
        from specdec.engine import Engine, UnsupportedModel
        from specdec.engine.policy_loop import declared_max
        from specdec.text.options import engine_config
        from specdec.text.warmup import MAX_WARMUP_SHAPES, warm_up

        chosen = isinstance(gamma, DraftLengthPolicy) or isinstance(gamma, str) and gamma != "auto"
        policy = resolve_policy(gamma) if chosen else None  # (a name checked now, by name; an object by its methods)
        impl = options.get("model_impl", "auto")  # "auto": a model the fast bodies do not cover takes the backend
        config = engine_config(options, "auto" if chosen else gamma)  # (a policy: the engine sized as for "auto",
        if policy is not None and "max_draft_tokens" not in options:  # and to the largest γ it declares)
            config = replace(config, max_draft_tokens=max(config.max_draft_tokens, declared_max(policy)))
        try:
            engine = Engine(target, drafter, config=config)
        except UnsupportedModel as err:
            if spec.runner == "engine" or options.get("bitwise") or impl == "transformers":
                raise
            from specdec.engine.build import notice_fallback

            notice_fallback(str(err))
        else:
            if policy is not None:
                engine.policy.set_fixed(policy)  # asked every step, told every outcome (`engine.policy_loop`)
            if not engine.cuda_graphs:
                return engine, None
            report = warm_up(engine, engine.max_batch)  # every decode shape (plain's too) now, not while serving
            logger.info("num_draft_tokens=%s: captured %d decode step shapes in %.1f s (batch sizes %s, γ %s, "
                        "%d length buckets%s)", gamma, report["shapes"], report["seconds"], report["batch_sizes"],
                        report["gammas"], report["length_buckets"], "" if report["complete"] else
                        f" up to {report['max_length']} tokens: longer requests capture on first use (bound: "
                        f"{MAX_WARMUP_SHAPES} shapes)")
            return engine, report
    from specdec.text.options import ENTRY_DEFAULTS, loop_refusal

    refusal = loop_refusal(options)
    if refusal is not None:
        raise ValueError(refusal)
    return FallbackRunner(target, drafter, num_draft_tokens=gamma,
                          max_batch_size=options.get("max_batch_size") or ENTRY_DEFAULTS["max_batch_size"],
                          max_seq_len=options.get("max_seq_len")), None


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    generated: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    done: bool = False


class FallbackRunner:
    """The runner interface over the eager loop (`specdec.stream`), for any target `specdec.generate` takes.

    A batch is formed from waiting requests with the same sampling parameters and EOS ids (a seeded sampled
    request runs alone, so its tokens depend only on its seed); the batch runs to its end while new requests
    wait. An aborted request leaves at the next step; a batch whose requests are all aborted stops at once.
    Per-request counts come from the loop's step record (`TokenEvent.counts`: the row's own drafts, accepted
    drafts and Σβ), folded into the request's `SpecStats` and the runner's.
    """

    def __init__(self, target, drafter=None, *, num_draft_tokens=4, max_batch_size: int = 8,
                 max_seq_len: int | None = None):
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = _loop_policy(num_draft_tokens)  # of a request that names none
        if drafter is not None:
            resolve_policy(self.num_draft_tokens)  # validate now, not at the first request
        self.max_batch_size = as_int(max_batch_size, "max_batch_size", minimum=1)
        self.vocab_size = vocab_size(target)
        context = context_length(target) or DEFAULT_CONTEXT
        self.max_seq_len = context if max_seq_len is None else as_int(max_seq_len, "max_seq_len", minimum=2, maximum=context)
        self.stats = SpecStats()
        self._lock = threading.Lock()
        self._waiting: deque[_Request] = deque()
        self._aborted: set[str] = set()
        self._batch: list[_Request] = []
        self._run = None
        self._steps = None
        self._ids = itertools.count()

    # --- thread-safe ----------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.num_draft_tokens not in (None, 0) and self.drafter is None:
            raise ValueError(f"num_draft_tokens={params.num_draft_tokens!r} needs a drafter; this runner has none "
                             "(0 = plain decoding)")
        prompt = [as_int(t, "prompt_ids", minimum=0, maximum=self.vocab_size - 1) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: a prompt needs at least one token")
        if len(prompt) + params.max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                f"context of {self.max_seq_len} tokens"
            )
        with self._lock:
            rid = request_id if request_id is not None else f"fallback-{next(self._ids)}"
            self._waiting.append(_Request(rid, prompt, params))
        return rid

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return sum(not r.done for r in self._batch)

    # --- the stepping thread ----------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._waiting) or self._run is not None

    def step(self) -> list[RequestOutput]:
        outputs = self._apply_aborts()
        if self._run is None:
            self._start_batch()
        if self._run is None:
            return outputs
        event = next(self._steps, None)
        if event is None:  # the loop ended: its stats belong to a batch of one
            self._close_batch()
            return outputs
        for row, tokens, counts in zip(event.rows, event.tokens, event.counts):
            outputs.extend(self._commit(self._batch[row], tokens, counts, row in event.finished))
        if all(r.done for r in self._batch):
            if len(self._batch) == 1 and outputs and outputs[-1].finished and outputs[-1].finish_reason != "abort":
                outputs[-1] = replace(outputs[-1], stats=self._exact_stats(outputs[-1].stats))
            self._close_batch()
        return outputs

    def _exact_stats(self, counted: SpecStats) -> SpecStats:
        """A batch of one: the loop's own SpecStats (with α) once it has run to its end."""
        for _ in self._steps:  # the request is done; the loop ends at once (or after rows past its budget)
            pass
        try:
            return self._run.result.stats
        except RuntimeError:
            return counted

    def _apply_aborts(self) -> list[RequestOutput]:
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            waiting = [r for r in self._waiting if r.request_id in aborted]
            self._waiting = deque(r for r in self._waiting if r.request_id not in aborted)
        outputs = [self._final(r, [], 0, 0, "abort") for r in waiting]
        for r in self._batch:
            if r.request_id in aborted and not r.done:
                outputs.append(self._final(r, [], 0, 0, "abort"))
        if self._batch and all(r.done for r in self._batch):
            self._close_batch()
        return outputs

    def _start_batch(self) -> None:
        with self._lock:
            if not self._waiting:
                return
            first = self._waiting.popleft()
            batch = [first]
            key = _batch_key(first)
            if key is not None:
                for r in list(self._waiting):
                    if len(batch) >= self.max_batch_size:
                        break
                    if _batch_key(r) == key:
                        batch.append(r)
                        self._waiting.remove(r)
        from specdec.decoding import stream_request

        # the batch shares its parameters (`_batch_key`) but for the budget; logprobs come from `_logprobs`
        params = replace(first.params, max_new_tokens=max(r.params.max_new_tokens for r in batch), logprobs=False,
                         top_logprobs=0)
        # the batch's γ (`_batch_key` keeps one per batch): its own, else the runner's; 0 = plain, without the drafter
        spec = self.num_draft_tokens if first.params.num_draft_tokens is None else first.params.num_draft_tokens
        drafter = self.drafter if spec != 0 else None
        policy = resolve_policy(_loop_policy(spec)) if drafter is not None else 1
        self._batch = batch
        self._run = stream_request(self.target, [r.prompt for r in batch], drafter, params, policy, engine="hf")
        self._steps = iter(self._run)

    def _close_batch(self) -> None:
        self._run = self._steps = None
        self._batch = []

    def _commit(self, req: _Request, tokens: list[int], counts: StepCounts, loop_finished: bool) -> list[RequestOutput]:
        if req.done:
            return []
        budget = req.params.max_new_tokens - len(req.generated)
        tokens = tokens[:budget]
        req.generated.extend(tokens)
        accepted, drafted = min(counts.num_accepted, len(tokens)), counts.num_drafted
        for stats in (req.stats, self.stats):
            stats.add_counts(counts)
            stats.add_steps(0, num_generated_tokens=len(tokens))
        logprobs, top = self._logprobs(req, len(tokens)) if req.params.logprobs else (None, None)
        hit_eos = bool(tokens) and tokens[-1] in req.params.eos_token_ids
        if hit_eos or len(req.generated) >= req.params.max_new_tokens or loop_finished:
            return [self._final(req, tokens, accepted, drafted, "stop" if hit_eos else "length", logprobs, top)]
        return [RequestOutput(req.request_id, tokens, logprobs, accepted, drafted, False, None, top_logprobs=top)]

    def _final(self, req, tokens, accepted, drafted, reason, logprobs=None, top=None) -> RequestOutput:
        req.done = True
        return RequestOutput(req.request_id, tokens, logprobs, accepted, drafted, True, reason, req.stats, top)

    @torch.inference_mode()
    def _logprobs(self, req: _Request, count: int) -> tuple[list[float], list | None]:
        """log p(token) of the target's raw distribution for the request's last `count` tokens (one teacher-forced
        pass), and per token its `top_logprobs` most likely (token id, log p) (None when it asks for none)."""
        n = req.params.top_logprobs
        if count == 0:
            return [], ([] if n else None)
        device = self.target.device
        if getattr(self.target.config, "is_encoder_decoder", False):
            start = self.target.config.decoder_start_token_id
            decoder = torch.tensor([[start, *req.generated]], device=device)
            logits = self.target(input_ids=torch.tensor([req.prompt], device=device), decoder_input_ids=decoder).logits[0]
            scored = logits[len(req.generated) - count : len(req.generated)]
        else:
            ids = torch.tensor([req.prompt + req.generated], device=device)
            logits = self.target(input_ids=ids).logits[0]
            end = len(req.prompt) + len(req.generated) - 1
            scored = logits[end - count : end]
        logp = torch.log_softmax(scored.float(), dim=-1)
        chosen = logp.gather(1, torch.tensor(req.generated[-count:], device=device)[:, None])[:, 0].tolist()
        if not n:
            return chosen, None
        values, ids = logp.topk(n, dim=-1)
        return chosen, [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]


def _loop_policy(spec):
    """A γ as the eager loop takes it: "auto" is its nearest, the guarded policy; 0 (plain) runs with no drafter."""
    return "guarded" if spec == "auto" else spec


def _batch_key(req: _Request):
    """Requests with equal keys may share a batch; None = must run alone (seeded sampling)."""
    p = req.params
    if not p.greedy and p.seed is not None:
        return None
    return replace(p, max_new_tokens=0, logprobs=False, top_logprobs=0, seed=None)  # all that the loop shares but the budget
