"""A code data folder in the shipped demo pair's tokenizer (this interpreter's stdlib .py files), for training and
measuring feature heads on the demo target on a CPU (the repo's data/code uses another tokenizer).

    python scripts/feature_head_demo_data.py OUT_DIR [--train-tokens 3000000]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

DEMO = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair" / "target"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/feature_head_demo_data.py")
    parser.add_argument("out")
    parser.add_argument("--train-tokens", type=int, default=3_000_000)
    args = parser.parse_args(argv)
    tokenizer = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    random.Random(0).shuffle(files)

    def stream(paths, cap):
        parts, total = [], 0
        for path in paths:
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError):
                continue
            ids = tokenizer.encode(text).ids + [2]  # </s> after each file, as the zoo's corpora
            parts.append(np.asarray(ids, dtype=np.uint16))
            total += len(ids)
            if total >= cap:
                break
        return np.concatenate(parts)

    val, train = stream(files[:60], 200_000), stream(files[60:], args.train_tokens)
    out = Path(args.out)
    (out / "tokenizer").mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, out / "tokenizer" / name)
    for name, tokens in (("train", train), ("val", val)):
        with gzip.open(out / f"{name}.bin.gz", "wb") as fh:
            fh.write(tokens.tobytes())
    meta = {"format_version": 1, "corpus": "code", "vocab_size": tokenizer.get_vocab_size(),
            "train_tokens": len(train), "val_tokens": len(val), "note": "stdlib .py files, demo pair tokenizer"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
