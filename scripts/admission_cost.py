"""What admitting requests costs the engine (`Engine._admit`: slot writes, target and drafter prefill, the final
sync), the code before the bounded-span change against the code now, on a zoo-`gpu`-shaped random pair.

    python scripts/admission_cost.py --out admission.json [--lengths 32 128 256 512] [--rows 1 8 64] [--repeats 5]
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python scripts/admission_cost.py --out /tmp/a.json   # CPU: a tiny smoke run

Target: the zoo `gpu` preset's shape (24 layers, dim 1024, 16 heads of 64, MLP 2816, vocab 8192, context 1024),
random bf16 weights (`FastLlama.random`); drafters: a random 2-layer dim-256 model (the preset's draft shape) and
a random `FeatureHead`, each in its own engine (max_batch_size 64). For each drafter, prompt length and number of
requests admitted together, the median wall time of `_admit` over --repeats (after one untimed warm-up) in modes:

  old        the code before this change, kept below as the baseline: per-request slot writes with blocking
             copies, every chunk attending over the whole cache, a host sync per chunk (`valid.any()`)
  full-span  the code now, but every chunk attending over the whole cache (`extent=None`)
  new        the code now: each chunk attends over a power-of-two positions bucket past what it feeds
  graphs     new, with the engine's EXPERIMENTAL `prefill_graphs` (`slots.PrefillGraphs`): chunk shapes seen
             before replay as CUDA graphs (CUDA only; its warm-up runs eagerly once, then captures)

plus `host_ms`, the time until the final `torch.cuda.synchronize` was called (≈ wall: admission is bound by
the host's launches, not by the device). `exact`: old and new (and graphs, replaying graphs captured on other
prompts of the same lengths) leave bit-identical cache entries (target, drafter) and target features at every
fed position. `release`: one `_release` that moves the last of 64 running
requests (prompt 512) into a freed slot, old (the drafter's whole cache moved) and new. On CPU (no CUDA) a tiny
shape and a few sizes only (a smoke check; the timings mean nothing there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine import drafters as drafters_module
from specdec.engine import engine as engine_module
from specdec.engine import feature_drafter as feature_module
from specdec.engine.feature_drafter import EngineFeatureDrafter
from specdec.engine.slots import PrefillGraphs
from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, KVCache, LlamaShape
from specdec.request import SamplingParams
from specdec.zoo.presets import get_preset


# ----------------------------------------------------------------------------- the baseline: the code before
def _old_state_admit(state, slot, prompt, params, seed) -> None:
    device = state.tokens.device
    state.tokens[slot].zero_()
    state.tokens[slot, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    state.lengths[slot] = len(prompt)
    state.generated[slot] = 0
    state.max_new[slot] = params.max_new_tokens
    state.active[slot] = True
    state.temperature[slot] = float(params.temperature)
    state.top_k[slot] = params.top_k
    state.top_p[slot] = float(params.top_p)
    state.seed[slot] = seed
    state.eos[slot] = -1
    state.counters[slot] = 0
    if params.eos_token_ids:
        state.eos[slot, : len(params.eos_token_ids)] = torch.tensor(params.eos_token_ids, device=device)


def _old_prefill_rows(model, cache, state, rows, starts, ends, chunk, *, features=None, embeds=None) -> None:
    if max(e - s for s, e in zip(starts, ends)) <= 0:
        return
    layers, span = range(cache.keys.shape[0]), cache.num_positions  # (SlotCache.view as it was)
    view = KVCache([cache.keys[i, rows, :, :span] for i in layers], [cache.values[i, rows, :, :span] for i in layers],
                   cache.lengths[rows])
    device = state.tokens.device
    start_t = torch.tensor(starts, device=device)[:, None]
    end_t = torch.tensor(ends, device=device)[:, None]
    view.lengths.copy_(start_t[:, 0])
    capacity = state.tokens.shape[1]
    lo, hi = min(starts), max(ends)
    for first in range(lo, hi, chunk):
        width = min(chunk, hi - first)
        bucket = min(max(16, 1 << (width - 1).bit_length()), chunk, capacity - first)
        cols = first + torch.arange(bucket, device=device)[None, :]
        valid = (cols >= start_t) & (cols < end_t)
        if not bool(valid.any()):
            continue
        tokens = None if embeds is not None else state.tokens[rows, first : first + bucket] * valid
        vectors = None if embeds is None else embeds(rows, first, bucket)
        want = features is not None
        _, hidden = model(tokens, view, valid, embeds=vectors, last_only=not want, return_hidden=True,
                          compute_logits=False, kernels="reference")
        if want:
            block = features[rows, first : first + bucket]
            block.copy_(torch.where(valid[..., None], hidden.to(block.dtype), block))


def _old_admit(engine: Engine, outputs) -> None:
    first, admitted = len(engine._running), []
    while len(engine._running) < engine.max_batch and engine._waiting:
        request = engine._waiting.popleft()
        _old_state_admit(engine.state, len(engine._running), request.prompt, request.params, request.seed)
        engine._running.append(request)
        engine._joined(request)
        admitted.append(request)
    rows, chunk, n = slice(first, len(engine._running)), engine.config.prefill_chunk, len(admitted)
    lengths = [len(r.prompt) for r in admitted]
    _old_prefill_rows(engine.model, engine.cache, engine.state, rows, [0] * n, [m - 1 for m in lengths], chunk,
                      features=engine.state.features)
    drafter, valid = engine.drafter, [max(m - 2, 0) for m in lengths]
    if isinstance(drafter, EngineFeatureDrafter):  # (its starts, max(0 − window, 0), are 0)
        _old_prefill_rows(drafter.head.layer, drafter.cache, engine.state, rows, [0] * n, valid, chunk,
                          embeds=drafter._entries)
    else:
        _old_prefill_rows(drafter.model, drafter.cache, engine.state, rows, [0] * n, valid, chunk)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _old_release(engine: Engine, slot: int) -> None:
    last = len(engine._running) - 1
    if slot != last:
        moved = engine._running[last]
        positions = min(engine.num_positions, 1 << max(moved.length + 1, 1).bit_length())
        engine.cache.move(last, slot, positions)
        engine.state.move(last, slot)
        engine.drafter.cache.move(last, slot, engine.drafter.cache.num_positions)
        engine._running[slot] = moved
    engine._running.pop()
    engine._flavor = None
    engine.state.clear(last)


# ----------------------------------------------------------------------------------------------- modes
@contextlib.contextmanager
def _full_span():
    """The code now with `extent=None` forced: every chunk attends over the whole cache."""
    modules = (engine_module, drafters_module, feature_module)
    saved = [m.prefill_rows for m in modules]

    def full(*args, **kwargs):
        kwargs["extent"] = None
        return saved[0](*args, **kwargs)

    for m in modules:
        m.prefill_rows = full
    try:
        yield
    finally:
        for m, fn in zip(modules, saved):
            m.prefill_rows = fn


def _admit(engine: Engine, mode: str) -> tuple[float, float]:
    """One admission of the waiting requests → (wall s, host s until the final sync was called)."""
    called = []
    sync = torch.cuda.synchronize

    def timed_sync(*a, **k):
        called.append(time.perf_counter())
        return sync(*a, **k)

    torch.cuda.synchronize = timed_sync
    try:
        start = time.perf_counter()
        if mode == "old":
            _old_admit(engine, [])
        elif mode == "full-span":
            with _full_span():
                engine._admit([])
        elif mode == "graphs":
            engine.prefill_graphs = engine.__dict__.get("_bench_graphs") or PrefillGraphs()
            engine._bench_graphs = engine.prefill_graphs
            try:
                engine._admit([])
            finally:
                engine.prefill_graphs = None
        else:
            engine._admit([])
        wall = time.perf_counter() - start
    finally:
        torch.cuda.synchronize = sync
    return wall, (called[-1] - start if called else wall)


def _clear(engine: Engine) -> None:
    for slot in reversed(range(engine.num_running)):
        engine._release(slot)  # the last slot: nothing moves
    engine._known.clear()


def _queue(engine: Engine, prompts) -> None:
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=8))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_admission(engine, prompts, mode, repeats) -> dict:
    walls, hosts = [], []
    warmup = 2 if mode == "graphs" else 1  # allocator, cuBLAS plans (graphs: an eager sighting, then the capture)
    for i in range(repeats + warmup):
        _queue(engine, prompts)
        _sync(engine.device)
        wall, host = _admit(engine, mode)
        _clear(engine)
        if i >= warmup:
            walls.append(wall)
            hosts.append(host)
    return {"ms": 1e3 * statistics.median(walls), "host_ms": 1e3 * statistics.median(hosts)}


def snapshot(engine, prompts) -> list[torch.Tensor]:
    """Every fed entry of the admitted rows (target K/V + features, drafter K/V), flattened and concatenated."""
    out = []
    for slot, p in enumerate(prompts):
        t_end, d_end = len(p) - 1, max(len(p) - 2, 0)
        out += [engine.cache.keys[:, slot, :, :t_end].flatten(), engine.cache.values[:, slot, :, :t_end].flatten(),
                engine.drafter.cache.keys[:, slot, :, :d_end].flatten(),
                engine.drafter.cache.values[:, slot, :, :d_end].flatten()]
        if engine.state.features is not None:
            out.append(engine.state.features[slot, :t_end].flatten())
    return torch.cat(out).clone()


def check_exact(engine, prompts, modes) -> dict:
    """Each mode's fed entries against old's, bit for bit (graphs: captured and replayed on other prompts first)."""
    results = {}
    for mode in modes:
        if mode == "graphs":
            for shift in (1, 2):  # the same lengths, other tokens: an eager sighting, then the capture
                _queue(engine, [p[shift:] + p[:shift] for p in prompts])
                _admit(engine, mode)
                _clear(engine)
        _queue(engine, prompts)
        _admit(engine, mode)
        results[mode] = snapshot(engine, prompts).view(torch.uint8)
        _clear(engine)
    return {mode: bool(torch.equal(results["old"], r)) for mode, r in results.items() if mode != "old"}


def time_release(engine, prompts, repeats) -> dict:
    out = {}
    for mode, release in (("old", lambda slot: _old_release(engine, slot)), ("new", engine._release)):
        _queue(engine, prompts)
        _admit(engine, "new")
        times = []
        for _ in range(repeats):
            _sync(engine.device)
            start = time.perf_counter()
            release(0)  # the last running request moves into slot 0
            _sync(engine.device)
            times.append(time.perf_counter() - start)
        _clear(engine)
        out[mode] = 1e3 * statistics.median(times)
    return out


def build(device, dtype, tiny: bool):
    if tiny:
        target_shape = LlamaShape(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16,
                                  intermediate_size=128, max_positions=1024)
        draft_shape = LlamaShape(vocab_size=512, dim=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
                                 intermediate_size=64, max_positions=1024)
    else:
        preset = get_preset("gpu")
        t, d = preset.target, preset.drafts[0].shape

        def shape(s):
            return LlamaShape(vocab_size=8192, dim=s.dim, n_layers=s.layers, n_heads=s.heads,
                              n_kv_heads=s.kv_heads or s.heads, head_dim=s.dim // s.heads, intermediate_size=s.ff,
                              max_positions=s.max_len)

        target_shape, draft_shape = shape(t), shape(d)
    target = FastLlama.random(target_shape, device=device, dtype=dtype, seed=0)
    draft = FastLlama.random(draft_shape, device=device, dtype=dtype, seed=1)
    config = HeadConfig.for_target(target_shape)
    head = FeatureHead(config, layer=FastLlama.random(config.layer_shape(), device=device, dtype=dtype, seed=2))
    with torch.no_grad():
        head.fc.normal_(0.0, 0.02, generator=torch.Generator(device=device).manual_seed(3))
    engine_config = EngineConfig(max_batch_size=64)
    return target_shape, {"model": Engine(target, draft, engine_config), "feature": Engine(target, head, engine_config)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON output path")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="prompt lengths (default 32 128 256 512)")
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="requests admitted together (default 1 8 64)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    tiny = not cuda
    lengths = args.lengths or ([32, 128, 256, 512] if cuda else [32, 128])
    sizes = args.rows or ([1, 8, 64] if cuda else [1, 8])
    repeats = args.repeats if cuda else min(args.repeats, 2)
    began = time.perf_counter()
    shape, engines = build(device, torch.bfloat16 if cuda else torch.float32, tiny)
    gen = torch.Generator().manual_seed(0)
    modes = ("old", "full-span", "new", "graphs") if cuda else ("old", "full-span", "new")
    results = {"device": torch.cuda.get_device_name() if cuda else "cpu (tiny smoke shape)", "target": vars(shape),
               "prefill_chunk": EngineConfig().prefill_chunk, "num_positions": engines["model"].num_positions,
               "rows": [], "exact": {}, "release_ms": {}}
    print("| drafter | requests | prompt | " + " | ".join(f"{m} ms" for m in modes) + " | new host ms | old/new |")
    print("|---|---:|---:|" + "---:|" * (len(modes) + 2))
    with torch.inference_mode():
        for kind, engine in engines.items():
            mixed = [torch.randint(3, shape.vocab_size, (n,), generator=gen).tolist() for n in (5, 77, 300, 700)]
            results["exact"][kind] = check_exact(engine, mixed, modes)  # 700: two chunks of 512
            for n in sizes:
                for length in lengths:
                    prompts = torch.randint(3, shape.vocab_size, (n, length), generator=gen).tolist()
                    row = {"drafter": kind, "requests": n, "prompt": length}
                    for mode in modes:
                        timing = time_admission(engine, prompts, mode, repeats)
                        row[mode] = timing["ms"]
                        row[f"{mode}_host"] = timing["host_ms"]
                    results["rows"].append(row)
                    print(f"| {kind} | {n} | {length} | " + " | ".join(f"{row[m]:.2f}" for m in modes)
                          + f" | {row['new_host']:.2f} | {row['old'] / row['new']:.2f}x |", flush=True)
            prompts = torch.randint(3, shape.vocab_size, (max(sizes), max(lengths)), generator=gen).tolist()
            results["release_ms"][kind] = time_release(engine, prompts, repeats)
    for kind in engines:
        r = results["release_ms"][kind]
        print(f"release ({kind} drafter, {max(sizes)} running, prompt {max(lengths)}): old {r['old']:.3f} ms, "
              f"new {r['new']:.3f} ms; bit for bit as old: {results['exact'][kind]}")
    results["seconds"] = time.perf_counter() - began
    print(f"total {results['seconds']:.1f} s")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(all(e.values()) for e in results["exact"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
