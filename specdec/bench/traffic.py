"""Serving traffic through the `Engine`: requests arriving over time, more of them than slots, every drafter and
γ policy against plain decoding on the same traffic in the same run. Results are returned, never printed.

A cell is (slots, arrival). Its traffic is drawn once (seeded) and replayed for every arm:
  prompts        lengths uniform in `prompt_tokens` (cut from, or glued together out of, a pool of real prompts)
  outputs        `max_new_tokens` uniform in `new_tokens`, EOS on (a request also ends at its first EOS)
  temperatures   greedy and sampled (T = 1, seeded) requests mixed: `sampled_share` of them at T = 1
  arrival        "poisson:R" — Poisson arrivals at R requests/s; "poisson:Fx" — at F times the plain arm's
                 completion rate measured in the closed loop of the same slots (so a rate means the same load on
                 any machine); "closed:C" — C clients, each sending its next request when the last one finished
                 ("closed" = 2 × slots clients)
  slots          at most `slots` requests are in the engine at once; the rest queue in the driver (their wait
                 counts in TTFT), so one engine of `max(slots)` rows serves every cell
An arm is (drafter, γ policy): plain decoding is the plain engine (no drafter) at γ = 0 — the same traffic,
no speculation. Every engine is warmed up before its first run (`warm_engine`: the step shapes of every γ its
policies can pick, every batch and length bucket, greedy and sampled — what `specdec serve` captures at
start-up); an engine's first arm in a cell first runs the cell's traffic once per policy (priming: without it the
first arm's admissions ran 1.2-1.8x slower than the next arm's on an H200 — each admission of a new shape paid
per-shape setup — so whichever policy ran first lost 10-40%: BENCHMARKS); each arm then runs the cell twice and
the second run is timed (the first teaches "auto" the step times). With `repeats` R > 1 every arm of the cell is
timed R times, round k in the arms' order rotated by k (no arm always first or always after the same one), each
round's ratio taken against plain's run of the same round; a row reports the run of its median tokens/s, the median
of its R ratios as `vs_plain`, and each round's tokens/s, ratio and ITL p99 in `extra["repeats"]` (arms of a few
seconds move by ~10% from run to run on a GPU: the spread says how far one cell can be trusted). The step shapes
built while timed are reported (`captures`: on CUDA each is a graph capture, ~0.1 s of stall for every row; on
the CPU the shapes that would have been captured).

Per arm: output tokens/s (all tokens / first arrival to last finish), TTFT p50/p99 (arrival → first token),
ITL p50/p99 (gaps between a request's successive outputs; a speculative step delivers several tokens in one),
TPOT p50, α, mean γ, and the ratio of its tokens/s to plain's in the same cell; in `extra`, the TPOT p50 of the
greedy and of the sampled requests and plain's over each (`speedup_greedy`, `speedup_sampled`: the T = 0 and
T = 1 columns of issue 21's table, from one mixed run).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from specdec.bench.traffic_table import ArmResult, arm_row, markdown_table
from specdec.metrics import percentile
from specdec.request import MAX_NUM_DRAFT_TOKENS, SamplingParams

__all__ = ["Arrival", "TrafficSpec", "TrafficRequest", "ArmResult", "parse_arrival", "parse_policy", "make_requests",
           "drive", "run_traffic", "warm_engine", "warm_engines", "markdown_table", "MAX_SLOTS"]

MAX_SLOTS = 256  # the engine's largest batch bucket
MAX_CLIENTS = 4096
MAX_RATE = 1e6
MAX_REPEATS = 20


@dataclass(frozen=True)
class Arrival:
    """How requests arrive: "poisson" at `rate` requests/s (or `relative` × the plain closed-loop completion
    rate), or "closed" with `clients` clients (None = 2 × slots)."""

    kind: str
    rate: float | None = None
    relative: float | None = None
    clients: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "closed":
            return "closed:" + ("2xslots" if self.clients is None else str(self.clients))
        return f"poisson:{self.relative:g}x" if self.relative is not None else f"poisson:{self.rate:g}/s"


def parse_arrival(text: str) -> Arrival:
    """"poisson:R" (requests/s), "poisson:Fx" (times plain's closed-loop rate), "closed" or "closed:C"."""
    kind, _, value = str(text).strip().partition(":")
    if kind == "closed":
        if not value:
            return Arrival("closed")
        clients = _number(value, text, int)
        if not 1 <= clients <= MAX_CLIENTS:
            raise ValueError(f"arrival {text!r}: clients must be in [1, {MAX_CLIENTS}], got {clients}")
        return Arrival("closed", clients=clients)
    if kind == "poisson" and value:
        relative = value.endswith("x")
        rate = _number(value[:-1] if relative else value, text, float)
        if not (math.isfinite(rate) and 0 < rate <= (100 if relative else MAX_RATE)):
            raise ValueError(f"arrival {text!r}: the rate must be a number in (0, {100 if relative else MAX_RATE:g}]"
                             f"{' (times the plain rate)' if relative else ' requests/s'}")
        return Arrival("poisson", relative=rate) if relative else Arrival("poisson", rate=rate)
    raise ValueError(f"arrival {text!r}: expected poisson:RATE (requests/s), poisson:Fx (times the plain rate), "
                     "closed or closed:CLIENTS")


def parse_policy(value) -> int | str:
    """A γ policy name: "auto", or a fixed γ in [1, MAX_NUM_DRAFT_TOKENS] (plain decoding is always run)."""
    if value == "auto":
        return "auto"
    gamma = _number(str(value), value, int)
    if not 1 <= gamma <= MAX_NUM_DRAFT_TOKENS:
        raise ValueError(f"policy {value!r}: 'auto' or a fixed γ in [1, {MAX_NUM_DRAFT_TOKENS}]")
    return gamma


def _number(text: str, what, kind):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise ValueError(f"arrival/policy {what!r}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None


@dataclass(frozen=True)
class TrafficSpec:
    """What a traffic run measures; every number is checked at construction (before anything is allocated)."""

    slots: tuple[int, ...] = (1, 8, 32, 64)
    arrivals: tuple[Arrival, ...] = (Arrival("closed"), Arrival("poisson", relative=0.8))
    policies: tuple = ("auto",)  # γ policies of every drafter ("auto", fixed γ's); plain runs always
    requests_per_slot: float = 3.0  # requests per cell = max(min_requests, requests_per_slot × slots)
    min_requests: int = 16
    repeats: int = 1  # timed runs of every arm per cell, in rotated orders; the ratio reported is their median
    prompt_tokens: tuple[int, int] = (30, 2000)
    new_tokens: tuple[int, int] = (16, 256)
    sampled_share: float = 0.5
    eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.slots or not self.arrivals or not self.policies:
            raise ValueError("slots, arrivals and policies must each name at least one value")
        for s in self.slots:
            if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_SLOTS:
                raise ValueError(f"slots must be integers in [1, {MAX_SLOTS}], got {s!r}")
        for a in self.arrivals:
            if not isinstance(a, Arrival):
                raise TypeError(f"arrivals must be Arrival values (parse_arrival), got {a!r}")
        object.__setattr__(self, "policies", tuple(parse_policy(p) for p in self.policies))
        r = self.requests_per_slot
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and 0 < r <= 1000):
            raise ValueError(f"requests_per_slot must be a number in (0, 1000], got {r!r}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"repeats must be an integer in [1, {MAX_REPEATS}], got {self.repeats!r}")
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int) or not 1 <= self.min_requests <= 100_000:
            raise ValueError(f"min_requests must be an integer in [1, 100000], got {self.min_requests!r}")
        for name, (lo, hi), floor in (("prompt_tokens", self.prompt_tokens, 1), ("new_tokens", self.new_tokens, 1)):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not floor <= lo <= hi <= 1 << 20:
                raise ValueError(f"{name} must be integers LO <= HI in [{floor}, {1 << 20}], got ({lo!r}, {hi!r})")
        if not (isinstance(self.sampled_share, (int, float)) and 0.0 <= self.sampled_share <= 1.0):
            raise ValueError(f"sampled_share must be in [0, 1], got {self.sampled_share!r}")

    def requests(self, slots: int) -> int:
        return max(self.min_requests, math.ceil(self.requests_per_slot * slots))


@dataclass(frozen=True)
class TrafficRequest:
    prompt: list[int]
    params: SamplingParams


def make_requests(pool: list[list[int]], count: int, spec: TrafficSpec, eos_ids: tuple[int, ...], seed: int,
                  max_total: int | None = None) -> list[TrafficRequest]:
    """`count` requests drawn from `pool` (prompts of real text) per `spec`, seeded; prompt + budget stays
    within `max_total` tokens (the engine's max_seq_len): the prompt range is cut to fit."""
    if not pool or not all(pool):
        raise ValueError("make_requests needs a pool of non-empty prompts")
    rng = random.Random(seed)
    lo, hi = spec.prompt_tokens
    new_lo, new_hi = spec.new_tokens
    if max_total is not None:
        hi = min(hi, max_total - new_hi)
        if hi < lo:
            raise ValueError(f"prompts of {spec.prompt_tokens[0]}+ tokens and up to {new_hi} new tokens exceed the "
                             f"engine's {max_total}-token limit")
    out = []
    for i in range(count):
        length, prompt, j = rng.randint(lo, hi), [], rng.randrange(len(pool))
        while len(prompt) < length:  # real text, glued from consecutive pool prompts when one is too short
            prompt += pool[j % len(pool)]
            j += 1
        sampled = rng.random() < spec.sampled_share
        params = SamplingParams(max_new_tokens=rng.randint(new_lo, new_hi), temperature=1.0 if sampled else 0.0,
                                seed=seed * 100_003 + i, eos_token_ids=tuple(eos_ids) if spec.eos else ())
        out.append(TrafficRequest(prompt[:length], params))
    return out


def _schedule(arrival: Arrival, count: int, slots: int, rate: float | None, seed: int) -> tuple[list[float], int]:
    """(arrival offsets in seconds for a Poisson process, []) or ([], clients) for a closed loop."""
    if arrival.kind == "closed":
        return [], arrival.clients or 2 * slots
    rng, t, offsets = random.Random(seed + 7), 0.0, []
    for _ in range(count):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets, 0


def drive(engine, requests: list[TrafficRequest], slots: int, arrival: Arrival, gamma, rate: float | None = None,
          seed: int = 0) -> dict:
    """Run `requests` through `engine` at γ policy `gamma` (0 = plain) with at most `slots` in the engine, arriving
    per `arrival` (a Poisson rate resolved to `rate` requests/s) → measurements (see `ArmResult`)."""
    from specdec.bench.stalls import StallLog, policy_report
    from specdec.metrics import SpecStats
    from specdec.text.warmup import step_shapes

    engine.policy.set_fixed(gamma)
    offsets, clients = _schedule(arrival, len(requests), slots, rate, seed)
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    gaps: list[float] = []
    tpot: list[float] = []
    by_temperature: dict[bool, list[float]] = {True: [], False: []}  # greedy? → TPOTs
    counts: dict[str, int] = {}
    queue: list[int] = []
    nxt = done = tokens = 0
    in_flight = 0
    ids: dict[str, int] = {}
    engine.stats = SpecStats()
    captures = step_shapes(engine)
    mixed = engine.runner.num_mixed_steps  # (steps that fed prompt chunks in their forward: `--mixed-step`)
    ahead = _ahead(engine)  # (steps launched before the previous record was read: `--async-scheduling`)
    clock = policy_report(engine, 0.0, 0.0)["clock_s"]
    if engine.device.type == "cuda":
        import torch

        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    if clients:
        queue, nxt = list(range(min(clients, len(requests)))), min(clients, len(requests))
        arrived.update({str(i): 0.0 for i in queue})
    with StallLog(engine) as stalls:  # (admission, catch-up and GC inside each step: `bench.stalls`)
        while done < len(requests):
            now = time.perf_counter() - start
            while offsets and nxt < len(requests) and offsets[nxt] <= now:
                queue.append(nxt)
                arrived[str(nxt)] = offsets[nxt]
                nxt += 1
            while queue and in_flight < slots:  # the driver's queue: the engine never holds more than `slots`
                i = queue.pop(0)
                rid = engine.add_request(requests[i].prompt, requests[i].params, request_id=str(i))
                ids[rid], in_flight = i, in_flight + 1
            if not engine.has_unfinished():
                if offsets and nxt < len(requests):
                    time.sleep(max(offsets[nxt] - (time.perf_counter() - start), 0.0))
                continue
            for out in stalls.step():
                now = time.perf_counter() - start
                rid = out.request_id
                if out.new_token_ids:
                    n = len(out.new_token_ids)
                    tokens += n
                    counts[rid] = counts.get(rid, 0) + n
                    if rid in first:
                        gaps.append(now - last[rid])
                    else:
                        first[rid] = now
                    last[rid] = now
                if out.finished:
                    done, in_flight = done + 1, in_flight - 1
                    if counts.get(rid, 0) > 1:
                        tpot.append((last[rid] - first[rid]) / (counts[rid] - 1))
                        by_temperature[requests[ids[rid]].params.greedy].append(tpot[-1])
                    if clients and nxt < len(requests):  # the client sends its next request now
                        queue.append(nxt)
                        arrived[str(nxt)] = now
                        nxt += 1
    seconds = time.perf_counter() - start
    ttft = [first[rid] - arrived[rid] for rid in first]
    stats = engine.stats
    return {"requests": len(requests), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "itl_p50_s": percentile(gaps, 0.5), "itl_p99_s": percentile(gaps, 0.99),
            "tpot_p50_s": percentile(tpot, 0.5), "alpha": stats.alpha, "mean_gamma": stats.mean_num_draft_tokens,
            "captures": step_shapes(engine) - captures, "completed_per_s": len(requests) / seconds,
            "tpot_p50_greedy_s": percentile(by_temperature[True], 0.5),
            "tpot_p50_sampled_s": percentile(by_temperature[False], 0.5), "policy": policy_report(engine, clock, seconds),
            "stalls": stalls.summary(seconds), "mixed_steps": engine.runner.num_mixed_steps - mixed,
            "ahead_steps": _ahead(engine) - ahead}


def _ahead(engine) -> int:
    """Steps the engine launched before the previous step's record was read (0 without async scheduling)."""
    return engine.overlap.ahead if engine.overlap is not None else 0


def warm_engine(spec: TrafficSpec, name: str, engine, log=None) -> dict:
    """Build (on CUDA: capture) every step shape `engine` can reach at up to `max(spec.slots)` rows: plain's γ = 0,
    a drafter's "auto" menu and the spec's fixed γ's → `text.warmup.warm_up`'s report."""
    from specdec.text.warmup import warm_up

    fixed = [p for p in spec.policies if p != "auto"] if name != "plain" else []
    report = warm_up(engine, max(spec.slots), extra_gammas=fixed)
    if log is not None and not getattr(engine, "cuda_graphs", False):
        log(f"warm-up {name}: nothing to capture (eager steps, no CUDA graphs)")
    elif log is not None:
        log(f"warm-up {name}: {report['shapes']} step shapes (γ {report['gammas']}, {report['length_buckets']} length "
            f"buckets) in {report['seconds']:.2f} s"
            f"{'' if report['complete'] else ' (bounded: longer rows capture on first use)'}")
    return report


def warm_engines(spec: TrafficSpec, plain, arms: dict, log=None) -> dict:
    """`warm_engine` for plain and every arm → name → report."""
    return {name: warm_engine(spec, name, engine, log) for name, engine in [("plain", plain), *arms.items()]}


def run_traffic(spec: TrafficSpec, plain, arms: dict, pool: list[list[int]], eos_ids=(), max_total=None,
                on_row=None, deadline: float | None = None, warmups: dict | None = None, log=None) -> list[ArmResult]:
    """Every cell of `spec`: plain (the engine `plain`) then each arm (name → engine) at each policy.
    on_row(ArmResult): called as each row is measured (progress, partial files). deadline (a `perf_counter`
    time): no arm starts after it (the rows measured so far are returned). warmups: a dict → each engine is
    warmed up (`warm_engine`) before its first run, its report stored there under its name (so a deadline
    spends no warm-up on arms it skips); None: the engines are used as they are."""
    rows: list[ArmResult] = []

    def warm(name, engine) -> None:
        if warmups is not None and name not in warmups:
            warmups[name] = warm_engine(spec, name, engine, log)

    capacity: dict[int, float] = {}  # slots → plain completions/s in the closed loop (for poisson:Fx)
    arrivals = sorted(spec.arrivals, key=lambda a: a.kind != "closed")  # closed first: it measures capacity
    for slots in spec.slots:
        requests = make_requests(pool, spec.requests(slots), spec, eos_ids, spec.seed + slots, max_total)
        for arrival in arrivals:
            rate = arrival.rate
            if arrival.relative is not None:
                if slots not in capacity:  # no closed loop ran at these slots: measure plain's capacity first
                    warm("plain", plain)
                    drive(plain, requests, slots, Arrival("closed"), 0, seed=spec.seed)
                    capacity[slots] = drive(plain, requests, slots, Arrival("closed"), 0, seed=spec.seed)["completed_per_s"]
                rate = arrival.relative * capacity[slots]
            cell = [("plain", plain, 0)] + [(n, e, p) for n, e in arms.items() for p in spec.policies]
            runs: list[list[dict]] = [[] for _ in cell]  # per arm: its timed runs (round k at index k)
            primed: set = set()
            stopped = False
            for k in range(spec.repeats):
                for i in [(j + k) % len(cell) for j in range(len(cell))]:  # round k: the order rotated by k
                    drafter, engine, policy = cell[i]
                    if deadline is not None and time.perf_counter() > deadline:
                        stopped = True
                        break
                    warm(drafter, engine)
                    for other in [] if drafter in primed else [0] if drafter == "plain" else spec.policies:
                        drive(engine, requests, slots, arrival, other, rate, spec.seed)  # priming (module doc)
                    primed.add(drafter)
                    if k == 0:  # untimed: the policy's step times (kept by the engine for the later rounds)
                        drive(engine, requests, slots, arrival, policy, rate, spec.seed)
                    runs[i].append(drive(engine, requests, slots, arrival, policy, rate, spec.seed))
                if stopped:
                    break
            # whole rounds only (a round's ratios are taken within it); a deadline inside the first round keeps the
            # arms it measured (plain runs first there)
            done = min(len(r) for r in runs) or 1
            for (drafter, _, policy), timed in zip(cell, runs):
                if not timed:
                    continue
                row = arm_row(slots, arrival, rate, drafter, policy, timed[:done], runs[0][:done])
                if drafter == "plain" and arrival.kind == "closed" and arrival.clients is None:
                    capacity[slots] = row.requests / row.seconds  # (plain's completions/s, for poisson:Fx)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            if stopped:
                return rows
    return rows
