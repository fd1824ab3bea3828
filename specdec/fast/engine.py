"""The fused decode step: draft → verify → emit → roll back as CUDA-graph replays, one host sync per step.

`fast_generate(target, prompts, drafter=None, ...)` runs the same algorithm as `specdec.generate`
(Algorithm 1: `core.verify` / `core.verify_greedy` with `check_nan=False` and explicit noise) with a `FastTarget`:

  per step   draft graph      e0→e1   a `FastDrafter` drafts γ tokens straight from the committed-token
                                      buffer; prompt lookup (and greedy n-gram tables) are captured too;
                                      other drafters run eagerly and their proposal is copied in
             verify graph     e1→e2   target pass over [last, x_1..x_γ] → accept → append to the token
                                      buffer in place → EOS / max_new_tokens cut → crop (a pointer move)
                                      → device-side SpecStats counters → "all rows finished" flag
             host reads the flag: the step's only synchronization; e0/e1/e2 are CUDA events
Random numbers are drawn from the caller's generator, in place, into the graphs' static inputs.
Finished rows stay in the batch (static shapes), masked out. Outputs and counters are read once at the end.
`auto_off=True` probes a few speculative and a few plain steps and keeps whichever makes tokens faster
(so speculation never makes a batch much slower than plain decoding).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.core import SamplingConfig, VerifyResult, standardize_logits, verify, verify_greedy
from specdec.request import as_drafter, normalize_prompts, resolve_eos
from specdec.step import Clock, GenerateResult, StepCounts
from specdec.drafters.base import Drafter
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.fast.graphs import CapturedStep
from specdec.fast.target import FastDrafter, FastTarget, draft_from_buffer
from specdec.metrics import SpecStats

__all__ = ["fast_generate", "FastEngine"]

_PROBE_STEPS = 4  # per phase of the auto_off probe (the first step of a phase is not timed)

# Step timings: CUDA events on GPU, perf_counter on CPU, read after the step's host sync.
_Timer = Clock


class _Step:
    """`fn()` → tuple of tensors. With graphs it is captured once and its outputs are static tensors;
    without, each call runs `fn` eagerly and `outputs` holds the latest results."""

    def __init__(self, fn: Callable[[], tuple], graphs: bool, pool=None, restore=()):
        self.fn, self.graphs, self.outputs = fn, graphs, None
        if graphs:
            self.captured = CapturedStep(fn, pool=pool, restore=restore)
            self.outputs = self.captured.outputs

    def __call__(self) -> tuple:
        if self.graphs:
            self.captured.replay()
        else:
            self.outputs = self.fn()
        return self.outputs


@dataclass
class _Plan:
    """Static tensors and steps of one step shape: (γ, sampling, EOS count, synthetic α)."""

    gamma: int
    draft_noise: torch.Tensor | None = None  # [B, γ, V] Exp(1) for a sampling FastDrafter
    rand: dict = field(default_factory=dict)  # verify's uniforms [B, γ] / noise [B, V], drawn in place
    draft: _Step | None = None
    inputs: dict | None = None  # what the verify step reads: draft_tokens / draft_probs / draft_lengths + rand
    copy_in: bool = False  # eager drafter feeding a captured verify: copy its proposal into static inputs
    verify: _Step | None = None
    forward_passes: int = 0


class FastEngine:
    """Owns the static step buffers of one (target, drafter) pair; reuses graphs across same-shape requests."""

    def __init__(self, target: FastTarget, drafter: Drafter | None = None):
        if not isinstance(target, FastTarget):
            raise TypeError(f"fast_generate needs a FastTarget, got {type(target).__name__}")
        self.target = target
        self.drafter = as_drafter(drafter, target)
        self._static: dict = {}
        self._plans: dict = {}
        self.last_auto_off_decision: int | None = None

    # ----------------------------------------------------------------------------------------- buffers
    def _buffers(self, batch: int, capacity: int, max_gamma: int) -> dict:
        drafter_cache = self.drafter.lm.cache if isinstance(self.drafter, FastDrafter) else None
        key = (batch, capacity, max_gamma, id(self.target.cache), id(drafter_cache))
        if self._static.get("key") != key:
            dev = self.target.device
            self._plans.clear()
            self._static = {
                "key": key,
                "tokens": torch.zeros(batch, capacity, dtype=torch.long, device=dev),
                "lengths": torch.zeros(batch, dtype=torch.long, device=dev),
                "generated": torch.zeros(batch, dtype=torch.long, device=dev),
                "finished": torch.zeros(batch, dtype=torch.bool, device=dev),
                "max_new": torch.zeros((), dtype=torch.long, device=dev),
                "flags": torch.zeros(2, dtype=torch.bool, device=dev),  # [all rows finished, NaN logits seen]
                "counters": {},  # γ → [2γ + 5] float64: reached[γ], accepted[γ], β-sum, Σn, Σdrafted, rows drafting, active
            }
        return self._static

    def _counters(self, s: dict, gamma: int) -> torch.Tensor:
        if gamma not in s["counters"]:
            s["counters"][gamma] = torch.zeros(2 * gamma + 5, dtype=torch.float64, device=self.target.device)
        return s["counters"][gamma]

    # ----------------------------------------------------------------------------------------- one step
    def _plan(self, context, gamma: int, sampling: SamplingConfig, eos_ids, synthetic, generator) -> _Plan:
        key = (gamma, sampling, None if eos_ids is None else eos_ids.numel(), synthetic)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        s, target, drafter = self._static, self.target, self.drafter
        graphs, device, batch = target.cuda_graphs, target.device, context.batch_size
        plan = _Plan(gamma)
        if gamma and isinstance(drafter, FastDrafter):
            if not sampling.greedy:
                plan.draft_noise = torch.empty(batch, gamma, drafter.vocab_size, device=device).exponential_(
                    generator=generator)

            def draft_fn():
                return draft_from_buffer(drafter, s["tokens"], s["lengths"], gamma, sampling, plan.draft_noise)[:2]

            use_graph = graphs and drafter.lm.cuda_graphs
            plan.draft = _Step(draft_fn, use_graph, drafter.lm.pool() if use_graph else None,
                               restore=[drafter.lm.cache.lengths])
            plan.forward_passes = gamma
        elif gamma and graphs and _graph_safe(drafter, sampling):
            def draft_fn():
                p = drafter.propose(context, gamma, sampling, None, None)
                return p.tokens, p.probs, p.lengths

            plan.draft = _Step(draft_fn, True, target.pool())
        elif gamma:
            def draft_fn():
                p = drafter.propose(context, gamma, sampling, generator, None)
                plan.forward_passes = p.forward_passes
                return p.tokens, p.probs, p.lengths

            plan.draft = _Step(draft_fn, False)
        else:
            plan.inputs = {"draft_tokens": torch.zeros(batch, 0, dtype=torch.long, device=device)}
        if not sampling.greedy or (gamma and synthetic is not None):
            plan.rand["uniforms"] = torch.rand(batch, gamma, generator=generator, device=device)
        if not sampling.greedy and synthetic is None:
            plan.rand["noise"] = torch.empty(batch, target.vocab_size, device=device).exponential_(generator=generator)
        self._plans[key] = plan
        return plan

    def _run_step(self, plan: _Plan, sampling: SamplingConfig, eos_ids, synthetic, generator) -> None:
        """Draft (graph or eager), draw the verify randomness in place, verify (graph or eager)."""
        if plan.draft is not None:
            if plan.draft_noise is not None:
                plan.draft_noise.exponential_(generator=generator)
            outputs = plan.draft()
            named = {n: t for n, t in zip(("draft_tokens", "draft_probs", "draft_lengths"), outputs) if t is not None}
            if sampling.greedy:
                named.pop("draft_probs", None)
            if plan.inputs is None:
                plan.copy_in = self.target.cuda_graphs and not plan.draft.graphs
                plan.inputs = {n: t.clone() for n, t in named.items()} if plan.copy_in else dict(named)
                plan.inputs.update(plan.rand)
            elif plan.copy_in:
                for n, t in named.items():
                    plan.inputs[n].copy_(t)
            else:
                plan.inputs.update(named)
        elif plan.rand and set(plan.rand) - set(plan.inputs):
            plan.inputs.update(plan.rand)
        self.timer.mark(1)
        if "uniforms" in plan.rand:
            plan.rand["uniforms"].uniform_(generator=generator)
        if "noise" in plan.rand:
            plan.rand["noise"].exponential_(generator=generator)
        if plan.verify is None:
            s, target = self._static, self.target
            counters = self._counters(s, plan.gamma)
            body = self._verify_body(s, plan.inputs, plan.gamma, sampling, eos_ids, synthetic, counters)
            restore = [s["tokens"], s["lengths"], s["generated"], s["finished"], s["flags"], counters,
                       target.cache.lengths]
            plan.verify = _Step(body, target.cuda_graphs, target.pool() if target.cuda_graphs else None, restore)
        plan.verify()

    def _verify_body(self, s: dict, inputs: dict, gamma: int, sampling: SamplingConfig, eos_ids, synthetic,
                     counters: torch.Tensor):
        target = self.target
        tokens, lengths, generated, finished = s["tokens"], s["lengths"], s["generated"], s["finished"]
        capacity = tokens.shape[1]

        def body():
            draft_tokens = inputs["draft_tokens"]
            draft_probs = inputs.get("draft_probs")
            draft_lengths = inputs.get("draft_lengths")
            last = tokens.gather(1, (lengths - 1)[:, None])
            block = torch.cat([last, draft_tokens], 1)  # [B, γ+1]
            target.cache.lengths.copy_(lengths - 1)
            logits = target.model(block, target.cache)  # [B, γ+1, V]
            s["flags"][1].logical_or_(torch.isnan(logits).any())  # checked on the host with the step's flag
            if synthetic is not None:  # BENCHMARK ONLY: accept each draft with probability `synthetic`
                accepted = inputs["uniforms"] < synthetic
                n = accepted.long().cumprod(1).sum(1)
                next_token = logits.argmax(-1).gather(1, n[:, None]).squeeze(1)
                result = VerifyResult(num_accepted=n, next_token=next_token, beta=accepted.float())
            elif sampling.greedy:
                result = verify_greedy(draft_tokens, logits, draft_lengths=draft_lengths, check_nan=False)
            else:
                probs = standardize_logits(logits, sampling, check_nan=False)
                result = verify(draft_tokens, draft_probs, probs, None, draft_lengths=draft_lengths,
                                uniforms=inputs["uniforms"], noise=inputs["noise"])
            new_tokens = result.tokens(draft_tokens)  # [B, γ+1]
            active = ~finished
            counts = torch.minimum(result.num_accepted + 1, s["max_new"] - generated) * active
            cols = torch.arange(gamma + 1, device=tokens.device)[None, :]
            hit_eos = torch.zeros_like(active)
            if eos_ids is not None:
                is_eos = torch.isin(new_tokens, eos_ids) & (cols < counts[:, None])
                hit_eos = is_eos.any(1)
                counts = torch.where(hit_eos, is_eos.long().argmax(1) + 1, counts)
            # append in place (TokenBuffer.append's rule: unwritten entries rewrite column 0 with itself)
            write = cols < counts[:, None]
            where = torch.where(write, (lengths[:, None] + cols).clamp(max=capacity - 1), torch.zeros_like(cols))
            tokens.scatter_(1, where, torch.where(write, new_tokens, tokens.gather(1, where)))
            lengths.add_(counts)
            generated.add_(counts)
            finished.logical_or_(active & (hit_eos | (generated >= s["max_new"])))
            target.cache.lengths.copy_(lengths - 1)  # roll back: a pointer move
            _count(counters, result, draft_lengths, active, gamma)
            s["flags"][0].copy_(finished.all())
            return ()

        return body

    # ----------------------------------------------------------------------------------------- generate
    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, num_draft_tokens: int = 4, eos_token_id: "int | Sequence[int] | None" = None,
                 seed: int | None = None, *, generator: torch.Generator | None = None,
                 auto_off: bool = False, synthetic_acceptance: float | None = None) -> GenerateResult:
        """Arguments as `specdec.generate` (num_draft_tokens: a fixed int). auto_off: see the module doc.

        synthetic_acceptance: BENCHMARK ONLY — accept each drafted token with this fixed probability instead
        of the rule, to time the engine at a chosen α; the output is then NOT the target's distribution.
        """
        target, drafter = self.target, self.drafter
        if synthetic_acceptance is not None and not 0.0 <= synthetic_acceptance <= 1.0:
            raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}")
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        rows = normalize_prompts(prompts, None, target.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        gamma = 0 if drafter is None else num_draft_tokens
        if drafter is not None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1):
            raise ValueError(f"fast_generate needs num_draft_tokens as an integer >= 1, got {num_draft_tokens!r}")
        if gamma > target.max_draft_tokens:
            raise ValueError(f"num_draft_tokens {gamma} exceeds the target's max_draft_tokens {target.max_draft_tokens}")
        eos = resolve_eos(eos_token_id, target)
        device = target.device
        if generator is None:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        stats = SpecStats()
        outputs: list[list[int]] = [[] for _ in rows]
        t_start = time.perf_counter()
        if max_new_tokens == 0:
            return GenerateResult(outputs, stats)

        context = target.begin(rows, max_new_tokens)
        stats.target_calls += int(max(len(r) for r in rows) > 1)
        batch = context.batch_size
        if drafter is not None:
            drafter.begin(context, target.vocab_size)
        s = self._buffers(batch, context.capacity, target.max_draft_tokens)
        s["tokens"].copy_(context.tokens)
        s["lengths"].copy_(context.lengths)
        s["generated"].zero_()
        s["finished"].zero_()
        s["max_new"].fill_(max_new_tokens)
        s["flags"].zero_()
        for counters in s["counters"].values():
            counters.zero_()
        context.tokens, context.lengths = s["tokens"], s["lengths"]  # the buffer the graphs read and write
        eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=device) if eos else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats.prefill_time_s = time.perf_counter() - t_start

        self.timer = timer = _Timer(device)
        probe = _Probe(gamma) if auto_off and gamma > 0 else None
        step, done = 0, False
        while not done and step < max_new_tokens:
            g = probe.gamma() if probe is not None else gamma
            plan = self._plan(context, g, sampling, eos_ids, synthetic_acceptance, generator)
            timer.mark(0)
            self._run_step(plan, sampling, eos_ids, synthetic_acceptance, generator)
            if g > 0 and not isinstance(drafter, FastDrafter):
                drafter.commit(context)
            timer.mark(2)
            done, nan = s["flags"].tolist()  # the step's one host synchronization
            if nan:
                raise ValueError("target logits contain NaN; the model produced invalid scores")
            draft_s, verify_s = timer.elapsed(0, 1), timer.elapsed(1, 2)
            stats.num_steps += 1
            stats.target_calls += 1
            stats.drafter_calls += plan.forward_passes
            stats.draft_time_s += draft_s
            stats.verify_time_s += verify_s
            stats.max_num_draft_tokens = max(stats.max_num_draft_tokens, g)
            if probe is not None:
                probe.record(g, draft_s + verify_s, self._counters(s, g))
            step += 1

        gammas = sorted(s["counters"])
        host = torch.cat([s["counters"][g] for g in gammas] + [s["generated"].double(),
                                                                context.start_lengths.double()]).tolist()
        token_rows = s["tokens"].tolist()
        generated, starts = host[-2 * batch : -batch], host[-batch:]
        for b in range(batch):
            start = int(starts[b])
            outputs[b] = token_rows[b][start : start + int(generated[b])]
        offset = 0
        for g in gammas:
            _fill_stats(stats, host[offset : offset + 2 * g + 5], g)
            offset += 2 * g + 5
        stats.num_generated_tokens = sum(len(o) for o in outputs)
        stats.wall_time_s = time.perf_counter() - t_start
        self.last_auto_off_decision = probe.decision if probe is not None else None  # γ kept (0 = turned off)
        return GenerateResult(outputs, stats)


def _graph_safe(drafter: Drafter, sampling: SamplingConfig) -> bool:
    """Drafters whose `propose` is free of host syncs and of the random generator, so it can be captured."""
    if type(drafter) is PromptLookupDrafter:
        return True
    return type(drafter) is NGramDrafter and sampling.greedy


def _count(counters: torch.Tensor, result: VerifyResult, draft_lengths, active, gamma: int) -> None:
    """Add this step's SpecStats counts (same definitions as the decoding loop's `_step_summary`)."""
    n = result.num_accepted
    act = active.double()
    if gamma:
        lengths = draft_lengths if draft_lengths is not None else torch.full_like(n, gamma)
        pos = torch.arange(gamma, device=n.device)[None, :]
        drafted = (pos < lengths[:, None]) & active[:, None]
        reached = (drafted & (pos <= n[:, None])).double()
        accepted = (pos < (n * active)[:, None]).double()
        per_row = torch.cat([reached, accepted, (result.beta.double() * reached).sum(1, keepdim=True),
                             torch.stack([n * active, lengths * active, ((lengths > 0) & active).long()], 1).double(),
                             act[:, None]], 1)
        counters.add_(per_row.sum(0))
    else:
        counters[-1:].add_(act.sum())


class _Probe:
    """auto_off: time a few speculative steps, then a few plain ones; keep the faster per generated token."""

    def __init__(self, gamma: int):
        self.spec_gamma = gamma
        self.phase = 0  # 0 speculative probe, 1 plain probe, 2 decided
        self.steps = 0
        self.decision: int | None = None
        self.time = [0.0, 0.0]
        self.tokens = [0.0, 0.0]
        self._last = None

    def gamma(self) -> int:
        if self.phase == 0:
            return self.spec_gamma
        if self.phase == 1:
            return 0
        return self.decision

    def record(self, gamma: int, seconds: float, counters: torch.Tensor) -> None:
        if self.phase == 2:
            return
        # tokens the algorithm produced in this phase so far: Σn + active row-steps (read only while probing)
        produced = float(counters[-4]) + float(counters[-1]) if gamma else float(counters[-1])
        if self.steps > 0:
            self.time[self.phase] += seconds
            self.tokens[self.phase] += produced - self._last
        self._last = produced
        self.steps += 1
        if self.steps >= _PROBE_STEPS:
            self.phase += 1
            self.steps = 0
            if self.phase == 2:
                spec_rate = self.tokens[0] / max(self.time[0], 1e-12)
                plain_rate = self.tokens[1] / max(self.time[1], 1e-12)
                self.decision = self.spec_gamma if spec_rate >= plain_rate else 0


def _fill_stats(stats: SpecStats, counters: list[float], gamma: int) -> None:
    """Fold one γ's counters into `stats` (called once per γ used; γ = 0 contributes only row-steps)."""
    stats.add_counts(StepCounts.from_row(counters, gamma))


def fast_generate(target: FastTarget, prompts, drafter=None, max_new_tokens: int = 64, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, num_draft_tokens: int = 4, eos_token_id=None,
                  seed: int | None = None, *, generator: torch.Generator | None = None,
                  auto_off: bool = False, synthetic_acceptance: float | None = None) -> GenerateResult:
    """`specdec.generate` for a `FastTarget` with the fused, one-sync-per-step decode (see module doc).

    The engine (and its captured graphs) is kept on the target per drafter, so repeated calls replay.
    """
    engines = target.__dict__.setdefault("_fast_engines", {})
    engine = engines.get(id(drafter))
    if engine is None or engine[0] is not drafter:
        engine = engines[id(drafter)] = (drafter, FastEngine(target, drafter))
    return engine[1].generate(
        prompts, max_new_tokens, temperature, top_k, top_p, num_draft_tokens, eos_token_id, seed,
        generator=generator, auto_off=auto_off, synthetic_acceptance=synthetic_acceptance,
    )
