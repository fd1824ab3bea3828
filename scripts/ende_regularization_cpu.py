"""Small CPU runs that chose the `gpu-ende` regularization (dropout, weight decay) on the EnDe corpus.

    python scripts/ende_regularization_cpu.py --data data/ende [--pairs 30000 --epochs 3 --dim 128]

A small T5 (the `gpu-ende` shape scaled down) trains on a random subset of the training pairs for the number of
epochs the GPU budget gives the real target on the whole corpus, once per variant with the same data, seed
and steps; it prints the in-domain and out-of-domain held-out losses of each (lower is better) as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
import torch

from specdec.zoo.data import PairData
from specdec.zoo.presets import ModelShape, TrainConfig
from specdec.zoo.train import build_model, evaluate, run_training


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/ende")
    ap.add_argument("--pairs", type=int, default=30_000, help="training pairs (a seeded random subset)")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variants", default="d0:0.0:0.1,d1:0.1:0.1,d1wd0:0.1:0.0",
                    help="name:dropout:weight_decay,...")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = PairData.load(args.data)
    rng = np.random.default_rng(0)
    data.train = [data.train[i] for i in rng.permutation(len(data.train))[: args.pairs]]
    steps = int(args.epochs * len(data.train) / args.batch)
    ood_rows = data.ood[: 8 * args.batch]
    ood = [PairData.collate(ood_rows[i : i + args.batch]) for i in range(0, len(ood_rows), args.batch)]
    base = TrainConfig(steps=steps, batch_size=args.batch, seq_len=96, lr=2e-3, warmup_steps=min(100, steps // 10),
                       eval_every=max(1, steps // 4), eval_batches=8, seed=0)
    for spec in args.variants.split(","):
        name, dropout, wd = spec.split(":")
        shape = ModelShape("t5", dim=args.dim, layers=args.layers, heads=max(1, args.dim // 64), ff=3 * args.dim,
                           max_len=128, dropout=float(dropout))
        model = build_model(shape, data.meta["vocab_size"], seed=0)
        t0 = time.perf_counter()
        data._pending.clear()
        result = run_training(model, data, replace(base, weight_decay=float(wd)), device="cpu", progress=False)
        print(json.dumps({"variant": name, "dropout": float(dropout), "weight_decay": float(wd), "steps": steps,
                          "pairs": len(data.train), "epochs": args.epochs,
                          "final_train_loss": round(result.final_loss, 3),
                          "val_curve": [(s, round(v, 3)) for s, v in result.val_curve],
                          "ood_loss": round(evaluate(model, ood, torch.device("cpu")), 3),
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
