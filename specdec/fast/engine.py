"""The fused decode step: draft → verify → emit → roll back as CUDA-graph replays, one host sync per step.

`fast_generate(target, prompts, drafter=None, ...)` runs the same algorithm as `specdec.generate`
(Algorithm 1 through `fast.verify`, the core's rule without host syncs) with a `FastTarget`:

  per step   [drafter.propose]  e0→e1   (a `FastDrafter` is one graph; table/lookup drafters run eagerly)
             [verify graph]     e1→e2   target pass over [last, x_1..x_γ] → accept → append to the token
                                        buffer in place → EOS / max_new_tokens cut → crop (a pointer move)
                                        → device-side SpecStats counters → "all rows finished" flag
             host reads the flag: the step's only synchronization; e0/e1/e2 are CUDA events
Finished rows stay in the batch (static shapes), masked out. Outputs and counters are read once at the end.
`auto_off=True` probes a few speculative and a few plain steps and keeps whichever makes tokens faster
(so speculation never makes a batch slower than plain decoding).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from specdec.core import SamplingConfig, VerifyResult
from specdec.decoding import GenerateResult, as_drafter, normalize_prompts, resolve_eos
from specdec.drafters.base import Drafter, Proposal
from specdec.fast.sampling import standardize_probs
from specdec.fast.target import FastDrafter, FastTarget
from specdec.fast.verify import verify_greedy_nosync, verify_with_noise
from specdec.metrics import SpecStats

__all__ = ["fast_generate", "FastEngine"]

_PROBE_STEPS = 6  # per phase of the auto_off probe (the first step of a phase is not timed)


class _Timer:
    """CUDA events on GPU, perf_counter on CPU; read only after the step's host sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.cuda else None
        self.times = [0.0] * 3

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def elapsed(self, i: int, j: int) -> float:
        if self.cuda:
            return self.events[i].elapsed_time(self.events[j]) / 1000.0
        return self.times[j] - self.times[i]


class FastEngine:
    """Owns the static step buffers of one (target, drafter) pair; reuses graphs across same-shape requests."""

    def __init__(self, target: FastTarget, drafter: Drafter | None = None):
        if not isinstance(target, FastTarget):
            raise TypeError(f"fast_generate needs a FastTarget, got {type(target).__name__}")
        self.target = target
        self.drafter = as_drafter(drafter, target)
        self._static: dict = {}
        self._graphs: dict = {}
        self.last_auto_off_decision: int | None = None

    # ----------------------------------------------------------------------------------------- buffers
    def _buffers(self, batch: int, capacity: int, max_gamma: int) -> dict:
        key = (batch, capacity, max_gamma, id(self.target.cache))
        if self._static.get("key") != key:
            dev = self.target.device
            self._graphs.clear()
            self._static = {
                "key": key,
                "tokens": torch.zeros(batch, capacity, dtype=torch.long, device=dev),
                "lengths": torch.zeros(batch, dtype=torch.long, device=dev),
                "generated": torch.zeros(batch, dtype=torch.long, device=dev),
                "finished": torch.zeros(batch, dtype=torch.bool, device=dev),
                "max_new": torch.zeros((), dtype=torch.long, device=dev),
                # reached[γmax], accepted[γmax], β-sum, Σn, Σ draft lengths, rows with drafts, active rows
                "counters": torch.zeros(2 * max_gamma + 5, dtype=torch.float64, device=dev),
                "all_done": torch.zeros((), dtype=torch.bool, device=dev),
            }
        return self._static

    # ----------------------------------------------------------------------------------------- verify step
    def _verify_body(self, s: dict, inputs: dict, gamma: int, sampling: SamplingConfig, eos_ids: torch.Tensor | None,
                     max_gamma: int, synthetic: float | None):
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
            if synthetic is not None:  # BENCHMARK ONLY: accept each draft with probability `synthetic`
                accepted = inputs["uniforms"] < synthetic
                n = accepted.long().cumprod(1).sum(1)
                next_token = logits.argmax(-1).gather(1, n[:, None]).squeeze(1)
                result = VerifyResult(num_accepted=n, next_token=next_token, beta=accepted.float())
            elif sampling.greedy:
                result = verify_greedy_nosync(draft_tokens, logits, draft_lengths)
            else:
                probs = standardize_probs(logits, sampling)
                result = verify_with_noise(draft_tokens, draft_probs, probs, inputs["uniforms"], inputs["noise"],
                                           draft_lengths)
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
            self._count(s["counters"], result, draft_lengths, active, gamma, max_gamma)
            s["all_done"].copy_(finished.all())

        return body

    @staticmethod
    def _count(counters: torch.Tensor, result: VerifyResult, draft_lengths, active, gamma: int, max_gamma: int):
        n = result.num_accepted
        parts = []
        if gamma:
            lengths = draft_lengths if draft_lengths is not None else torch.full_like(n, gamma)
            pos = torch.arange(gamma, device=n.device)[None, :]
            drafted = (pos < lengths[:, None]) & active[:, None]
            reached = drafted & (pos <= n[:, None])
            accepted = pos < (n * active)[:, None]
            pad = torch.zeros(max_gamma - gamma, dtype=torch.float64, device=n.device)
            parts = [reached.sum(0).double(), pad, accepted.sum(0).double(), pad,
                     (result.beta.double() * reached).sum().reshape(1),
                     torch.stack([(n * active).sum(), (lengths * active).sum(), ((lengths > 0) & active).sum(),
                                  active.sum()]).double()]
            counters.add_(torch.cat(parts))
        else:
            counters[-1:].add_(active.sum().double())

    def _verify(self, s, gamma, sampling, eos_ids, max_gamma, inputs: dict, synthetic: float | None):
        cuda_graphs = self.target.cuda_graphs
        make = lambda static: self._verify_body(s, static, gamma, sampling, eos_ids, max_gamma, synthetic)  # noqa: E731
        if not cuda_graphs:
            return make(inputs)()
        key = (gamma, sampling, tuple((k, tuple(v.shape)) for k, v in sorted(inputs.items())),
               None if eos_ids is None else eos_ids.numel(), synthetic)
        entry = self._graphs.get(key)
        if entry is None:
            from specdec.fast.graphs import CapturedStep

            static = {k: v.clone() for k, v in inputs.items()}
            restore = [s["tokens"], s["lengths"], s["generated"], s["finished"], s["counters"], s["all_done"],
                       self.target.cache.lengths]
            step = CapturedStep(make(static), pool=self.target.pool(), restore=restore)
            entry = self._graphs[key] = (static, step)
        static, step = entry
        for k, v in inputs.items():
            static[k].copy_(v)
        step.replay()

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
        max_gamma = target.max_draft_tokens
        if gamma > max_gamma:
            raise ValueError(f"num_draft_tokens {gamma} exceeds the target's max_draft_tokens {max_gamma}")
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
        s = self._buffers(batch, context.capacity, max_gamma)
        s["tokens"].copy_(context.tokens)
        s["lengths"].copy_(context.lengths)
        s["generated"].zero_()
        s["finished"].zero_()
        s["max_new"].fill_(max_new_tokens)
        s["counters"].zero_()
        s["all_done"].zero_()
        context.tokens, context.lengths = s["tokens"], s["lengths"]  # the buffer the graphs write into
        if drafter is not None:
            drafter.begin(context, target.vocab_size)
        eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=device) if eos else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats.prefill_time_s = time.perf_counter() - t_start

        timer = _Timer(device)
        probe = _Probe(gamma) if auto_off and gamma > 0 else None
        step, done = 0, False
        while not done and step < max_new_tokens:
            g = probe.gamma() if probe is not None else gamma
            timer.mark(0)
            if g > 0:
                proposal = drafter.propose(context, g, sampling, generator, None)
            else:
                proposal = Proposal(tokens=torch.zeros(batch, 0, dtype=torch.long, device=device))
            timer.mark(1)
            inputs = {"draft_tokens": proposal.tokens}
            if proposal.probs is not None and not sampling.greedy:
                inputs["draft_probs"] = proposal.probs
            if proposal.lengths is not None:
                inputs["draft_lengths"] = proposal.lengths
            if not sampling.greedy or synthetic_acceptance is not None:
                inputs["uniforms"] = torch.rand(batch, proposal.tokens.shape[1], generator=generator, device=device)
            if not sampling.greedy and synthetic_acceptance is None:
                inputs["noise"] = torch.empty(batch, target.vocab_size, device=device).exponential_(generator=generator)
            self._verify(s, proposal.tokens.shape[1], sampling, eos_ids, max_gamma, inputs, synthetic_acceptance)
            if g > 0 and not isinstance(drafter, FastDrafter):
                drafter.commit(context)
            timer.mark(2)
            done = bool(s["all_done"])  # the step's one host synchronization
            draft_s, verify_s = timer.elapsed(0, 1), timer.elapsed(1, 2)
            stats.num_steps += 1
            stats.target_calls += 1
            stats.drafter_calls += proposal.forward_passes
            stats.draft_time_s += draft_s
            stats.verify_time_s += verify_s
            stats.max_num_draft_tokens = max(stats.max_num_draft_tokens, g)
            if probe is not None:
                probe.record(g, draft_s + verify_s, s["counters"])
            step += 1

        host = torch.cat([s["counters"], s["generated"].double(), context.start_lengths.double()]).tolist()
        counters, generated, starts = host[: 2 * max_gamma + 5], host[2 * max_gamma + 5 : -batch], host[-batch:]
        token_rows = s["tokens"].tolist()
        for b in range(batch):
            start = int(starts[b])
            outputs[b] = token_rows[b][start : start + int(generated[b])]
        _fill_stats(stats, counters, max_gamma)
        stats.num_generated_tokens = sum(len(o) for o in outputs)
        stats.wall_time_s = time.perf_counter() - t_start
        self.last_auto_off_decision = probe.decision if probe is not None else None  # γ kept (0 = turned off)
        return GenerateResult(outputs, stats)


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
        # tokens the algorithm produced so far: Σn + active row-steps (read only during the probe)
        produced = float(counters[-5]) + float(counters[-1])
        if self._last is not None and self.steps > 0:
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


def _fill_stats(stats: SpecStats, counters: list[float], max_gamma: int) -> None:
    reached, accepted = counters[:max_gamma], counters[max_gamma : 2 * max_gamma]
    beta_sum, n_sum, drafted, spec_rows, active = counters[2 * max_gamma :]
    gamma = stats.max_num_draft_tokens
    stats.reached_by_position = [int(x) for x in reached[:gamma]]
    stats.accepted_by_position = [int(x) for x in accepted[:gamma]]
    stats.beta_sum = beta_sum
    stats.beta_count = int(sum(reached))
    stats.accepted_tokens = int(n_sum)
    stats.drafted_tokens = int(drafted)
    stats.speculative_row_steps = int(spec_rows)
    stats.row_steps = int(active)
    stats.algorithm_tokens = int(n_sum) + int(active)


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
