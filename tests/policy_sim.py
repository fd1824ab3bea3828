"""A small simulated engine to run the γ policy against: a step-cost table, rows with their own acceptance.

Traffic as a server sees it: more requests than slots, each admitted when a slot frees; prompt lengths
30..2000 (the step cost grows slowly with the longest row), output budgets 16..256 tokens and an EOS chance
per token; each row has its own α (drawn around the cell's mean; greedy and sampled rows mixed when the cell
says so). Acceptance is i.i.d. per drafted position ("iid"), or all-or-nothing per step with the same mean
number accepted ("burst": prompt lookup's copies), which Thm 3.8's model mispredicts.

A step at batch bucket b, γ, longest row ℓ costs `cell.step_seconds(b, γ, ℓ)` times a little noise (and now and
then a 3x straggler). A drafter that keeps a cache pays `cell.catch_up_s` (+ `catch_up_step_s` per plain step fed)
before the first speculative step after more than 2 plain steps in a row (the engine's catch-up), reported to the
policy as the engine does; a row admitted while the engine speculates costs `admit_s` outside every step (the
drafter's prefill of its prompt, reported with `record_admission` unless `report_admissions=False`: the negative
control; the rows admitted together are one admission, as the engine's, the first `cold` of them 10x the cost;
`target_s` a row is the target's prefill, in every regime, reported as `target_seconds`); a row admitted in a plain
run is fed by the next catch-up instead (if it still runs), which then costs its `admit_s` more and reports that
share of the catch-up as prompts (`catch_up_share`, `catch_up_prompts`), as the engine does. Every admission reports
its prompt tokens.
Step shapes are captured as the engine's are: the first step of a (b, γ, length bucket of ℓ + γ + 2) shape
not built yet costs `cell.capture_s` more (~0.1 s on an H200: every row waits) and is reported to the policy
as a capture, not a step time. `warm=True` builds every shape of the policy's menu first (the engine's
warm-up: `only_ready` on), `captured` carries the built shapes from one run into the next (a first, untimed
run as the only warm-up), and `use_ready=False` hides which shapes are built from the policy (the policy
before captures were charged: the negative control).
The policy is used only through its public methods (choose / record_step / record_capture / set_fixed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specdec.analysis import expected_tokens
from specdec.engine.config import BATCH_BUCKETS
from specdec.engine.policy import GammaPolicy, length_bucket

FREE_PLAIN = 2  # the engine: a drafter re-feeding 4 committed tokens needs no catch-up after <= 2 plain steps
DEEP = 4  # the first draft depth (0-based) whose acceptance `Cell.deep` scales


@dataclass(frozen=True)
class Cell:
    """A recorded step-cost table: T(γ) / T(0) at the cell's batch size (`ratios`: γ → ratio, interpolated
    linearly in γ), plain step seconds per batch bucket scaled from `plain_s` at `slots` rows."""

    name: str
    slots: int
    plain_s: float  # a plain step's seconds at `slots` rows
    ratios: tuple  # ((γ, T(γ)/T(0)), ...) with γ = 0 → 1.0 implied
    alpha: float
    catch_up_s: float = 0.0  # a catch-up's seconds (0: the drafter keeps no cache)
    acceptance: str = "iid"
    sampled_share: float = 0.0  # share of rows at T > 0 (their α is 0.8 of the greedy rows')
    alpha_spread: float = 0.1
    small_ratios: tuple = ()  # T(γ)/T(0) at batch buckets <= 8 (speculation is cheaper there); () = `ratios`
    ramp: bool = False  # requests join one per step at first (a server starting up), else the slots fill at once
    capture_s: float = 0.1  # a step shape's first run: its graph capture (24-layer target, H200: ~0.1 s)
    catch_up_step_s: float = 0.0  # a catch-up's seconds per plain step it feeds (rows × tokens grow with the run)
    admit_s: float = 0.0  # the drafter's prefill per admitted row, outside the steps (fed only while speculating)
    requests: int | None = None  # the traffic's requests (None: max(6 × slots, 160))
    target_s: float = 0.0  # the target's prefill per admitted row (reported as `target_seconds`; 0: not reported)
    cold: int = 0  # the first `cold` admissions' prefills (drafter's and target's) cost 10x: shapes run first
    deep: float = 1.0  # acceptance at draft depths >= `DEEP` is the row's α times this (i.i.d.: 1)
    new_tokens: tuple = (16, 256)  # each request's max_new_tokens, drawn uniformly in this range
    prompts: tuple = (30, 2000)  # each request's prompt tokens, drawn uniformly in this range
    cold_factors: tuple = (10.0, 10.0)  # how much dearer the first `cold` admissions are: (drafter's, target's)
    draft_token_s: float = 0.0  # a speculative step's drafting per drafted token, reported with it (0: not reported)

    def ratio(self, gamma: int, bucket: int | None = None) -> float:
        ratios = self.small_ratios if self.small_ratios and bucket is not None and bucket <= 8 else self.ratios
        points = sorted(((0, 1.0), *ratios))
        for (g0, r0), (g1, r1) in zip(points, points[1:]):
            if g0 <= gamma <= g1:
                return r0 + (r1 - r0) * (gamma - g0) / (g1 - g0)
        (g0, r0), (g1, r1) = points[-2], points[-1]
        return r1 + (r1 - r0) / (g1 - g0) * (gamma - g1)

    def step_seconds(self, bucket: int, gamma: int, longest: int) -> float:
        rows_scale = (0.4 + 0.6 * bucket / self.slots) if bucket < self.slots else 1.0  # smaller batch: cheaper
        length_scale = 1.0 + 0.05 * max(longest.bit_length() - 7, 0)  # longer rows: a little more attention
        return self.plain_s * rows_scale * length_scale * self.ratio(gamma, bucket)


class _Row:
    def __init__(self, prompt: int, budget: int, alpha: float, seed: int):
        self.length, self.budget, self.alpha = prompt, budget, alpha
        self.rng = random.Random(seed)  # its acceptance draws (the same stream under every policy)
        self.totals = [0.0, 0.0, 0.0, 0.0]  # Σβ, verified positions, speculative steps, steps that drafted
        self.prompt = prompt
        self.unfed = False  # admitted in a plain run: the drafter has not seen its prompt (the catch-up feeds it)


def shape(bucket: int, gamma: int, longest: int) -> tuple[int, int, int]:
    """The engine's step shape key (batch bucket, γ, length bucket of the positions the step attends over)."""
    return bucket, gamma, length_bucket(longest + gamma + 2)


def menu(policy: GammaPolicy) -> tuple[int, ...]:
    """The γ's a policy can run (what the engine's warm-up builds)."""
    return (policy.fixed,) if policy.fixed is not None else (0, *policy.candidates)


def warm_shapes(cell: Cell, gammas) -> set:
    """Every shape of these γ's at every batch bucket up to the cell's slots and every length bucket."""
    buckets = [b for b in BATCH_BUCKETS if b <= next(c for c in BATCH_BUCKETS if c >= cell.slots)]
    lengths = [64 << i for i in range(8)]  # 64 .. 8192: past any row of the traffic (prompts <= 2000 + 256)
    return {(b, g, n) for b in buckets for g in gammas for n in lengths}


def simulate(cell: Cell, gamma="auto", requests: int | None = None, seed: int = 0, eos: float = 0.004,
             policy: GammaPolicy | None = None, warm: bool = True, captured: set | None = None,
             use_ready: bool = True, report_admissions: bool = True, report_depths: bool = True,
             collapse: tuple | None = None) -> dict:
    """Run the traffic through a policy ("auto" or a fixed γ) → {tok_s, steps, gammas (γ → steps), catch_ups,
    captures}. Each row verifies min(γ, its cap) drafts, the caps `policy.row_caps()` gives (None: γ).
    collapse = (first step, last step, α): every row's acceptance is that α over those steps (a drafter-wide
    collapse)."""
    rng = random.Random(seed)  # the traffic (the same under every policy), then the step-time noise
    count = requests or cell.requests or max(6 * cell.slots, 160)
    policy = policy or GammaPolicy(gamma, 8, plain_catches_up=cell.catch_up_s > 0)
    captured = set() if captured is None else captured
    if warm:
        captured |= warm_shapes(cell, menu(policy))
        policy.only_ready = True
    waiting = []
    for _ in range(count):
        sampled = rng.random() < cell.sampled_share
        mean = cell.alpha * (0.8 if sampled else 1.0)
        alpha = min(max(rng.gauss(mean, cell.alpha_spread), 0.02), 0.98)
        budget = rng.randint(*cell.new_tokens)
        for position in range(budget):  # EOS: the request ends at its first EOS token
            if rng.random() < eos:
                budget = position + 1
                break
        waiting.append(_Row(rng.randint(*cell.prompts), budget, alpha, rng.getrandbits(32)))
    running: list[_Row] = []
    seconds = tokens = 0.0
    plain_run, catch_ups, captures, gammas, admissions = 0, 0, 0, {}, 0
    made_total = row_steps = 0  # τ: tokens made (accepted + 1, before cuts) per row-step

    def estimates():
        return [tuple(r.totals) for r in running]

    while waiting or running:
        joined = []
        while waiting and len(running) < cell.slots:
            row = waiting.pop()
            running.append(row)
            joined.append(row)
            if cell.ramp and len(running) < cell.slots and seconds < 64 * cell.plain_s:
                break  # (ramping up: one more request per step)
        if joined:  # one admission of them all, as the engine's (its prefills batched)
            admissions += 1
            cold_drafter, cold_target = cell.cold_factors if admissions <= cell.cold else (1.0, 1.0)  # first shapes
            prompt = sum(r.prompt for r in joined)
            target = cell.target_s * cold_target * len(joined) if cell.target_s else None
            seconds += target or 0.0
            if cell.admit_s and plain_run == 0:  # the engine feeds the drafter at admission only while speculating
                fed_s = cell.admit_s * cold_drafter * len(joined)
                seconds += fed_s
                if report_admissions:
                    policy.record_admission(prompt, fed_s, requests=len(joined), target_seconds=target)
            elif cell.admit_s:
                for r in joined:
                    r.unfed = True
                if report_admissions:
                    policy.record_admission(prompt, requests=len(joined), target_seconds=target)
        n = len(running)
        bucket = next(b for b in BATCH_BUCKETS if b >= n)
        longest = max(r.length for r in running)
        ready = (lambda gm: shape(bucket, gm, longest) in captured) if use_ready else None
        g = policy.choose(bucket, running, estimates, length=longest, ready=ready)
        caps = policy.row_caps() or [g] * n
        step = sum(gammas.values())
        collapsed = collapse is not None and collapse[0] <= step <= collapse[1]
        gammas[g] = gammas.get(g, 0) + 1
        lagging = g > 0 and plain_run > FREE_PLAIN and cell.catch_up_s > 0  # what the plain run committed
        unfed = [r for r in running if r.unfed] if g > 0 else []  # and the prompts it admitted
        for r in unfed:
            r.unfed = False
        prompt_s = cell.admit_s * len(unfed)
        caught_up = lagging or bool(unfed)
        t = cell.step_seconds(bucket, g, longest) * rng.lognormvariate(0.0, 0.05)
        if rng.random() < 0.02:
            t *= 3.0  # a straggler (a collection, a hiccup)
        if lagging:
            t += cell.catch_up_s + cell.catch_up_step_s * plain_run
            catch_ups += 1
        t += prompt_s
        share = 1.0 - prompt_s / max(t - cell.step_seconds(bucket, g, longest), prompt_s) if prompt_s else 1.0
        fed = sum(r.prompt for r in unfed) if report_admissions else 0
        first_run = shape(bucket, g, longest) not in captured
        if first_run:
            captured.add(shape(bucket, g, longest))
            t += cell.capture_s
            captures += 1
        produced, accepted_rows, drafted_rows = 0, [], []
        for row, cap in zip(running, caps):
            d = min(g, cap)
            accepted = _accepted(collapse[2] if collapsed else row.alpha, d, cell.acceptance, row.rng, cell.deep)
            drafted_rows.append(d)
            made = accepted + 1
            accepted_rows.append(accepted)
            produced += made
            made_total += made
            row_steps += 1
            if g:
                row.totals[0] += accepted  # β at T = 0: each verified position accepted (1) or not (0)
                row.totals[1] += min(accepted + 1, d)
                row.totals[2] += 1
                row.totals[3] += d > 0
            committed = min(made, row.budget)  # the commit rule: the budget (EOS included) cuts the step's tokens
            row.budget -= committed
            row.length += committed
            tokens += committed
        seconds += t
        if first_run:  # the engine: a first run's time includes its capture (no step time)
            policy.record_capture(t)
        else:
            policy.record_step(bucket, g, t, produced / n, length=longest, catch_up_of=plain_run if caught_up else 0,
                               rows=n, catch_up_share=share if report_admissions else 1.0, catch_up_prompts=fed,
                               accepted=accepted_rows if report_depths else None, drafted=drafted_rows,
                               draft_seconds=cell.draft_token_s * g * n if cell.draft_token_s and g else None)
        plain_run = plain_run + 1 if g == 0 else 0
        running = [r for r in running if r.budget > 0]
    return {"tok_s": tokens / seconds, "steps": sum(gammas.values()), "gammas": gammas, "catch_ups": catch_ups,
            "captures": captures, "tau": made_total / max(row_steps, 1)}


def _accepted(alpha: float, gamma: int, acceptance: str, rng: random.Random, deep: float = 1.0) -> int:
    if gamma == 0:
        return 0
    if acceptance == "burst":  # all γ or nothing, with the i.i.d. law's mean number accepted
        mean = expected_tokens(alpha, gamma) - 1.0
        return gamma if rng.random() < mean / gamma else 0
    n = 0
    while n < gamma and rng.random() < (alpha if n < DEEP else alpha * deep):
        n += 1
    return n


def fixed_rates(cell: Cell, gammas=(0, 1, 2, 3, 4, 6, 8), seed: int = 1) -> dict:
    """Every fixed γ through the same traffic → γ → tokens/s."""
    return {g: simulate(cell, g, seed=seed)["tok_s"] for g in gammas}


def run_rows(policy: GammaPolicy, alphas, steps: int, cell: Cell, seed: int = 0) -> list[tuple[int, tuple]]:
    """`len(alphas(0))` rows that never finish, row i accepting i.i.d. at `alphas(step)[i]` → per step (γ, the rows'
    verify caps: `row_caps()`, else γ each). The step costs are the cell's at that batch bucket."""
    rng = random.Random(seed)
    n = len(alphas(0))
    rows = [_Row(100, 1 << 30, a, rng.getrandbits(32)) for a in alphas(0)]
    bucket = next(b for b in BATCH_BUCKETS if b >= n)
    out = []
    for step in range(steps):
        g = policy.choose(bucket, rows, lambda: [tuple(r.totals) for r in rows], length=100)
        caps = tuple(policy.row_caps() or [g] * n)
        out.append((g, tuple(min(g, c) for c in caps)))
        accepted, drafted = [], []
        for row, alpha, cap in zip(rows, alphas(step), caps):
            d = min(g, cap)
            a = _accepted(alpha, d, "iid", row.rng)
            accepted.append(a)
            drafted.append(d)
            if g:
                row.totals[0] += a
                row.totals[1] += min(a + 1, d)
                row.totals[2] += 1
                row.totals[3] += d > 0
        t = cell.step_seconds(bucket, g, 100) * rng.lognormvariate(0.0, 0.05)
        policy.record_step(bucket, g, t, sum(accepted) / n + 1, length=100, rows=n, accepted=accepted,
                           drafted=drafted)
    return out


@dataclass(frozen=True)
class Chunks:
    """Mixed steps (`EngineConfig.mixed_step`) on a cell: a step feeds prompt chunks with odds `odds` (γ = 0, γ > 0:
    chunks ride mostly in speculative steps), `tokens` of them drawn uniformly; they cost `fixed_s` + `token_s` ×
    (1 + `per_gamma` · γ) per token on top of the cell's decode step (chunks beside more verify tokens cost more).
    `mixed_lengths`: rows this long run mixed steps only (a key no pure decode step times)."""

    token_s: float = 2e-6
    fixed_s: float = 1e-3
    per_gamma: float = 0.25
    odds: tuple = (0.3, 0.9)
    tokens: tuple = (256, 512)
    mixed_lengths: tuple = ()

    def seconds(self, gamma: int, tokens: int) -> float:
        return self.fixed_s + self.token_s * (1.0 + self.per_gamma * gamma) * tokens


def run_mixed(cell: Cell, chunks: Chunks | None, steps: int, alpha: float = 0.7, attribution: str = "policy",
              rows: int = 64, length: int = 100, seed: int = 0, policy: GammaPolicy | None = None) -> dict:
    """`rows` rows that never finish, each at about `alpha`, under "auto" through `steps` steps at the cell's
    costs, with `chunks`' mixed steps (None: none) → {gammas: γ → steps, policy}. The step's chunk share is the
    engine's split (`prefill.ChunkBudget.mixed_share`, "auto" budget); `attribution`: "policy" — reported as the
    engine does (`record_step(..., chunk_tokens=, chunk_share=)`) — or "split", the step less that share reported
    as a decode step (the engine before `policy_mixed`: the negative control). Every `length`-row step; each 4th
    step at `chunks.mixed_lengths`' first length, if any (mixed only)."""
    from specdec.engine.config import EngineConfig
    from specdec.engine.prefill import ChunkBudget

    rng = random.Random(seed)
    policy = policy or GammaPolicy("auto", 8)
    budget = ChunkBudget(EngineConfig(mixed_step=True, kv_layout="paged"))
    running = [_Row(length, 1 << 30, min(max(rng.gauss(alpha, 0.05), 0.05), 0.95), rng.getrandbits(32))
               for _ in range(rows)]
    bucket = next(b for b in BATCH_BUCKETS if b >= rows)
    gammas: dict[int, int] = {}
    for step in range(steps):
        longest = chunks.mixed_lengths[0] if chunks and chunks.mixed_lengths and step % 4 == 3 else length
        g = policy.choose(bucket, running, lambda: [tuple(r.totals) for r in running], length=longest)
        gammas[g] = gammas.get(g, 0) + 1
        t = cell.step_seconds(bucket, g, longest) * rng.lognormvariate(0.0, 0.05)
        if rng.random() < 0.02:
            t *= 3.0  # a straggler
        mixed = chunks is not None and (longest != length or rng.random() < chunks.odds[g > 0])
        n = rng.randint(*chunks.tokens) if mixed else 0
        t += chunks.seconds(g, n) if mixed else 0.0
        accepted = [_accepted(r.alpha, g, "iid", r.rng) for r in running]
        for r, a in zip(running, accepted):
            if g:
                r.totals[0] += a
                r.totals[1] += min(a + 1, g)
                r.totals[2] += 1
                r.totals[3] += 1
        share = budget.mixed_share(n, t) if mixed else 0.0
        if not mixed:
            budget.decoded(t)
        produced = sum(accepted) / rows + 1
        if share >= t:
            continue  # (the engine records no step whose share is all of it)
        if attribution == "split":
            policy.record_step(bucket, g, t - share, produced, length=longest, rows=rows, accepted=accepted,
                               drafted=[g] * rows)
        else:
            policy.record_step(bucket, g, t, produced, length=longest, rows=rows, accepted=accepted,
                               drafted=[g] * rows, chunk_tokens=n, chunk_share=share)
    return {"gammas": gammas, "policy": policy}
