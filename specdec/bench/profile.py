"""Where a decode step's time goes: GPU kernel time by kind (torch.profiler), against the step's wall time.

Used to explain a missed target with a measurement: e.g. MBU below 70% because the GEMMs themselves read
weights at X TB/s, or because N small kernels per layer add Y µs per step.
"""

from __future__ import annotations

import collections
import logging

import torch

logger = logging.getLogger(__name__)

KINDS = (
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitk", "sm90_", "cublas")),
    ("attention", ("fmha", "attention", "flash", "efficient")),
    ("norm", ("rms", "norm")),
    ("copy/index", ("copy", "scatter", "gather", "index", "cat", "roll")),
)


def _kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "elementwise/other"


def profile_steps(fn, steps: int, device: torch.device) -> dict:
    """Profile `fn()` (which runs `steps` decode steps); kernel time per step by kind, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm: graphs captured outside the profile
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
    wall_ms = start.elapsed_time(end)
    by_kind: dict = collections.defaultdict(lambda: [0.0, 0])
    by_name: dict = collections.defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = evt.time_range.elapsed_us()
        if not us:
            continue
        kind = _kind(evt.name)
        by_kind[kind][0] += us
        by_kind[kind][1] += 1
        by_name[evt.name][0] += us
        by_name[evt.name][1] += 1
    total_us = sum(v[0] for v in by_kind.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:12]
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms / steps,
        "kernel_ms_per_step": total_us / 1e3 / steps,
        "kernels_per_step": sum(v[1] for v in by_kind.values()) / steps,
        "by_kind_ms_per_step": {k: round(v[0] / 1e3 / steps, 4) for k, v in by_kind.items()},
        "kernels_by_kind_per_step": {k: round(v[1] / steps, 1) for k, v in by_kind.items()},
        "top_kernels": [{"name": n[:90], "ms_per_step": round(v[0] / 1e3 / steps, 4), "calls_per_step": v[1] / steps}
                        for n, v in top],
    }


def forward_costs(lm, batch: int, ks, prompt_len: int = 128, iters: int = 50, kernels: tuple = ()) -> dict:
    """Graph-replayed forward time (ms) of a fast model on k new tokens after `prompt_len` cached ones.

    `lm` is a FastTarget or a FastDrafter's `.state.lm`. Shows how much a (γ+1)-token verification costs over a
    1-token plain step: Thm 3.8 assumes the two cost the same.
    """
    from specdec.fast.graphs import CapturedStep

    device = lm.device
    lm.release()
    lm.allocate(batch, prompt_len + max(ks) + 8)
    model, cache = lm.model, lm.cache
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.inference_mode():
        prompt = torch.randint(3, model.shape.vocab_size, (batch, prompt_len), generator=gen).to(device)
        model(prompt, cache)
        out = {}
        for k in ks:
            tokens = torch.randint(3, model.shape.vocab_size, (batch, k), generator=gen).to(device)

            def body(tokens=tokens):
                cache.lengths.fill_(prompt_len)
                return model(tokens, cache)

            step = CapturedStep(body, pool=lm.pool(), restore=[cache.lengths])
            for _ in range(3):
                step.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                step.replay()
            end.record()
            end.synchronize()
            out[k] = round(start.elapsed_time(end) / iters, 4)
            if k in kernels:  # which kernels one forward of k tokens runs (profiled eagerly, same kernels)
                out[f"kernels_k{k}"] = _kernel_table(lambda: body())
            del step
    lm.release()
    return out


def _kernel_table(fn) -> dict:
    """name → [calls, total µs] of the CUDA kernels `fn()` launches (eager run under the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    table: dict = collections.defaultdict(lambda: [0, 0.0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            table[evt.name[:80]][0] += 1
            table[evt.name[:80]][1] += evt.time_range.elapsed_us()
    return {name: [calls, round(us, 1)] for name, (calls, us) in sorted(table.items(), key=lambda kv: -kv[1][1])}


def profile_setup(setup, log=None) -> dict:
    """`specdec bench --profile`: kernel time by kind of the wave-1 runner's batch-1 steps (plain and the model
    drafter), and forward costs by k; `log(message)` hears each part as it is measured."""
    from specdec.bench.runner import _engine, _run_engine
    from specdec.strict_json import dumps

    log = log or logger.info

    out = {}
    steps = 32
    prompts = setup.prompts[:1]
    for name, drafter, gamma in (("plain_b1", None, 0), ("model_b1", setup.drafter, setup.gamma)):
        if name == "model_b1" and drafter is None:
            continue
        setup.target.release()
        result = {}
        engine = _engine(setup, drafter, 1, gamma, False, None)

        def fn():
            result["r"] = _run_engine(engine, prompts, steps, 0.0, 0)

        fn()  # capture the graphs outside the profile
        prof = profile_steps(fn, 1, setup.device)
        if not prof["kernels_per_step"]:  # kernels inside graph replays not traced: profile the same kernels eagerly
            engine.cuda_graphs = False
            prof = profile_steps(fn, 1, setup.device)
            prof["note"] = "profiled without CUDA graphs (kernel times are the graph's kernels; wall is eager)"
        num_steps = result["r"].stats.num_steps
        for key in ("wall_ms_per_step", "kernel_ms_per_step", "kernels_per_step"):
            prof[key] = prof[key] / num_steps
        prof["by_kind_ms_per_step"] = {k: v / num_steps for k, v in prof["by_kind_ms_per_step"].items()}
        prof["kernels_by_kind_per_step"] = {k: v / num_steps for k, v in prof["kernels_by_kind_per_step"].items()}
        prof["top_kernels"] = [dict(t, ms_per_step=t["ms_per_step"] / num_steps, calls_per_step=t["calls_per_step"] / num_steps)
                               for t in prof["top_kernels"]]
        prof["steps"] = num_steps
        gemm_ms = prof["by_kind_ms_per_step"].get("gemm")
        if name == "plain_b1" and gemm_ms:
            prof["gemm_read_tbs"] = setup.weight_bytes["target"] / (gemm_ms / 1e3) / 1e12
        out[name] = prof
        log(f"profile {name}: {dumps(prof)[:600]}")
    top = setup.target.max_draft_tokens + 1
    ks = sorted({1, 2, 3, 5, min(9, top), top} & set(range(1, top + 1)))
    costs = {}
    for batch in sorted(set(setup.batch_sizes)):
        probe_ks = (1, min(setup.gamma + 1, top)) if batch == 1 else ()
        costs[f"target_b{batch}"] = forward_costs(setup.target, batch, ks, kernels=probe_ks)
        if setup.drafter is not None:
            costs[f"draft_b{batch}"] = forward_costs(setup.drafter.state.lm, batch, [1, 2])
    out["forward_ms"] = costs
    log(f"forward ms by k: {dumps(costs)}")
    return out
