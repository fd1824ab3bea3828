"""Feature-head training throughput: the loop as it was vs `specdec.zoo.feature_head.train_head` now.

    python scripts/head_train_speed.py --out head_speed.json            # CUDA, zoo `gpu`-shaped target, < 90 s
    python scripts/head_train_speed.py --tiny --out /tmp/head_speed.json  # CPU smoke check (tiny shapes)

The target is a randomly initialized zoo `gpu` target (Llama, vocab 8192, dim 1024, 24 layers, 16 heads; fp32
weights under bf16 autocast, as `specdec train head` loads it), the data random tokens: a corpus stream and a
"generated" pool of 1024 rows × 224 tokens (what `--generate 1024` gives: prompt 32 + 192 new tokens), half
of each batch from the pool, so rows are 224 positions like the pipeline's run. Speed does not depend on
the weights. Variants (same batch size and rows):

    before        the loop as it was: the 24-layer target on every batch, the block-masked unrolled pass
                  (`TrainableHead.unrolled_reference`, every draft step recomputes the earlier ones),
                  `distill.kl_loss` per draft step, host syncs every step
    target-pass   `train_head` without the cache: target on every batch, KV-reusing unroll, fused KL,
                  device-side step skip
    cache         `train_head --feature-cache-tokens` (fill time reported apart; head steps read the cache)
    cache-refresh4  the cache, + one target pass over fresh corpus rows every 4 head steps
    cache-b64     the same at batch 64 (cache-b128: 128)
    cache-d1      the cache at depth 1 (teacher forcing only)
    cache-eager-kl  the cache with the KL by eager autograd (`kl_kernel="reference"`), to see the fused pass's share

Each runs 5 warm-up steps + `--steps` timed steps (synchronized); rows: ms/step, steps/s, head positions/s,
speed-up over `before`, peak device memory. The JSON is rewritten after every variant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.fast.head import HeadConfig  # noqa: E402
from specdec.fast.model import LlamaShape  # noqa: E402
from specdec.zoo.data import TokenData  # noqa: E402
from specdec.zoo.distill import MixedData, kl_loss  # noqa: E402
from specdec.zoo.feature_head import DEFAULT_HEAD, TrainableHead, _target_pass, train_head  # noqa: E402
from specdec.zoo.presets import ModelShape, get_preset  # noqa: E402
from specdec.zoo.train import _autocast, _sync, build_model, make_optimizer  # noqa: E402

VARIANTS = ("before", "target-pass", "cache", "cache-refresh4", "cache-b64", "cache-b128", "cache-d1", "cache-eager-kl")
WARMUP = 5


def before_step_ms(target, data, cfg, device, steps: int) -> float:
    """ms per step of the loop as it was (see the module docstring)."""
    tc = cfg.train
    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=0)
    head.init_from(target)
    head.to(device).train()
    optimizer = make_optimizer(head, tc, device)
    params = [p for p in head.parameters() if p.requires_grad]
    rng, gen = np.random.default_rng(0), torch.Generator(device=device).manual_seed(0)
    embed = target.get_input_embeddings().weight
    t0 = None
    for step in range(WARMUP + steps):
        if step == WARMUP:
            _sync(device)
            t0 = time.perf_counter()
        batch = data.train_batch(tc.batch_size, tc.seq_len, rng).to(device, non_blocking=True)
        with _autocast(device, tc.bf16), torch.no_grad():
            hidden, p_logits = _target_pass(target, batch)
        with _autocast(device, tc.bf16):
            u = torch.rand(hidden.shape, device=device, generator=gen)
            features = hidden + ((2 * u - 1) * cfg.feature_noise).to(hidden.dtype)
            predicted = head.unrolled_reference(features, batch, embed, cfg.depth)
            regression = kl = 0.0
            for s, f in enumerate(predicted, 1):
                q_logits = target.lm_head(f.to(hidden.dtype))
                regression = regression + F.smooth_l1_loss(f.float(), hidden[:, s:].float()) / cfg.depth
                mask = torch.ones(q_logits.shape[:2], dtype=torch.bool, device=device)
                kl = kl + kl_loss(p_logits[:, s:], q_logits, mask) / cfg.depth
            loss = regression + cfg.kl_weight * kl
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        if bool(torch.isfinite(loss) & torch.isfinite(grad_norm)):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        [float(v.detach()) for v in (loss, regression, kl, grad_norm)]  # the CSV row of every step
    _sync(device)
    return 1e3 * (time.perf_counter() - t0) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke check of the script)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 30; tiny 4)")
    ap.add_argument("--batch-size", type=int, default=None, help="default 32 (tiny 4)")
    ap.add_argument("--cache-tokens", type=int, default=None, help="feature cache size (default 500k; tiny 4096)")
    ap.add_argument("--only", nargs="+", choices=VARIANTS, default=None)
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --tiny for the CPU smoke check")
    torch.manual_seed(0)
    if args.tiny:
        torch.set_num_threads(1)
        shape, vocab, pool_rows, pool_width = ModelShape("llama", dim=64, layers=2, heads=4, ff=128), 512, 16, 24
    else:
        shape, vocab, pool_rows, pool_width = get_preset("gpu").target, 8192, 1024, 224
    steps = args.steps or (4 if args.tiny else 30)
    batch_size = args.batch_size or (4 if args.tiny else 32)
    cache_tokens = args.cache_tokens or (4096 if args.tiny else 500_000)
    target = build_model(shape, vocab).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng(0)
    stream = rng.integers(0, vocab, size=200_000 if args.tiny else 4_000_000).astype(np.uint16)
    data = TokenData(train=stream, val=stream[:20_000], tokenizer_dir=Path("."), meta={"vocab_size": vocab})
    pool = torch.from_numpy(rng.integers(0, vocab, size=(pool_rows, pool_width)))
    base = replace(DEFAULT_HEAD, alpha_batches=1, generated_fraction=0.5,
                   train=replace(DEFAULT_HEAD.train, batch_size=batch_size, steps=WARMUP + steps, max_seconds=None,
                                 seq_len=pool_width - 1 if args.tiny else 512))
    configs = {"before": base, "target-pass": base, "cache": replace(base, feature_cache_tokens=cache_tokens),
               "cache-refresh4": replace(base, feature_cache_tokens=cache_tokens, feature_cache_refresh=4),
               "cache-b64": replace(base, feature_cache_tokens=cache_tokens,
                                    train=replace(base.train, batch_size=2 * batch_size)),
               "cache-b128": replace(base, feature_cache_tokens=cache_tokens,
                                     train=replace(base.train, batch_size=4 * batch_size)),
               "cache-d1": replace(base, feature_cache_tokens=cache_tokens, depth=1),
               "cache-eager-kl": replace(base, feature_cache_tokens=cache_tokens, kl_kernel="reference")}
    rows_len = min(base.train.seq_len + 1, pool_width)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": name, "torch": torch.__version__, "target_params": sum(p.numel() for p in target.parameters()),
              "positions_per_row": rows_len, "steps": steps, "cache_tokens": cache_tokens, "variants": {}}
    out = Path(args.out)
    for variant in args.only or VARIANTS:
        cfg = configs[variant]
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        try:
            if variant == "before":
                step_ms, fill_s = before_step_ms(target, MixedData(data, pool, 0.5), cfg, device, steps), 0.0
            else:
                _, result = train_head(target, data, cfg, device=device, pool=pool)
                step_ms, fill_s = result.step_ms, result.cache_seconds
        except torch.OutOfMemoryError as err:
            report["variants"][variant] = {"error": f"out of memory: {str(err)[:200]}"}
            continue
        b = cfg.train.batch_size
        report["variants"][variant] = {
            "batch_size": b, "depth": cfg.depth, "feature_cache_tokens": cfg.feature_cache_tokens,
            "step_ms": round(step_ms, 3), "steps_per_s": round(1e3 / step_ms, 2),
            "positions_per_s": round(b * (rows_len - 1) * 1e3 / step_ms), "cache_fill_s": round(fill_s, 2),
            "wall_s": round(time.perf_counter() - t0, 1),
            "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None}
        out.write_text(json.dumps(report, indent=1))
    ref = report["variants"].get("before", {}).get("positions_per_s")
    print(f"{name}, target {report['target_params'] / 1e6:.1f}M params, {rows_len} positions per row\n")
    print("| variant | batch | depth | ms/step | steps/s | positions/s | vs before | cache fill s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, r in report["variants"].items():
        if "error" in r:
            print(f"| {variant} | {r['error']} |")
            continue
        speedup = f"{r['positions_per_s'] / ref:.2f}x" if ref else "–"
        print(f"| {variant} | {r['batch_size']} | {r['depth']} | {r['step_ms']:.1f} | {r['steps_per_s']:.1f} | "
              f"{r['positions_per_s']:,} | {speedup} | {r['cache_fill_s']:.1f} | {r['peak_gib']} |")
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
