"""Side-by-side measurements on the same prompts: ours (fused engine / generic loop) vs Hugging Face generate.

Every configuration is warmed up with one full run (CUDA graphs are captured there), then timed
`repeats` times; the median run is reported. A row holds tokens/s, α, τ, c, the Thm 3.8 prediction from
that run's own α, c and γ, the measured speedup over the matching plain-decoding row, the MBU of plain
decoding and the peak extra GPU memory of the configuration. EOS never stops a row (every row makes
exactly max_new_tokens), so all rows do the same amount of work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass, field

import torch

import specdec
from specdec.analysis import median_timed
from specdec.metrics import SpecStats
from specdec.bench.device import mbu, peak_memory
from specdec.drafters.model import ModelDrafter
from specdec.fast import FastTarget

logger = logging.getLogger(__name__)

HF_PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example value


@dataclass
class BenchSetup:
    """Everything one benchmark run measures: models, prompts, and the grid of configurations."""

    name: str
    device: torch.device
    target: FastTarget
    drafter: ModelDrafter | None  # a `fast.FastDrafter`: the model drafter over a FastLlama
    prompts: list[list[int]]  # a pool; batch size b uses the first b
    max_new_tokens: int
    gamma: int
    batch_sizes: tuple[int, ...] = (1, 8)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    drafter_kinds: tuple[str, ...] = ("model", "bigram", "prompt_lookup")
    loop_kinds: tuple[str, ...] = ("none", "model")  # also timed through the generic `specdec.generate` loop
    gamma_sweep: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    repeats: int = 3
    hf_target: torch.nn.Module | None = None
    hf_draft: torch.nn.Module | None = None
    hf_repeats: int = 1
    hf_max_new_tokens: int | None = None  # default: max_new_tokens
    fit_corpus: list[list[int]] = field(default_factory=list)  # the bigram drafter's fitting text
    synthetic_alphas: tuple[float, ...] = ()
    synthetic_gammas: tuple[int, ...] = (2, 4, 8)
    guarded_batch: int | None = 8  # batch size at which auto_off rows are added (None: none)
    b1_prompts: int = 1  # batch-1 rows run this many prompts one after another (α of one prompt is noisy)
    weight_bytes: dict = field(default_factory=dict)
    peak_bandwidth: float | None = None
    notes: list[str] = field(default_factory=list)


def _bigram(setup: BenchSetup):
    vocab = setup.target.vocab_size
    return specdec.NGramDrafter(2).fit(setup.fit_corpus or setup.prompts, vocab)  # tables go to the device once


def make_drafter(setup: BenchSetup, kind: str):
    if kind == "none":
        return None
    if kind == "model":
        return setup.drafter
    if kind == "bigram":
        return _bigram(setup)
    if kind == "prompt_lookup":
        return specdec.PromptLookupDrafter()
    raise ValueError(f"unknown drafter kind {kind!r}")


def _release(setup: BenchSetup) -> None:
    setup.target.release()
    if setup.drafter is not None:
        setup.drafter.state.lm.release()


def measure_ours(setup: BenchSetup, engine: str, kind: str, temperature: float, batch: int, gamma: int, *,
                 auto_off: bool = False, synthetic: float | None = None) -> dict:
    """One configuration of our decoding: engine 'engine' (fused, one sync/step) or 'loop' (specdec.generate)."""
    requests = [setup.prompts[i : i + 1] for i in range(setup.b1_prompts)] if batch == 1 else [setup.prompts[:batch]]
    drafter = make_drafter(setup, kind)
    gamma = gamma if drafter is not None else 0
    _release(setup)
    mem: dict = {}
    with peak_memory(setup.device, mem):
        if engine == "engine":
            eng = _engine(setup, drafter, batch, gamma, auto_off, synthetic)

            def one(prompts, seed):
                return _run_engine(eng, prompts, setup.max_new_tokens, temperature, seed)
        else:
            def one(prompts, seed):
                return specdec.generate(setup.target, prompts, drafter=drafter, max_new_tokens=setup.max_new_tokens,
                                        temperature=temperature, num_draft_tokens=max(gamma, 1), eos_token_id=[],
                                        seed=seed, engine="hf")

        def run(seed):
            return [one(prompts, seed * 100 + i) for i, prompts in enumerate(requests)]

        wall, results = median_timed(run, setup.device, setup.repeats)
        del run, one
        if engine == "engine":
            del eng
    stats = SpecStats.pooled(r.stats for r in results)
    if gamma and stats.drafter_calls == 0:  # table/lookup drafters: c per drafted position
        stats = dataclasses.replace(stats, drafter_calls=stats.num_steps * gamma)
    tokens = stats.num_generated_tokens
    decode_s = max(wall - stats.prefill_time_s, 1e-12)
    row = {
        "method": f"ours-{engine}",
        "drafter": kind if synthetic is None else f"{kind} (synthetic α={synthetic})",
        "temperature": temperature,
        "batch": batch,
        "gamma": gamma,
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "prefill_s": stats.prefill_time_s,
        "steps": stats.num_steps,
        "requests": len(requests),
        "alpha": stats.alpha,
        "tau": stats.mean_accepted_length,
        "c": stats.cost_ratio,
        "predicted_speedup": stats.predicted_speedup if gamma else 1.0,
        "draft_ms_per_step": 1e3 * stats.draft_time_s / max(stats.num_steps, 1),
        "verify_ms_per_step": 1e3 * stats.verify_time_s / max(stats.num_steps, 1),
        "peak_extra_mib": _mib(mem.get("peak_extra_bytes")),
        "weights_mib": _mib(setup.weight_bytes.get("target", 0) + (setup.weight_bytes.get("draft", 0) if kind == "model" else 0)),
        "auto_off": auto_off,
        "synthetic_alpha": synthetic,
    }
    if auto_off:
        row["auto_off_kept_gamma"] = stats.mean_num_draft_tokens  # the γ the engine's "auto" policy used, on average
    if not gamma:
        forwards_per_s = stats.num_steps / decode_s
        row["target_forwards_per_s"] = forwards_per_s
        row["mbu"] = mbu(setup.weight_bytes.get("target", 0), forwards_per_s, setup.peak_bandwidth)
    return row


def _engine(setup: BenchSetup, drafter, batch: int, gamma: int, auto: bool, synthetic: float | None):
    """A request-level engine for one configuration (its graphs are captured by `median_timed`'s warm-up run)."""
    from specdec.engine import Engine, EngineConfig

    model = setup.target.model if hasattr(setup.target, "model") else setup.target
    longest = max(len(p) for p in setup.prompts) + setup.max_new_tokens + 1
    seq = 1 << (longest - 1).bit_length()
    context = getattr(model.shape, "max_positions", None) or seq
    config = EngineConfig(max_batch_size=max(batch, 1), max_seq_len=min(seq, context),
                          num_draft_tokens="auto" if auto else gamma, max_draft_tokens=max(gamma, 1),
                          synthetic_acceptance=synthetic)
    return Engine(setup.target, drafter, config)


def _run_engine(engine, prompts, max_new_tokens: int, temperature: float, seed: int):
    """One batch of requests through `engine`, to completion → a `GenerateResult`."""
    from specdec.request import SamplingParams
    from specdec.step import GenerateResult

    start = time.perf_counter()
    engine.stats = SpecStats()
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                                seed=seed * 1000 + i)) for i, p in enumerate(prompts)]
    index = {rid: i for i, rid in enumerate(ids)}
    outputs: list[list[int]] = [[] for _ in prompts]
    prefill = 0.0
    while engine.has_unfinished():
        for out in engine.step():
            outputs[index[out.request_id]].extend(out.new_token_ids)
            if out.stats is not None:
                prefill = max(prefill, out.stats.prefill_time_s)
    stats = engine.stats
    stats.add_prefill(prefill, 1)  # the prefill pass
    stats.set_wall_time(time.perf_counter() - start)
    return GenerateResult(outputs, stats)


def _mib(nbytes):
    return None if nbytes is None else nbytes / 2**20


def measure_hf(setup: BenchSetup, kind: str, temperature: float, batch: int) -> dict:
    """transformers `generate`: plain, assisted (assistant_model) or prompt lookup; same prompts and length."""
    model = setup.hf_target
    max_new = setup.hf_max_new_tokens or setup.max_new_tokens
    requests = [setup.prompts[i : i + 1] for i in range(setup.b1_prompts)] if batch == 1 else [setup.prompts[:batch]]
    kwargs = dict(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=temperature > 0, pad_token_id=0)
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if kind == "assisted":
        kwargs["assistant_model"] = setup.hf_draft
    elif kind == "prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = HF_PROMPT_LOOKUP_TOKENS
    mem: dict = {}
    with peak_memory(setup.device, mem), torch.inference_mode():
        def run(seed, requests=requests, kwargs=kwargs):
            torch.manual_seed(seed)
            made = 0
            for prompts in requests:
                ids = torch.tensor(prompts, device=setup.device)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
                made += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            return made

        short = dict(kwargs, max_new_tokens=8, min_new_tokens=8)  # eager HF needs no long warm-up
        wall, tokens = median_timed(run, setup.device, setup.hf_repeats, warmup=lambda: run(0, requests[:1], short))
    weights = setup.weight_bytes.get("hf_target", 0) + (setup.weight_bytes.get("hf_draft", 0) if kind == "assisted" else 0)
    return {
        "method": "hf",
        "drafter": {"plain": "none", "assisted": "model (assisted)", "prompt_lookup": "prompt_lookup"}[kind],
        "temperature": temperature,
        "batch": batch,
        "gamma": None,
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "requests": len(requests),
        "peak_extra_mib": _mib(mem.get("peak_extra_bytes")),
        "weights_mib": _mib(weights),
        "note": "HF defaults (assistant: num_assistant_tokens=20, its own schedule)" if kind == "assisted" else
                (f"prompt_lookup_num_tokens={HF_PROMPT_LOOKUP_TOKENS}" if kind == "prompt_lookup" else ""),
    }


def _hf_unsupported(kind: str, temperature: float, batch: int) -> dict:
    return {"method": "hf", "drafter": {"assisted": "model (assisted)", "prompt_lookup": "prompt_lookup"}[kind],
            "temperature": temperature, "batch": batch, "gamma": None, "tokens_per_s": None,
            "note": "not supported by transformers (assisted generation needs batch size 1)"}


def run_grid(setup: BenchSetup, log: Callable[[str], None] = logger.info,
             on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """All configurations of `setup`; fills measured_speedup from the matching plain row."""
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        log(_one_line(row))
        if on_row is not None:
            on_row(row)

    for temperature in setup.temperatures:
        # γ sweep first (model drafter, batch 1, fused engine): it also picks nothing; the grid uses setup.gamma
        if setup.drafter is not None:
            for gamma in setup.gamma_sweep:
                row = measure_ours(setup, "engine", "model", temperature, 1, gamma)
                row["sweep"] = True
                add(row)
        for batch in setup.batch_sizes:
            add(measure_ours(setup, "engine", "none", temperature, batch, 0))
            for kind in setup.drafter_kinds:
                if kind == "model" and setup.drafter is None:
                    continue
                add(measure_ours(setup, "engine", kind, temperature, batch, setup.gamma))
                if batch == setup.guarded_batch:
                    add(measure_ours(setup, "engine", kind, temperature, batch, setup.gamma, auto_off=True))
            for kind in setup.loop_kinds:
                if kind == "model" and setup.drafter is None:
                    continue
                add(measure_ours(setup, "loop", kind, temperature, batch, setup.gamma))
            if setup.hf_target is not None:
                add(measure_hf(setup, "plain", temperature, batch))
                for kind in ("assisted", "prompt_lookup"):
                    if kind == "assisted" and setup.hf_draft is None:
                        continue
                    add(measure_hf(setup, kind, temperature, batch) if batch == 1 else _hf_unsupported(kind, temperature, batch))
    for alpha in setup.synthetic_alphas:
        for gamma in setup.synthetic_gammas:
            add(measure_ours(setup, "engine", "model", 0.0, 1, gamma, synthetic=alpha))
    _fill_speedups(rows)
    return rows


def _fill_speedups(rows: list[dict]) -> None:
    plain = {}
    for r in rows:
        if r.get("tokens_per_s") and r["drafter"] == "none":
            plain[(r["method"], r["temperature"], r["batch"])] = r["tokens_per_s"]
    for r in rows:
        base = plain.get((r["method"], r["temperature"], r["batch"]))
        if r.get("tokens_per_s") and base:
            r["measured_speedup"] = r["tokens_per_s"] / base
        if r.get("predicted_speedup") and r.get("measured_speedup") and r.get("gamma"):
            r["measured_over_predicted"] = r["measured_speedup"] / r["predicted_speedup"]


def _fmt(x, spec=".3g"):
    return "—" if x is None else format(x, spec)


def _one_line(r: dict) -> str:
    return (f"{r['method']:<12} {r['drafter']:<28} T={r['temperature']} B={r['batch']} γ={r.get('gamma')} "
            f"tok/s={_fmt(r.get('tokens_per_s'), '.1f')} α={_fmt(r.get('alpha'))} τ={_fmt(r.get('tau'))} "
            f"c={_fmt(r.get('c'))} pred={_fmt(r.get('predicted_speedup'))} mbu={_fmt(r.get('mbu'))} "
            f"peak+={_fmt(r.get('peak_extra_mib'), '.0f')}MiB")


def headline(rows: list[dict]) -> dict:
    """The numbers a reader wants first: model drafter, batch 1, fused engine, at each temperature."""
    out: dict = {}
    for r in rows:
        if r["method"] == "ours-engine" and r["drafter"] == "model" and r["batch"] == 1 and not r.get("sweep") \
                and not r.get("auto_off") and r.get("synthetic_alpha") is None:
            key = "t0" if r["temperature"] == 0 else f"t{r['temperature']:g}"
            out[key] = {k: r.get(k) for k in ("alpha", "tau", "c", "gamma", "tokens_per_s", "predicted_speedup",
                                              "measured_speedup", "measured_over_predicted")}
    for r in rows:
        if r["method"] == "hf" and r["batch"] == 1 and r.get("tokens_per_s"):
            key = "t0" if r["temperature"] == 0 else f"t{r['temperature']:g}"
            name = {"none": "hf_plain", "model (assisted)": "hf_assisted", "prompt_lookup": "hf_prompt_lookup"}[r["drafter"]]
            out.setdefault(name, {})[key] = {"tokens_per_s": r["tokens_per_s"]}
            ours = out.get(key, {}).get("tokens_per_s")
            if ours and name == "hf_assisted":
                out[name][key]["ours_model_over_hf_assisted"] = ours / r["tokens_per_s"]
    return out
