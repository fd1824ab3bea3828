"""Where an EnDe (T5) training step's time goes on the GPU, and what batch size / compilation buys.

    python scripts/ende_train_profile.py --data data/ende [--out DIR] [--variants NAME,...]

Each variant builds a fresh model (the `gpu-ende` target shape, or a draft shape), runs `--warmup` steps then
`--steps` timed steps of the zoo's training step (bf16 autocast, `lm_loss` with z-loss, clip, fused AdamW
stepped on the device), on the zoo's bucketed batches, and reports ms/step, pairs/s, target tokens/s and the
host time spent building batches. `--profile` adds a torch.profiler table (top CUDA kernels, CPU total) for
the first variant. It writes DIR/ende_train_profile.json. A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.zoo.data import PairData  # noqa: E402
from specdec.zoo.presets import PRESETS, ModelShape  # noqa: E402
from specdec.zoo.speed import skip_non_finite_step  # noqa: E402
from specdec.zoo.train import build_model, count_params, forward_logits, lm_loss, make_optimizer  # noqa: E402
from specdec.zoo.presets import TrainConfig  # noqa: E402

SHAPES = {
    "target": PRESETS["gpu-ende"].target,
    "small": ModelShape("t5", dim=128, layers=1, heads=2, ff=384, max_len=128),
    "base": ModelShape("t5", dim=256, layers=2, heads=4, ff=768, max_len=128),
}


def parse_variant(name: str) -> dict:
    """`target-b2048-compile`, `small-t64-nocudnn`: shape, batch size (b: pairs, t: K padded tokens), flags
    (compile: torch.compile with dynamic shapes, nodrop: dropout 0, nocudnn: no cuDNN attention)."""
    parts = name.split("-")
    out = {"name": name, "shape": parts[0], "batch": 512, "tokens": None, "compile": False, "dropout": None,
           "cudnn": True}
    for p in parts[1:]:
        if p.startswith("b"):
            out["batch"] = int(p[1:])
        elif p.startswith("t"):
            out["tokens"] = int(p[1:]) * 1024
        elif p == "nocudnn":
            out["cudnn"] = False
        elif p == "compile":
            out["compile"] = True
        elif p == "nodrop":
            out["dropout"] = 0.0
        else:
            raise ValueError(f"variant {name!r}: unknown part {p!r}")
    return out


def run_variant(v: dict, data: PairData, vocab: int, device: torch.device, warmup: int, steps: int,
                profile: bool) -> dict:
    from dataclasses import replace

    shape = SHAPES[v["shape"]]
    if v["dropout"] is not None:
        shape = replace(shape, dropout=v["dropout"])
    model = build_model(shape, vocab).to(device).train()
    cfg = TrainConfig(steps=steps, batch_size=v["batch"], seq_len=96, lr=1e-3)
    opt = make_optimizer(model, cfg, device, fused=True)
    step_model = torch.compile(model, dynamic=True) if v["compile"] else model
    torch.backends.cuda.enable_cudnn_sdp(v["cudnn"])
    params = [p for p in model.parameters() if p.requires_grad]
    rng = np.random.default_rng(0)
    host = 0.0
    pairs = tgt_tokens = padded = 0

    def one_step():
        nonlocal host, pairs, tgt_tokens, padded
        t = time.perf_counter()
        if v["tokens"]:
            cpu = data.token_batch(v["tokens"], rng)
        else:
            cpu = data.train_batch(v["batch"], 96, rng)
        batch = cpu.to(device)
        host += time.perf_counter() - t
        pairs += cpu.labels.shape[0]
        tgt_tokens += int((cpu.labels != -100).sum())
        padded += cpu.labels.numel() + cpu.input_ids.numel()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits, targets = forward_logits(step_model, batch)
            loss, _ = lm_loss(logits, targets, 1e-4)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        skip_non_finite_step(opt, loss.detach(), norm)
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    one_step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        one_step()
    sync()
    host = 0.0
    pairs = tgt_tokens = padded = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = one_step()
    sync()
    dt = time.perf_counter() - t0
    row = {**v, "params": count_params(model), "first_step_s": round(first, 2), "ms_per_step": 1e3 * dt / steps,
           "host_batch_ms_per_step": 1e3 * host / steps, "pairs_per_s": pairs / dt,
           "target_tokens_per_s": tgt_tokens / dt, "padded_tokens_per_step": padded / steps,
           "last_loss": float(loss)}
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof

        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                one_step()
            sync()
        row["profile_cuda"] = p.key_averages().table(sort_by="cuda_time_total", row_limit=18)
        row["profile_cpu"] = p.key_averages().table(sort_by="cpu_time_total", row_limit=12)
    model = opt = step_model = None  # noqa: F841 (freed before the next variant)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/ende")
    ap.add_argument("--out", default="/tmp/ende_profile")
    ap.add_argument("--variants", default="target-b512,target-b2048,small-b256,small-b2048,base-b2048")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    data = PairData.load(args.data)
    vocab = int(data.meta["vocab_size"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, name in enumerate(args.variants.split(",")):
        row = run_variant(parse_variant(name), data, vocab, device, args.warmup, args.steps, args.profile and i == 0)
        rows.append(row)
        print(json.dumps({k: (round(x, 2) if isinstance(x, float) else x) for k, x in row.items()
                          if not k.startswith("profile")}), flush=True)
        for k in ("profile_cuda", "profile_cpu"):
            if k in row:
                print(row[k], flush=True)
        (out / "ende_train_profile.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
