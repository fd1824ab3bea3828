"""`specdec demo image`: speculative decoding beyond text, on the shipped 8×8 digit-image pair (CPU).

The pair (specdec/assets/image_pair, see its MODEL_CARD.md) is a 16-layer Llama over pixel tokens and a
one-layer drafter, trained by `specdec train image` on scikit-learn's digits. For every digit class the
demo samples an image (prompt `<s> <digit d>`, then 64 pixel tokens) with plain and with speculative
decoding, both through `specdec.generate`:

- greedy (temperature 0): plain and speculative tokens must be identical (checked here);
- sampled (temperature 1 by default): the same law with different draws (the law itself is checked by
  chi-square in tests/zoo/test_images.py).

It reports α, τ, tokens/s and the speedup of both, and writes a PNG grid (rows: plain and speculative,
greedy then sampled; one column per class). Batch 1, plain and speculative interleaved class by class
after a warm-up. `--json` prints one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli import CLIError

DEFAULT_GAMMA = 5  # best measured γ on the 2-core CPU (image_pair/MODEL_CARD.md)
DEFAULT_OUT = "specdec_digits.png"
_ASCII = " .:-=+*#%@"  # grey levels, light to dark


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("image", help="the shipped 8×8 digit-image pair: plain vs speculative, PNG grid",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", type=Path, default=None,
                   help="folder with target/ and draft/ (default: the shipped specdec/assets/image_pair)")
    p.add_argument("--num-draft-tokens", type=int, default=DEFAULT_GAMMA, help="γ")
    p.add_argument("--classes", type=int, nargs="+", default=None, help="digit classes to draw (default: all)")
    p.add_argument("--samples", type=int, default=2, help="sampled images per class and per decoder (0 = none)")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's choice)")
    p.add_argument("--repeats", type=int, default=1, help="time everything this many times (more = steadier)")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"PNG grid to write (default: {DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.set_defaults(run=run)


def _check(args: argparse.Namespace, num_classes: int) -> list[int]:
    if args.num_draft_tokens < 1:
        raise CLIError(f"--num-draft-tokens must be at least 1, got {args.num_draft_tokens}")
    if args.samples < 0:
        raise CLIError(f"--samples must be 0 or more, got {args.samples}")
    if not args.temperature > 0:
        raise CLIError(f"--temperature must be > 0 (the greedy rows are always drawn), got {args.temperature}")
    if args.threads < 0:
        raise CLIError(f"--threads must be 0 (torch's choice) or more, got {args.threads}")
    if args.repeats < 1:
        raise CLIError(f"--repeats must be at least 1, got {args.repeats}")
    classes = list(range(num_classes)) if args.classes is None else args.classes
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad or not classes:
        raise CLIError(f"--classes must be digits in [0, {num_classes}), got {args.classes}")
    return classes


def ascii_row(images, width: int = 8) -> str:
    """Images side by side as text, one character per pixel (grey level → ' .:-=+*#%@', '?' = not a pixel)."""
    lines = []
    for y in range(images[0].shape[0]):
        cells = []
        for image in images:
            row = image[y]
            cells.append("".join("?" if v < 0 else _ASCII[min(len(_ASCII) - 1, int(v) * len(_ASCII) // 17)]
                                 for v in row[:width]))
        lines.append("  ".join(cells))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    import specdec
    from specdec.bench.report import compare_runs
    from specdec.cli.image_grid import render_grid, write_png
    from specdec.zoo.images import IMAGE_PAIR, load_image_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    args.pair = args.pair or IMAGE_PAIR
    pair = load_image_pair(args.pair)
    layout = pair.layout
    classes = _check(args, layout.num_classes)
    gamma = args.num_draft_tokens

    def draw(label: int, drafter, temperature: float, seed: int | None):
        return specdec.generate(pair.target, [layout.prompt(label)], drafter=drafter, max_new_tokens=layout.num_pixels,
                                temperature=temperature, num_draft_tokens=gamma, eos_token_id=[], seed=seed)

    greedy, sampled = [], []
    with torch.inference_mode():
        draw(classes[0], None, 0.0, None)  # warm-up: first calls pay allocator and dispatcher set-up
        draw(classes[0], pair.draft, 0.0, None)
        for _ in range(args.repeats):
            for label in classes:
                greedy.append((label, draw(label, None, 0.0, None), draw(label, pair.draft, 0.0, None)))
            for s in range(args.samples):
                for label in classes:
                    seed = args.seed + 1000 * s + label
                    sampled.append((label, draw(label, None, args.temperature, seed),
                                    draw(label, pair.draft, args.temperature, seed)))

    t = f"T={args.temperature:g}"
    first = greedy[: len(classes)]
    rows = [("PLAIN T=0", [layout.decode(b.sequences[0]) for _, b, _ in first]),
            ("SPEC T=0", [layout.decode(f.sequences[0]) for _, _, f in first])]
    for s in range(args.samples):
        chunk = sampled[s * len(classes) : (s + 1) * len(classes)]
        rows += [(f"PLAIN {t}", [layout.decode(b.sequences[0]) for _, b, _ in chunk]),
                 (f"SPEC {t}", [layout.decode(f.sequences[0]) for _, _, f in chunk])]
    png = write_png(args.out, render_grid(rows, layout.levels, column_titles=[str(c) for c in classes]))
    invalid = sum(int((img < 0).sum()) for _, images in rows for img in images)

    summary = {
        "kind": "image",
        "pair": str(args.pair),
        "classes": classes,
        "num_draft_tokens": gamma,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "pixels_per_image": layout.num_pixels,
        **compare_runs([(b, f) for _, b, f in greedy]),
    }
    if sampled:
        stats = compare_runs([(b, f) for _, b, f in sampled])
        stats.pop("identical")  # different draws of one law: not expected to be identical
        summary["sampled"] = {"temperature": args.temperature, "samples_per_class": args.samples, **stats}
    summary["invalid_pixels"] = invalid
    summary["png"] = str(png.resolve())

    if not args.json:
        target_m = sum(p.numel() for p in pair.target.parameters()) / 1e6
        draft_m = sum(p.numel() for p in pair.draft.parameters()) / 1e6
        print(f"image pair: {args.pair}  (target {target_m:.2f}M params, draft {draft_m:.3f}M; batch 1, γ={gamma}, "
              f"{torch.get_num_threads()} CPU threads)\n")
        print("speculative greedy samples, digits " + " ".join(map(str, classes)) + ":\n")
        print(ascii_row(rows[1][1]) + "\n")
        print(f"greedy (T=0): plain and speculative tokens identical: {'yes' if summary['identical'] else 'NO'}")
        print(f"  α = {summary['alpha']:.3f}   τ = {summary['mean_accepted_length']:.2f}   "
              f"plain {summary['plain_tokens_per_second']:.1f} tok/s → speculative "
              f"{summary['speculative_tokens_per_second']:.1f} tok/s: speedup {summary['speedup']:.2f}×")
        if sampled:
            s = summary["sampled"]
            print(f"sampled ({t}, {args.samples} per class): α = {s['alpha']:.3f}   "
                  f"τ = {s['mean_accepted_length']:.2f}"
                  f"   plain {s['plain_tokens_per_second']:.1f} tok/s → speculative "
                  f"{s['speculative_tokens_per_second']:.1f} tok/s: speedup {s['speedup']:.2f}×")
        print(f"PNG grid (rows: plain / speculative, greedy then sampled): {summary['png']}")
    if args.json:
        print(json.dumps(summary))
    return 0
