"""Training throughput of the zoo `gpu` pair on one GPU: today's settings vs each speed-up vs all of them.

    python scripts/train_speed.py --data data/code --out train_speed.json      # < 4 minutes on an H200

Each variant builds a fresh model (same seed) and runs `specdec.zoo.train.run_training` for 5 warm-up
steps + `--steps` timed steps; it reports the steady tokens/s and MFU (steps 5..end, synchronized, no
evaluation, PaLM FLOPs: 6·N + 12·L·d·T per token against the bf16 dense peak) and the first step's time
(with torch.compile: mostly the compile). Variants:

    baseline         the loop as it was: host sync every step, CPU-built batches, HF SDPA (mask under
                     compile), two-pass fp32 loss (cross-entropy + a second logsumexp for the z-loss)
    fast             fused AdamW skipped on the device, device-side windows, causal SDPA, one-lse loss, no compile
    fast+compile     + torch.compile of the model and the loss (the default on CUDA now)
    all-b48          fast+compile at batch 48 (lr unchanged: throughput only)
    draft-eager / draft-compile   the 3.7M drafter's pre-training settings (batch 64 × 512), without / with compile
    compile-hf-attn  fast+compile but HF's own SDPA attention (shows what the mask costs under compile)

The JSON is rewritten after every variant; a variant that runs out of memory is recorded as such.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.zoo import speed, train  # noqa: E402
from specdec.zoo.data import TokenData  # noqa: E402
from specdec.zoo.presets import get_preset  # noqa: E402

VARIANTS = ("baseline", "fast", "fast+compile", "all-b48", "draft-eager", "draft-compile", "compile-hf-attn")


def old_loss(z_loss: float):
    """The loss as it was before the fast path: F.cross_entropy, then a masked copy for the z-loss."""

    def loss_fn(model, batch):
        logits, targets = train.forward_logits(model, batch)
        logits, targets = logits.float().flatten(0, 1), targets.flatten()
        ce = F.cross_entropy(logits, targets, ignore_index=-100)
        lse = torch.logsumexp(logits[targets != -100], dim=-1)
        return ce + z_loss * lse.pow(2).mean(), ce

    return loss_fn


@contextlib.contextmanager
def hf_attention():
    """Run with the model's own attention implementation (no causal-SDPA swap)."""
    original = speed.causal_attention

    @contextlib.contextmanager
    def off(model, enabled=True):
        yield speed.AttentionSwap()

    speed.causal_attention = off
    try:
        yield
    finally:
        speed.causal_attention = original


def run_variant(name: str, data: TokenData, steps: int, preset_name: str = "gpu", device: str = "cuda") -> dict:
    preset = get_preset(preset_name)
    draft = name.startswith("draft")
    shape = preset.drafts[0].shape if draft else preset.target
    base = preset.drafts[0].pretrain if draft else preset.target_train
    cfg = replace(base, steps=5 + steps, max_seconds=None, eval_every=10**9, eval_batches=1, warmup_steps=5,
                  log_every=10, compile=name in ("fast+compile", "compile-hf-attn", "all-b48", "draft-compile"))
    if name == "all-b48":
        cfg = replace(cfg, batch_size=48)
    kwargs = {"fast": name != "baseline"}
    if name == "baseline":
        kwargs["loss_fn"] = old_loss(cfg.z_loss)
    model = train.build_model(shape, int(data.meta["vocab_size"]), seed=0)
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    ctx = hf_attention() if name in ("baseline", "compile-hf-attn") else contextlib.nullcontext()
    with ctx:
        result = train.run_training(model, data, cfg, device=device, progress=False, desc=name, **kwargs)
    row = {"variant": name, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "params": result.params,
           "steps": result.steps, "steady_tokens_per_s": result.steady_tokens_per_s, "steady_mfu": result.steady_mfu,
           "first_step_s": result.first_step_seconds, "compiled": result.compiled,
           "causal_attention": result.causal_attention, "fast": result.fast, "peak_memory_gb": result.peak_memory_gb,
           "final_loss": result.final_loss, "wall_s": round(time.perf_counter() - t0, 1),
           "flops_per_token": train.flops_per_token(model, cfg.seq_len)}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/code"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant (after 5 warm-up steps)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--max-seconds", type=float, default=225, help="skip the variants left after this much")
    ap.add_argument("--preset", default="gpu", help="`tiny` + `--device cpu`: a seconds-long smoke run of the script")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_speed.py measures GPU training; no CUDA device here "
                         "(smoke run: --preset tiny --device cpu)")
    t0 = time.perf_counter()
    data = TokenData.load(args.data)
    device = torch.device(args.device)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "preset": args.preset, "peak_flops": train.peak_flops(device),
           "torch": torch.__version__, "rows": []}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    print(f"{'variant':<16} {'batch':>5} {'tok/s':>10} {'MFU':>6} {'1st step s':>10} {'peak GB':>8}", flush=True)
    for name in args.variants:
        if time.perf_counter() - t0 > args.max_seconds:
            out["rows"].append({"variant": name, "skipped": "time"})
            continue
        try:
            row = run_variant(name, data, args.steps, args.preset, args.device)
        except torch.cuda.OutOfMemoryError as err:
            row = {"variant": name, "error": f"out of memory: {str(err)[:200]}"}
            torch.cuda.empty_cache()
        except Exception as err:  # one broken variant must not cost the others
            row = {"variant": name, "error": f"{type(err).__name__}: {str(err)[:300]}"}
        out["rows"].append(row)
        if "error" in row:
            print(f"{name:<16} {row['error']}", flush=True)
        else:
            mfu, peak_gb = row["steady_mfu"], row["peak_memory_gb"] or "-"
            print(f"{name:<16} {row['batch_size']:>5} {row['steady_tokens_per_s'] or 0:>10.0f} "
                  f"{'-' if mfu is None else f'{mfu:.1%}':>6} {row['first_step_s']:>10.1f} {peak_gb:>8}",
                  flush=True)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
