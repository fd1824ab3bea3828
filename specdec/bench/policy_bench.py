"""Draft-length policy benchmark: tokens/s, τ, α, mean γ and c of each policy on several workloads.

A *workload* is a named list of prompts (token ids) with its own acceptance profile; a *configuration*
is plain decoding (drafter None, the baseline) or one drafter under one draft-length policy (a fixed γ
or a `resolve_policy` name: "heuristic", "optimal", "threshold", "guarded"). Every configuration
decodes the same prompts with the same `max_new_tokens`, batch 1, one prompt at a time.

Timing protocol (CPU machines are shared and noisy, so comparisons are paired and interleaved):
  - a short warm-up run of every configuration first (untimed);
  - for each repeat, workload and prompt, every configuration runs once, in an order rotated from one
    prompt to the next, so slow phases of the machine hit all configurations alike;
  - a configuration's time in a repeat is the sum over the workload's prompts; tokens/s is the median
    over repeats; speedup is the median over repeats of (its tokens/s ÷ plain's tokens/s, same repeat).
τ, α, mean γ and c are pooled over all prompts and repeats (`SpecStats` counts summed).
(Process CPU time was tried as a steadier clock: on the shared 2-core machine it tracked wall time within
a few percent, so the noise there is contention, not preemption, and only wall time is kept.)

With `ignore_eos` (the default) every run generates exactly `max_new_tokens` per prompt, so all
configurations do the same work. At temperature 0 every configuration must reproduce plain
decoding's output; the result counts the outputs that did (`identical_outputs`).

`run_policy_bench` returns a `PolicyBenchResult` (rows, winners, `to_dict`, `to_markdown`); nothing is
printed. The workloads (`Workload`, `code_workload`, `text_workload`, `repetitive_workload`) are built in
`specdec.bench.workloads` from local files only.
"""

from __future__ import annotations

import logging
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from specdec.bench.workloads import Workload
from specdec.metrics import SpecStats

__all__ = [
    "BenchSettings",
    "PolicyRow",
    "PolicyBenchResult",
    "DEFAULT_POLICIES",
    "ADAPTIVE_POLICIES",
    "run_policy_bench",
    "policy_label",
]

logger = logging.getLogger(__name__)

ADAPTIVE_POLICIES = ("heuristic", "optimal", "threshold", "guarded")
DEFAULT_POLICIES: tuple[int | str, ...] = (1, 2, 4, 6, 8, *ADAPTIVE_POLICIES)
PLAIN = "plain"


@dataclass(frozen=True)
class BenchSettings:
    policies: tuple[int | str, ...] = DEFAULT_POLICIES
    max_new_tokens: int = 128
    repeats: int = 3
    temperatures: tuple[float, ...] = (0.0,)
    seed: int = 0  # temperature > 0: prompt i of repeat r uses seed + 1000·r + i in every configuration
    ignore_eos: bool = True
    warmup_tokens: int = 16  # untimed warm-up run of every configuration (0 = none)

    def __post_init__(self):
        if not self.policies:
            raise ValueError("policies is empty: give at least one draft-length policy")
        for p in self.policies:
            if isinstance(p, bool) or not isinstance(p, (int, str)) or (isinstance(p, int) and p < 1):
                raise ValueError(f"policies: each must be an int >= 1 or a policy name, got {p!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of numbers >= 0, got {self.temperatures!r}")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be >= 0, got {self.warmup_tokens}")


def policy_label(policy: int | str) -> str:
    """"fixed-4" for an int (or a digit string), else the policy name."""
    if isinstance(policy, int) or (isinstance(policy, str) and policy.strip().isdigit()):
        return f"fixed-{int(policy)}"
    return str(policy).strip().lower()


def is_adaptive(label: str) -> bool:
    return not label.startswith("fixed") and label != PLAIN


@dataclass(frozen=True)
class PolicyRow:
    """One (workload, temperature, drafter, policy) cell of the benchmark."""

    workload: str
    temperature: float
    drafter: str | None  # None = plain decoding
    policy: str  # "plain", "fixed-4", "heuristic", ...
    tokens_per_second: float  # median over repeats
    tokens_per_second_runs: tuple[float, ...]  # one per repeat
    speedup: float  # median over repeats of tokens/s ÷ plain's tokens/s in the same repeat
    speedup_runs: tuple[float, ...]
    mean_accepted_length: float  # τ, pooled
    alpha: float | None  # α (exact, mean β), pooled
    mean_num_draft_tokens: float  # mean γ per speculative step
    cost_ratio: float | None  # c measured in these runs
    acceptance_rate: float | None
    predicted_speedup: float | None  # Thm 3.8 from the pooled α, c and mean γ
    generated_tokens: int  # per repeat (all prompts)
    identical_outputs: int | None  # temperature 0: outputs equal to plain decoding's (prompts × repeats)
    compared_outputs: int | None
    stats: dict = field(repr=False, default_factory=dict)  # pooled SpecStats.to_dict()

    @property
    def label(self) -> str:
        return PLAIN if self.drafter is None else f"{self.drafter}:{self.policy}"


@dataclass(frozen=True)
class PolicyBenchResult:
    rows: tuple[PolicyRow, ...]
    workloads: tuple[dict, ...]
    settings: dict
    environment: dict
    wall_time_s: float

    def row(self, workload: str, policy: str, *, drafter: str | None = "model", temperature: float | None = None) -> PolicyRow:
        for r in self.rows:
            if r.workload == workload and r.policy == policy and (policy == PLAIN or r.drafter == drafter) and (
                temperature is None or r.temperature == temperature
            ):
                return r
        raise KeyError(f"no row for workload={workload!r} policy={policy!r} drafter={drafter!r}")

    def winners(self) -> list[dict]:
        """Per (workload, temperature), ranked by median paired speedup over plain (steadier than raw tok/s
        when the machine's speed drifts between repeats): the fastest configuration and the runner-up, the
        best fixed γ, the best adaptive policy, adaptive ÷ fixed speedup (> 1: an adaptive policy beat every
        fixed γ) and in how many repeats the best adaptive policy beat the best fixed γ head to head (same
        repeat, same plain baseline)."""
        out = []
        keys = sorted({(r.workload, r.temperature) for r in self.rows}, key=lambda k: (self._workload_index(k[0]), k[1]))
        for workload, temperature in keys:
            cell = [r for r in self.rows if r.workload == workload and r.temperature == temperature]
            plain = next((r for r in cell if r.drafter is None), None)
            sp = {r.label: (r.speedup, r.speedup_runs) for r in cell}
            ranked = sorted(cell, key=lambda r: sp[r.label][0], reverse=True)
            best, runner_up = ranked[0], (ranked[1] if len(ranked) > 1 else None)
            spec = [r for r in cell if r.drafter is not None]
            fixed = [r for r in spec if not is_adaptive(r.policy)]
            adaptive = [r for r in spec if is_adaptive(r.policy)]
            best_fixed = max(fixed, key=lambda r: sp[r.label][0]) if fixed else None
            best_adaptive = max(adaptive, key=lambda r: sp[r.label][0]) if adaptive else None

            def wins(a: PolicyRow, b: PolicyRow) -> int:
                return sum(x > y for x, y in zip(sp[a.label][1], sp[b.label][1]))

            entry: dict[str, Any] = {
                "workload": workload, "temperature": temperature,
                "plain_tokens_per_second": plain.tokens_per_second if plain else None,
                "best": best.label, "best_tokens_per_second": best.tokens_per_second, "best_speedup": sp[best.label][0],
            }
            if runner_up is not None:
                entry.update(runner_up=runner_up.label, runner_up_speedup=sp[runner_up.label][0],
                             best_wins_repeats=wins(best, runner_up))
            if best_fixed is not None:
                entry.update(best_fixed=best_fixed.label, best_fixed_tokens_per_second=best_fixed.tokens_per_second,
                             best_fixed_speedup=sp[best_fixed.label][0])
            if best_adaptive is not None:
                entry.update(best_adaptive=best_adaptive.label,
                             best_adaptive_tokens_per_second=best_adaptive.tokens_per_second,
                             best_adaptive_speedup=sp[best_adaptive.label][0])
            if best_fixed is not None and best_adaptive is not None:
                entry["adaptive_over_fixed"] = sp[best_adaptive.label][0] / sp[best_fixed.label][0]
                entry["adaptive_wins_repeats"] = wins(best_adaptive, best_fixed)
            entry["repeats"] = len(sp[best.label][1])
            out.append(entry)
        return out

    def _workload_index(self, name: str) -> int:
        names = [w["name"] for w in self.workloads]
        return names.index(name) if name in names else len(names)

    def to_dict(self) -> dict:
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["label"] = r.label
            rows.append(d)
        return {"rows": rows, "winners": self.winners(), "workloads": list(self.workloads), "settings": self.settings,
                "environment": self.environment, "wall_time_s": self.wall_time_s}

    @classmethod
    def from_dict(cls, data: dict) -> "PolicyBenchResult":
        """Rebuild a result from `to_dict()` output (e.g. a saved policies.json) to re-render or re-rank it."""
        names = {f.name for f in fields(PolicyRow)}
        rows = []
        for row in data["rows"]:
            kw = {k: v for k, v in row.items() if k in names}
            kw["tokens_per_second_runs"] = tuple(kw["tokens_per_second_runs"])
            kw["speedup_runs"] = tuple(kw["speedup_runs"])
            rows.append(PolicyRow(**kw))
        return cls(rows=tuple(rows), workloads=tuple(data["workloads"]), settings=data["settings"],
                   environment=data["environment"], wall_time_s=data["wall_time_s"])

    def to_markdown(self) -> str:
        """One table per temperature: a row per (workload, configuration), then the winners."""
        lines: list[str] = []
        multi_drafter = len({r.drafter for r in self.rows if r.drafter is not None}) > 1
        for temperature in sorted({r.temperature for r in self.rows}):
            if len(lines):
                lines.append("")
            lines.append(f"temperature {temperature:g}")
            lines.append("")
            lines.append("| workload | policy | tok/s (median) | tok/s min–max | speedup (min–max) | τ | α | mean γ | c "
                         "| pred. |" + (" same as plain |" if temperature == 0 else ""))
            lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if temperature == 0 else ""))
            rows = sorted((r for r in self.rows if r.temperature == temperature),
                          key=lambda r: (self._workload_index(r.workload)))
            for r in rows:
                name = r.label if multi_drafter else r.policy
                runs = r.tokens_per_second_runs
                cells = [
                    r.workload, name, f"{r.tokens_per_second:.1f}", f"{min(runs):.1f}–{max(runs):.1f}",
                    f"{r.speedup:.2f}x ({min(r.speedup_runs):.2f}–{max(r.speedup_runs):.2f})",
                    f"{r.mean_accepted_length:.2f}", _fmt(r.alpha, ".3f"),
                    f"{r.mean_num_draft_tokens:.2f}" if r.drafter is not None else "0",
                    _fmt(r.cost_ratio, ".3f"), _fmt(r.predicted_speedup, ".2f", "x"),
                ]
                if temperature == 0:
                    cells.append("–" if r.compared_outputs is None else f"{r.identical_outputs}/{r.compared_outputs}")
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Ranked by median speedup over plain decoding (paired within each repeat):")
        lines.append("")
        for w in self.winners():
            head = f"- {w['workload']} (temperature {w['temperature']:g}): "
            if w["best"] == PLAIN:
                text = head + f"plain decoding fastest ({w['best_tokens_per_second']:.1f} tok/s): no policy paid off"
            else:
                text = head + (f"fastest {w['best']} {w['best_speedup']:.2f}x plain "
                               f"({w['best_tokens_per_second']:.1f} tok/s)")
            if "runner_up" in w:
                text += (f", next {w['runner_up']} {w['runner_up_speedup']:.2f}x "
                         f"(the fastest led it in {w['best_wins_repeats']}/{w['repeats']} repeats)")
            if "best_fixed" in w and "best_adaptive" in w:
                ratio = w["adaptive_over_fixed"]
                text += (f"; best fixed {w['best_fixed']} {w['best_fixed_speedup']:.2f}x vs best adaptive "
                         f"{w['best_adaptive']} {w['best_adaptive_speedup']:.2f}x: {_verdict(ratio)}, adaptive ahead in "
                         f"{w['adaptive_wins_repeats']}/{w['repeats']} repeats")
            lines.append(text)
        return "\n".join(lines)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _verdict(ratio: float) -> str:
    if ratio > 1:
        return f"adaptive ahead by {100 * (ratio - 1):.1f}%"
    return f"best fixed γ ahead by {100 * (1 / ratio - 1):.1f}%"


# ---------------------------------------------------------------------------------------------------
# The benchmark


def run_policy_bench(
    target,
    drafters: dict[str, Any],
    workloads: Sequence[Workload],
    settings: BenchSettings = BenchSettings(),
    *,
    eos_token_id: int | Sequence[int] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> PolicyBenchResult:
    """Run every configuration on every workload; see the module docstring for the protocol.

    target       a transformers causal LM (or a specdec target)
    drafters     name → drafter (a transformers draft model, a `Drafter`); each runs under every policy
    workloads    `Workload`s (token-id prompts)
    eos_token_id used when `settings.ignore_eos` is False (None = the target's own)
    on_progress  called with a one-line message after each (repeat, workload) block
    """
    from specdec.decoding import generate

    if not workloads:
        raise ValueError("workloads is empty: give at least one workload")
    if len({w.name for w in workloads}) != len(workloads):
        raise ValueError(f"workload names must be unique, got {[w.name for w in workloads]}")
    if not drafters:
        raise ValueError("drafters is empty: give at least one drafter (e.g. {'model': draft_model})")
    configs: list[tuple[str | None, str, int | str | None]] = [(None, PLAIN, None)]
    for drafter_name in drafters:
        for policy in settings.policies:
            configs.append((drafter_name, policy_label(policy), policy))
    if len({(d, label) for d, label, _ in configs}) != len(configs):
        raise ValueError(f"policies contain duplicates: {list(settings.policies)}")
    eos = [] if settings.ignore_eos else eos_token_id

    def run_one(config, prompt, temperature, max_new_tokens, seed):
        drafter_name, _, policy = config
        drafter = None if drafter_name is None else drafters[drafter_name]
        start = time.perf_counter()
        result = generate(
            target, [list(prompt)], drafter=drafter, max_new_tokens=max_new_tokens, temperature=temperature,
            num_draft_tokens=policy if policy is not None else 4, eos_token_id=eos, seed=seed,
        )
        return time.perf_counter() - start, result

    t_start = time.perf_counter()
    if settings.warmup_tokens:
        for config in configs:
            for temperature in settings.temperatures:
                run_one(config, workloads[0].prompts[0], temperature, settings.warmup_tokens, settings.seed)
        _report(on_progress, f"warm-up done ({len(configs)} configurations)")

    # per (temperature, workload, config): time and tokens per repeat, stats of every run, outputs
    times: dict[tuple, list[float]] = {}
    tokens: dict[tuple, list[int]] = {}
    stats: dict[tuple, list[SpecStats]] = {}
    same: dict[tuple, list[bool]] = {}
    for repeat in range(settings.repeats):
        for temperature in settings.temperatures:
            for workload in workloads:
                block_start = time.perf_counter()
                elapsed = {c[:2]: 0.0 for c in configs}
                produced = {c[:2]: 0 for c in configs}
                for i, prompt in enumerate(workload.prompts):
                    shift = (repeat * len(workload.prompts) + i) % len(configs)
                    outputs = {}
                    for config in configs[shift:] + configs[:shift]:
                        seconds, result = run_one(config, prompt, temperature, settings.max_new_tokens,
                                                  settings.seed + 1000 * repeat + i)
                        elapsed[config[:2]] += seconds
                        produced[config[:2]] += result.stats.num_generated_tokens
                        stats.setdefault((temperature, workload.name, *config[:2]), []).append(result.stats)
                        outputs[config[:2]] = result.sequences[0]
                    if temperature == 0:
                        for key, output in outputs.items():
                            same.setdefault((temperature, workload.name, *key), []).append(
                                output == outputs[(None, PLAIN)])
                for key in elapsed:
                    times.setdefault((temperature, workload.name, *key), []).append(elapsed[key])
                    tokens.setdefault((temperature, workload.name, *key), []).append(produced[key])
                _report(on_progress, f"repeat {repeat + 1}/{settings.repeats} temperature {temperature:g} "
                                     f"{workload.name}: {time.perf_counter() - block_start:.1f}s")

    rows = []
    for temperature in settings.temperatures:
        for workload in workloads:
            plain_key = (temperature, workload.name, None, PLAIN)
            plain_tps = [n / t for n, t in zip(tokens[plain_key], times[plain_key])]
            for drafter_name, label, _ in configs:
                key = (temperature, workload.name, drafter_name, label)
                tps = [n / t for n, t in zip(tokens[key], times[key])]
                pooled = SpecStats.pooled(stats[key])
                matches = same.get(key)
                rows.append(PolicyRow(
                    workload=workload.name, temperature=temperature, drafter=drafter_name, policy=label,
                    tokens_per_second=statistics.median(tps), tokens_per_second_runs=tuple(tps),
                    speedup=statistics.median(a / b for a, b in zip(tps, plain_tps)),
                    speedup_runs=tuple(a / b for a, b in zip(tps, plain_tps)),
                    mean_accepted_length=pooled.mean_accepted_length, alpha=pooled.alpha,
                    mean_num_draft_tokens=pooled.mean_num_draft_tokens, cost_ratio=pooled.cost_ratio,
                    acceptance_rate=pooled.acceptance_rate, predicted_speedup=pooled.predicted_speedup,
                    generated_tokens=int(statistics.median(tokens[key])),
                    identical_outputs=None if matches is None else sum(matches),
                    compared_outputs=None if matches is None else len(matches),
                    stats=pooled.to_dict(),
                ))
    settings_dict = asdict(settings)
    settings_dict["policies"] = [policy_label(p) for p in settings.policies]
    settings_dict["drafters"] = list(drafters)
    return PolicyBenchResult(
        rows=tuple(rows), workloads=tuple(w.summary() for w in workloads), settings=settings_dict,
        environment=environment(), wall_time_s=time.perf_counter() - t_start,
    )


def environment() -> dict:
    import torch
    import transformers  # a dependency of specdec

    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "processor": platform.processor() or None,
            "transformers": transformers.__version__}


def _report(callback: Callable[[str], None] | None, message: str) -> None:
    logger.info(message)
    if callback is not None:
        callback(message)
