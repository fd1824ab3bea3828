"""One decode step shape of the engine (batch bucket, γ, length bucket, flavor): its draft and verify halves,
run eagerly or captured once as CUDA graphs and replayed; each row verifies at most its own draft cap
(`StepParts.draft_caps`, a static tensor: per-row caps add no shape) and what its budget can still commit. The verify
half verifies, commits and counts on the device and packs the step's one device → host transfer (`step.pack_step`; `Runner.run` reads it back as a
`step.StepRecord`); an all-greedy step does all of that after the forward in three launches (`fast.kernels.argmax`,
`greedy_commit`)."""

from __future__ import annotations

import torch

from specdec import rng
from specdec.core import TEMPERATURE_FLOOR, VerifyResult, invalid_scores, verify, verify_coupled, verify_greedy
from specdec.core.proposals import proposal_check
from specdec.drafters.base import empty_proposal
from specdec.engine.drafters import Flavor, StepView
from specdec.engine.greedy_commit import covers as greedy_commit_covers
from specdec.engine.greedy_commit import greedy_commit
from specdec.engine.runner_parts import StepParts
from specdec.fast.graphs import CapturedStep
from specdec.fast.kernels.argmax import greedy_tokens
from specdec.sequences import write_tokens
from specdec.step import StepCounts, StepLayout, commit_counts, pack_step, step_counters

__all__ = ["StepRunner"]


class CapturedHalves:
    """A step shape's draft and verify halves, run eagerly or replayed as CUDA graphs captured once: the one
    capture/replay rule of `StepRunner` and `tree_step.TreeStepRunner`. A subclass gives `draft_body`,
    `verify_body`, `eager`, and the tensors each capture must restore (`_draft_restore`: None = a static proposal,
    drafted once and never replayed; `_verify_restore`)."""

    parts: StepParts
    _draft_graph = _verify_graph = None
    _host_table = _copied = None  # the verify table's pinned host copy and its event (`verify`)

    @property
    def captured(self) -> bool:
        """Whether its graphs are captured (by `Engine.warmup` or a first run on CUDA)."""
        return self._verify_graph is not None

    def capture(self) -> None:
        """Capture both halves once (CUDA graphs); a no-op when the step runs eagerly."""
        if self.eager or self._verify_graph is not None:
            return
        pool, restore = self.parts.graph_pool, self._draft_restore()
        if restore is None:
            self.drafts = self.draft_body()
        else:
            self._draft_graph = CapturedStep(self.draft_body, pool=pool, restore=restore)
            self.drafts = self._draft_graph.outputs
            self._draft_graph.replay()  # capture only records: give the verify warm-up real drafts to read
        self._verify_graph = CapturedStep(self.verify_body, pool=pool, restore=self._verify_restore())

    def draft(self) -> None:
        if self.eager:
            self.drafts = self.draft_body()
            return
        self.capture()
        if self._draft_graph is not None:
            self._draft_graph.replay()

    def launch_verify(self) -> torch.Tensor:
        """The verify half launched and not waited for → its `pack_step` table on the device (async scheduling reads
        it later behind an event, `engine/async_steps.py`); eager, as the body returns it."""
        if self.eager:
            return self.verify_body()
        self.capture()
        return self._verify_graph.replay()

    def verify(self) -> torch.Tensor:
        """The step's table (`pack_step`): from a graph replay it comes back in pinned host memory, read with one
        asynchronous copy and an event (a pageable `.tolist()` of the device table cost the host ~30 µs a step
        on an H200); eager, as the body returns it."""
        if self.eager:
            return self.verify_body()
        self.capture()
        packed = self._verify_graph.replay()
        host = self._host_table
        if host is None or host.shape != packed.shape:
            host = self._host_table = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._copied = torch.cuda.Event()
        host.copy_(packed, non_blocking=True)
        self._copied.record()
        self._copied.synchronize()
        return host


class StepRunner(CapturedHalves):
    """The draft and verify halves of one step shape, eager or captured (each once)."""

    def __init__(self, parts: StepParts, batch: int, gamma: int, positions: int, flavor: Flavor):
        self.parts, self.batch, self.gamma, self.positions, self.flavor = parts, batch, gamma, positions, flavor
        self.view = StepView(parts.state, batch, positions, flavor)
        self.view.coupled = parts.config.bitwise  # drafts race q with the target's noise (`verify_coupled`)
        self.layout = StepLayout(gamma, logprobs=flavor.logprobs, top_logprobs=flavor.top_logprobs,
                                 drafter=type(parts.drafter).__name__)  # (named by an invalid proposal's error)
        self.drafts = None
        self.ran = False
        self._draft_graph = self._verify_graph = None

    # The graph bodies read and write only the runner's static tensors (state, caches, these drafts).
    def draft_body(self):
        """The draft half, a `Proposal` (drafts [b, γ], q, lengths): what the draft graph captures."""
        e, gamma = self.parts, self.gamma
        if gamma == 0:
            return empty_proposal(self.view.lengths.shape[0], e.device)  # the bucket, cut at max_batch_size
        return e.drafter.propose(self.view, gamma)

    def verify_body(self) -> torch.Tensor:
        """Verify and commit on the device → the step's transfer, `pack_step`'s int64 table for `self.layout`
        (`StepRecord.unpack` reads it). The acceptance counters stay on the device: they are added into
        `state.counters` (per slot) and `parts.counter_sums`."""
        e, view, gamma, flavor = self.parts, self.view, self.gamma, self.flavor
        rows, state = slice(0, self.batch), e.state
        drafts = self.drafts
        draft_tokens, draft_probs, draft_lengths = drafts.tokens, drafts.probs, drafts.lengths
        lengths = view.lengths
        if gamma:  # a row verifies at most its cap's drafts and what its budget can still commit (the rest is unread)
            room = (state.max_new[rows] - state.generated[rows] - 1).clamp_(0, gamma)
            limit = torch.minimum(e.draft_caps[rows], room)
            draft_lengths = limit if draft_lengths is None else torch.minimum(draft_lengths, limit)
        cache = e.cache.view(rows, self.positions)
        cache.lengths.copy_(lengths - 1)
        last = state.tokens[rows].gather(1, (lengths - 1)[:, None])
        features = state.features
        logits, hidden = self.target_forward(torch.cat([last, draft_tokens], 1), cache)  # [b, γ+1, V]
        synthetic = e.config.synthetic_acceptance
        target_tokens = None
        if flavor.all_greedy and view.processors is None and synthetic is None:  # argmax + NaN check in one pass
            target_tokens, has_nan = greedy_tokens(logits)
            if greedy_commit_covers(flavor, view, synthetic, features):  # the rest in one launch (greedy_commit.py)
                return greedy_commit(target_tokens, draft_tokens, draft_lengths, state, rows, lengths,
                                     e.counter_sums, e.max_draft_tokens, has_nan)
        else:
            has_nan = invalid_scores(logits)
        raw, logits = logits, view.process(logits, draft_tokens)  # p̃ along the draft (raw without processors)
        if synthetic is not None:  # BENCHMARK ONLY (EngineConfig): accept each draft with a fixed probability
            offsets = torch.arange(gamma, device=e.device)[None, :]
            accepted = rng.uniforms(view.seed, lengths[:, None] + offsets, rng.ACCEPT) < synthetic
            n = accepted.long().cumprod(1).sum(1)
            n = n if draft_lengths is None else torch.minimum(n, draft_lengths)
            result = VerifyResult(n, logits.argmax(-1).gather(1, n[:, None]).squeeze(1), accepted.float())
        elif flavor.all_greedy:
            result = verify_greedy(draft_tokens, logits, draft_lengths=draft_lengths, check_nan=False,
                                   leniency=view.leniency if flavor.lenient else 1.0, target_tokens=target_tokens)
        elif e.config.bitwise:  # each position raced with plain decoding's noise: plain's tokens for any γ
            result = verify_coupled(draft_tokens, _target_draws(view.probs(logits), view.seed, lengths),
                                    draft_lengths=draft_lengths)
        else:
            target_probs = view.probs(logits)
            offsets = torch.arange(gamma, device=e.device)[None, :]
            uniforms = rng.uniforms(view.seed, lengths[:, None] + offsets, rng.ACCEPT)
            noise = rng.exponentials(view.seed, lengths[:, None], rng.NEXT, logits.shape[-1])[:, 0]
            result = verify(draft_tokens, draft_probs, target_probs, None, draft_lengths=draft_lengths,
                            uniforms=uniforms, noise=noise, leniency=view.leniency if flavor.lenient else 1.0)
            if flavor.lenient:
                result = _greedy_rows_lenient(result, view, draft_tokens, logits, draft_lengths)
        new_tokens = result.tokens(draft_tokens)  # [b, γ+1]
        active, generated = state.active[rows], state.generated[rows]
        counts, hit_eos = commit_counts(new_tokens, result.num_accepted, state.max_new[rows] - generated,
                                        state.eos[rows], active)
        write_tokens(state.tokens[rows], lengths, new_tokens, counts)
        if features is not None:  # the features of the committed prefix: positions lengths − 1 + i, i < counts
            state.feature_store.write_run(rows, lengths - 1, hidden, counts)
        if view.history is not None:  # the committed tokens' counts (rejected drafts never get here)
            keep = torch.arange(gamma + 1, device=e.device)[None, :] < counts[:, None]
            view.history.counts.scatter_add_(1, new_tokens, keep.float())
        lengths.add_(counts)
        generated.add_(counts)
        finished = active & (hit_eos | (generated >= state.max_new[rows]))
        counters = step_counters(result.num_accepted, result.beta, draft_lengths, active, gamma)  # [b, width(γ)]
        wide = StepCounts.widen(counters, gamma, e.max_draft_tokens)
        state.counters[rows].add_(wide)
        e.counter_sums.add_(wide.sum(0))
        logprobs = top = None
        if flavor.logprobs:  # of the target's raw law (before processors and temperature), as vLLM's default
            log_p = raw.float().log_softmax(-1)
            logprobs = log_p.gather(-1, new_tokens[..., None])[..., 0]
            if flavor.top_logprobs:
                values, ids = log_p.topk(flavor.top_logprobs, dim=-1)
                top = (ids, values)
        # the drafter's ids and q checked on the device (`core.proposals`), read with the table: no sync here
        check = proposal_check(draft_tokens, draft_probs, draft_lengths, e.vocab_size, active) if gamma else None
        return pack_step(self.layout, new_tokens, counts, result.num_accepted, draft_lengths, finished, hit_eos,
                         active, has_nan, logprobs=logprobs, top=top, proposal=check)

    def target_forward(self, tokens: torch.Tensor, cache):
        """The target's scores of the verify rows' tokens `[b, γ+1]` → (logits `[b, γ+1, V]`, hidden `[b, γ+1, ·]`);
        a mixed step's runner (`mixed_step.MixedStepRunner`) feeds the filling rows' chunks in the same forward."""
        return self.parts.model(tokens, cache, return_hidden=True)

    @property
    def eager(self) -> bool:
        """Runs without graphs: the engine runs eagerly, or a row's constraint is called on the host mid-step."""
        return not self.parts.cuda_graphs or self.flavor.constrained

    def _draft_restore(self) -> list | None:
        if self.gamma == 0:
            return None  # nothing to draft: a static empty proposal
        if not self.parts.drafter_cached:
            return []
        cache = self.parts.drafter.cache  # (a hierarchy's `slot_group.CacheGroup`: every model's)
        return getattr(cache, "lengths_all", None) or [cache.lengths]

    def _verify_restore(self) -> list:
        e, s = self.parts, self.parts.state
        restore = [s.tokens, s.lengths, s.generated, e.cache.lengths, s.counters, e.counter_sums]
        return restore + ([s.history.counts] if s.history is not None else [])


def _greedy_rows_lenient(result: VerifyResult, view: StepView, draft_tokens: torch.Tensor, logits: torch.Tensor,
                         draft_lengths: torch.Tensor | None) -> VerifyResult:
    """A greedy row among sampled ones: with one-hot p and q the general rule is the exact argmax rule, but
    lenience is defined before standardizing (accept x when p(x) ≥ l·max p under softmax(logits)), so those rows
    take `verify_greedy`'s outcome; a request's tokens then do not depend on the temperatures beside it."""
    greedy = verify_greedy(draft_tokens, logits, draft_lengths=draft_lengths, check_nan=False, leniency=view.leniency)
    rows = view.temperature < TEMPERATURE_FLOOR  # [b]
    return VerifyResult(torch.where(rows, greedy.num_accepted, result.num_accepted),
                        torch.where(rows, greedy.next_token, result.next_token),
                        torch.where(rows[:, None], greedy.beta.to(result.beta.dtype), result.beta))


def _target_draws(probs: torch.Tensor, seed: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The target's own draw at each verified position `[b, γ+1]` from probs `[b, γ+1, V]`: the race with the noise
    plain decoding uses there (stream NEXT at absolute position lengths + i)."""
    b, k, vocab = probs.shape
    positions = lengths[:, None] + torch.arange(k, device=probs.device)[None, :]
    return rng.sample(probs.reshape(b * k, vocab), seed.repeat_interleave(k), positions.reshape(-1),
                      rng.NEXT).view(b, k)
