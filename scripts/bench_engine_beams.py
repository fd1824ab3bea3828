"""Beam search on the shipped demo pair, batch 1: the engine's beam groups (`Engine.add_request(..., beams=...)`,
what `specdec.beam_search(engine="fast")` runs) for several drafter widths u and depths γ, against the same search on
`fast.tree_lm.FastTreeLM` outside the engine (the wave-2 fast path), plain beams on the engine (no drafter) and
transformers' own `generate(num_beams=w)`. Tokens/s = the best beam's tokens over wall time, summed over the
prompts; engines and fast models are built outside the timing and each row is warmed up once; every speculative
row checks its beams equal the plain ones and reports its beam steps per target pass.

--ops also counts the torch operators of one engine beam pass (CPU profiler; on a GPU each is about one kernel
launch, which is what an eager pass of a small model pays for): inside the target's forward, inside the drafter's,
and the rest (the draft beams' top-k, the replay of the target's beam steps, the path copies and re-gathers).

Run:  python scripts/bench_engine_beams.py --device cuda --out $OUT/beams.json     (≈ 1 min on an H100)
      OMP_NUM_THREADS=1 python scripts/bench_engine_beams.py --device cpu --max-new-tokens 32 --ops
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.bench.demo_pair import PAIR_PROMPTS, load_pair
from specdec.engine import Engine, EngineConfig
from specdec.engine.beam import BeamParams
from specdec.fast.model import FastLlama
from specdec.fast.tree_lm import FastTreeLM
from specdec.search.beam import BeamSearch
from specdec.search.beam_rules import BeamConfig
from specdec.request import SamplingParams


def timed(fn, prompts, device):
    """fn(prompt) → (best-beam tokens, beams, beam steps per pass) per prompt → (results, tokens, seconds)."""
    fn(prompts[0])  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    results = [fn(p) for p in prompts]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return results, sum(len(r[0]) for r in results), time.perf_counter() - start


def count_ops(fn, prompt, target_model: FastLlama) -> dict:
    """Leaf torch operators per target pass of `fn(prompt)` (one engine beam request), by where they run."""
    from torch.profiler import ProfilerActivity, profile, record_function

    forward = FastLlama.forward

    def labelled(self, *args, **kwargs):
        with record_function("target forward" if self is target_model else "drafter forward"):
            return forward(self, *args, **kwargs)

    FastLlama.forward = labelled
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _, _, stats = fn(prompt)
    finally:
        FastLlama.forward = forward
    counts = {"target forward": 0, "drafter forward": 0, "search (draft top-k, replay, commit)": 0}
    for event in prof.events():
        if not event.name.startswith("aten::") or event.cpu_children:
            continue
        parent, where = event.cpu_parent, "search (draft top-k, replay, commit)"
        while parent is not None:
            if parent.name in counts:
                where = parent.name
            parent = parent.cpu_parent
        counts[where] += 1
    passes = stats.passes + 1  # (the prefill's forward is counted too)
    return {name: round(value / passes) for name, value in counts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", help="float32 keeps the beam equality free of bf16 near-ties")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--configs", default="4:3,8:3,16:2",
                        help="speculative rows u:γ (drafter beam width : levels), comma-separated; the first also "
                             "runs on FastTreeLM")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PAIR_PROMPTS))
    parser.add_argument("--ops", action="store_true", help="count the torch operators of a beam pass (see above)")
    parser.add_argument("--kernels", default="auto", choices=["auto", "reference"],
                        help="the models' layer kernels (EngineConfig.kernels): auto = the fused Triton layer on CUDA, "
                             "reference = torch operators (eager passes launch Triton kernels from Python)")
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")]
    target, draft, tokenizer = load_pair(device=args.device, dtype=args.dtype)
    device = target.device
    prompts = [tokenizer(p)["input_ids"] for p in PAIR_PROMPTS[: args.prompts]]
    w, n = args.num_beams, args.max_new_tokens
    fast_target = FastLlama.from_hf(target, kernels=args.kernels)
    fast_draft = FastLlama.from_hf(draft, kernels=args.kernels)
    longest = max(map(len, prompts)) + n

    def engine(drafter, u=w, gamma=0):
        """One engine for every prompt (built here, outside the timing), a beam request per prompt."""
        built = Engine(target, drafter, EngineConfig(max_batch_size=w, max_seq_len=longest, max_tree_nodes=64,
                                                     kernels=args.kernels))
        beams = BeamParams(w, u, gamma, num_return_sequences=w)
        params = SamplingParams(temperature=0, max_new_tokens=n)

        def run(prompt):
            rid = built.add_request(prompt, params, beams=beams)
            while built.has_unfinished():
                for out in built.step():
                    if out.request_id == rid and out.finished:
                        final = out
            return final.new_token_ids, [list(b) for b in final.beams], final.beam_stats
        run.engine = built
        return run

    def tree_lm(u, gamma):
        def run(prompt):
            config = BeamConfig(w, n, (), 1.0, False)
            res = BeamSearch(FastTreeLM(fast_target), FastTreeLM(fast_draft), config, u, gamma).run([prompt])
            return res.sequences[0][0], res.sequences[0], res.stats
        return run

    def hf(prompt):
        out = target.generate(torch.tensor([prompt], device=device), do_sample=False, num_beams=w, max_new_tokens=n,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                              pad_token_id=0, eos_token_id=None)
        return out[0, len(prompt):].tolist(), None, None

    runs = [("plain beams, engine (no drafter)", engine(None))]
    for i, (u, gamma) in enumerate(configs):
        runs.append((f"speculative beams, engine (w={w}, u={u}, γ={gamma})", engine(draft, u, gamma)))
        if i == 0:
            runs.append((f"speculative beams, FastTreeLM outside the engine (w={w}, u={u}, γ={gamma})",
                         tree_lm(u, gamma)))
    runs.append((f"transformers generate(num_beams={w})", hf))
    rows, plain = [], None
    for name, fn in runs:
        results, tokens, seconds = timed(fn, prompts, device)
        beams = [r[1] for r in results]
        if plain is None:
            plain = beams
        stats = [r[2] for r in results if r[2] is not None]
        spp = sum(s.beam_steps for s in stats) / sum(s.prompt_passes for s in stats) if stats else None
        row = {"name": name, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
               "beam_steps_per_pass": spp, "identical_beams": None if beams[0] is None else beams == plain}
        if args.ops and hasattr(fn, "engine"):
            row["ops_per_pass"] = count_ops(fn, prompts[0], fn.engine.model)
        rows.append(row)
    base = rows[0]["tokens_per_s"]
    lines = [f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {args.dtype}, "
             f"{len(prompts)} prompts × {n} tokens, batch 1, no EOS, kernels {args.kernels}",
             "| configuration | tokens/s | vs plain engine beams | beam steps per pass | identical beams |",
             "|---|---|---|---|---|"]
    for r in rows:
        spp = "-" if r["beam_steps_per_pass"] is None else f"{r['beam_steps_per_pass']:.2f}"
        same = "-" if r["identical_beams"] is None else ("yes" if r["identical_beams"] else "NO")
        lines.append(f"| {r['name']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f}x | {spp} | {same} |")
    if args.ops:
        lines += ["", "| engine row | ops per pass: target forward | drafter forward | search |", "|---|---|---|---|"]
        lines += [f"| {r['name']} | " + " | ".join(str(v) for v in r["ops_per_pass"].values()) + " |"
                  for r in rows if "ops_per_pass" in r]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "table": lines}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
