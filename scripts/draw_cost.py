"""Cost of one draft draw at T=1 (`StepView.draw`): the torch reference noise vs the Triton kernels.

Run on a GPU, from the repo root (about 30 s on an H200):
    PYTHONPATH=. python scripts/draw_cost.py --out /tmp/draw_cost.json
Logic check without a GPU (Triton's interpreter, tiny shapes, eager, CPU timings meaningless):
    PYTHONPATH=. python scripts/draw_cost.py --interpret --out /tmp/draw_cost_cpu.json

Variants, each a draw of one token per row from float32 logits [B, V] at temperature 1:
  argmax      the T=0 draw (logits.argmax), for scale
  q only      the standardized law q (`StepView.probs`), which every T>0 variant computes first
  reference   q, then `rng.exponentials` in torch (the int64 hash, ~40 kernels) and `core.sample`
  kernel      q, then the Triton `rng.exponentials` (one launch) and `core.sample`
  race        q, then `rng.sample`: the fused race (noise never written) — what `StepView.draw` runs on CUDA
Timing: one CUDA graph of DRAWS consecutive draws (positions L..L+DRAWS-1, as a γ-token draft), replayed REPS
times; the median replay divided by DRAWS. Every variant's tokens are checked equal to the reference's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.device import time_call  # noqa: E402  (after the path insert)

BATCHES = (1, 8, 64)
VOCABS = (8192, 128256)
DRAWS = 4
REPS = 30
VARIANTS = ("argmax", "q only", "reference", "kernel", "race")


def _draw_fn(variant: str, view, logits, rng, sample):
    """A function drawing DRAWS tokens (one per position) with `variant` → the stacked tokens [B, DRAWS]."""
    def run():
        tokens = []
        for i in range(DRAWS):
            position = view.lengths + i
            if variant == "argmax":
                tokens.append(logits.argmax(-1))
                continue
            q = view.probs(logits[:, None])[:, 0]
            if variant == "q only":
                tokens.append(q[:, 0].long())
            elif variant == "race":
                tokens.append(rng.sample(q, view.seed, position, rng.DRAFT, kernel="triton"))
            else:
                kernel = "reference" if variant == "reference" else "triton"
                noise = rng.exponentials(view.seed, position[:, None], rng.DRAFT, q.shape[-1], kernel=kernel)[:, 0]
                tokens.append(sample(q, noise=noise))
        return torch.stack(tokens, 1)
    return run


def _time(run, device) -> float:
    """Median seconds per call of `run` (REPS replays of one CUDA graph on CUDA; eager on CPU)."""
    return time_call(run, cuda=device.type == "cuda", calls=1, reps=REPS if device.type == "cuda" else 3) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--interpret", action="store_true", help="no GPU: Triton's interpreter, tiny shapes")
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"

    global torch
    import torch

    from specdec import rng
    from specdec.core import sample
    from specdec.engine.drafters import Flavor, StepView
    from specdec.engine.slots import SlotState

    device = torch.device("cpu" if args.interpret else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("draw_cost.py needs CUDA (or --interpret)")
    batches, vocabs = ((1, 3), (37, 1100)) if args.interpret else (BATCHES, VOCABS)
    started = time.perf_counter()
    results = []
    for vocab in vocabs:
        for batch in batches:
            state = SlotState(batch, 8, device)
            state.temperature.fill_(1.0)
            state.seed.copy_(torch.arange(batch, device=device) * 1000003 + 2**33)
            state.lengths.fill_(5)
            view = StepView(state, batch, 8, Flavor(all_greedy=False))
            g = torch.Generator(device=device).manual_seed(batch * vocab)
            logits = torch.randn(batch, vocab, device=device, generator=g) * 3
            ref_tokens = _draw_fn("reference", view, logits, rng, sample)()
            row = {"batch": batch, "vocab": vocab, "ms_per_draw": {}, "same_tokens_as_reference": {}}
            for variant in VARIANTS:
                run = _draw_fn(variant, view, logits, rng, sample)
                if variant in ("kernel", "race"):
                    row["same_tokens_as_reference"][variant] = bool(torch.equal(run(), ref_tokens))
                row["ms_per_draw"][variant] = _time(run, device) / DRAWS * 1e3
            results.append(row)
    import triton

    report = {
        "command": "PYTHONPATH=. python scripts/draw_cost.py" + (" --interpret" if args.interpret else "") + " --out F",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "draws_per_graph": DRAWS, "replays": REPS,
        "seconds": round(time.perf_counter() - started, 1), "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    how = (f"median of {REPS} graph replays of {DRAWS} draws" if device.type == "cuda"
           else "eager, interpreter: a logic check only")
    print(f"draw cost, ms per draft token ({how}), {report['device']}")
    print("| B | V | " + " | ".join(VARIANTS) + " | reference / race | same tokens |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 2))
    for r in results:
        ms = r["ms_per_draw"]
        same = all(r["same_tokens_as_reference"].values())
        print(f"| {r['batch']} | {r['vocab']} | " + " | ".join(f"{ms[v]:.4f}" for v in VARIANTS)
              + f" | {ms['reference'] / ms['race']:.1f}x | {'yes' if same else 'NO'} |")
    print(f"({report['seconds']} s; JSON in {args.out})")


if __name__ == "__main__":
    main()
